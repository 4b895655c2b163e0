"""The dataplane core: message fan-out, gating, throttling and the ordered apply()."""
