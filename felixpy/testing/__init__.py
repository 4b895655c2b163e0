"""Helpers shared by tests/, fv/ and bench/ (network namespaces, probes)."""
