"""Functional tests: the real daemon in a node namespace, real packets between workload namespaces."""
