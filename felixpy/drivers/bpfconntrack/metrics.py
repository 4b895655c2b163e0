"""Felix's BPF conntrack scanner metrics (``felix/bpf/conntrack/scanner.go``, ``cleanup.go``),
registered once per process; both families' scanners share them, as in Felix."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from felixpy.metrics import get_or_create

sweeps = get_or_create(Counter, "felix_bpf_conntrack_sweeps", "Number of contrack table sweeps made so far")
used = get_or_create(Gauge, "felix_bpf_conntrack_used",
                     "Number of used entries visited during a conntrack table sweep")
cleaned = get_or_create(Gauge, "felix_bpf_conntrack_cleaned", "Number of entries cleaned during a conntrack table sweep")
# A gauge in Felix too (it only ever goes up).
cleaned_total = get_or_create(Gauge, "felix_bpf_conntrack_cleaned_total",
                              "Total number of entries cleaned during conntrack table sweeps, "
                              "incremented for each clean individualy")
sweep_duration = get_or_create(Gauge, "felix_bpf_conntrack_sweep_duration", "Conntrack sweep execution time (ns)")
expired = get_or_create(Gauge, "felix_bpf_conntrack_expired",
                        "Number of entries cleaned during a conntrack table sweep due to expiration")
