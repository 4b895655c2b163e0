"""Prometheus metrics of the ipset driver, under Felix's names.

=============================  =======  ==========================================
name                           kind     meaning
=============================  =======  ==========================================
felix_ipsets_calico            gauge    Calico IP sets in the kernel, by ip_version
felix_ipsets_total             gauge    IP sets in the kernel (last family applied,
                                        as Felix's global gauge)
felix_ipset_calls              counter  ``ipset restore`` sessions run
felix_ipset_errors             counter  failed ``ipset restore`` sessions
felix_ipset_lines_executed     counter  lines sent to ``ipset restore``
felix_exec_time_micros         summary  wall time of each ipset command (µs)
=============================  =======  ==========================================

Registered once per process in the default registry (:func:`felixpy.metrics.get_or_create`,
safe against re-import); :func:`felixpy.metrics.exposition` serves the counters under these
exact names, without prometheus-client's ``_total``.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from felixpy.metrics import QuantileSummary, get_or_create

ipsets_calico = get_or_create(Gauge, "felix_ipsets_calico", "Number of active Calico IP sets.", ("ip_version",))
ipsets_total = get_or_create(Gauge, "felix_ipsets_total", "Total number of active IP sets.")
ipset_calls = get_or_create(Counter, "felix_ipset_calls", "Number of ipset commands executed.")
ipset_errors = get_or_create(Counter, "felix_ipset_errors", "Number of ipset command failures.")
ipset_lines_executed = get_or_create(Counter, "felix_ipset_lines_executed", "Number of ipset operations executed.")
exec_time_micros = get_or_create(QuantileSummary, "felix_exec_time_micros",
                                 "Summary of time taken to fork/exec child processes")
