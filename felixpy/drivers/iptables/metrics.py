"""Felix's ``felix_iptables_*`` Prometheus metrics, registered once per registry.

Names are Felix's (reference §7); :func:`felixpy.metrics.exposition` serves the
counters under them exactly (no ``_total``).  :func:`get_metrics` is idempotent: a second call —
or a re-import of this module, or another table — reuses the collectors already
registered under those names instead of failing with "Duplicated timeseries".
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from felixpy.metrics import get_or_create


@dataclass(frozen=True, slots=True)
class IptablesMetrics:
    restore_calls: Counter
    restore_errors: Counter
    save_calls: Counter
    save_errors: Counter
    chains: Gauge           # labels: ip_version, table
    rules: Gauge            # labels: ip_version, table
    lines_executed: Counter  # labels: ip_version, table


_lock = threading.Lock()
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, IptablesMetrics] = weakref.WeakKeyDictionary()


def get_metrics(registry: CollectorRegistry | None = None) -> IptablesMetrics:
    reg = registry if registry is not None else REGISTRY
    with _lock:
        m = _by_registry.get(reg)
        if m is None:
            lab = ("ip_version", "table")
            m = IptablesMetrics(
                restore_calls=get_or_create(Counter, "felix_iptables_restore_calls",
                                            "Number of iptables-restore calls.", (), reg),
                restore_errors=get_or_create(Counter, "felix_iptables_restore_errors",
                                             "Number of iptables-restore errors.", (), reg),
                save_calls=get_or_create(Counter, "felix_iptables_save_calls",
                                         "Number of iptables-save calls.", (), reg),
                save_errors=get_or_create(Counter, "felix_iptables_save_errors",
                                          "Number of iptables-save errors.", (), reg),
                chains=get_or_create(Gauge, "felix_iptables_chains", "Number of active iptables chains.", lab, reg),
                rules=get_or_create(Gauge, "felix_iptables_rules", "Number of active iptables rules.", lab, reg),
                lines_executed=get_or_create(Counter, "felix_iptables_lines_executed",
                                             "Number of iptables rule updates executed.", lab, reg),
            )
            _by_registry[reg] = m
        return m
