"""Drivers: declarative desired-state caches that reconcile the kernel in apply()."""
