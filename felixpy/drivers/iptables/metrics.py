"""Felix's ``felix_iptables_*`` Prometheus metrics, registered once per registry.

Names are Felix's (reference §7).  prometheus-client exposes a counter named
``felix_iptables_restore_calls`` as ``felix_iptables_restore_calls_total``;
gauges keep their names.  :func:`get_metrics` is idempotent: a second call —
or a re-import of this module, or another table — reuses the collectors already
registered under those names instead of failing with "Duplicated timeseries".
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


@dataclass(frozen=True, slots=True)
class IptablesMetrics:
    restore_calls: Counter
    restore_errors: Counter
    save_calls: Counter
    save_errors: Counter
    chains: Gauge           # labels: ip_version, table
    rules: Gauge            # labels: ip_version, table
    lines_executed: Counter  # labels: ip_version, table


_M = TypeVar("_M", Counter, Gauge)
_lock = threading.Lock()
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, IptablesMetrics] = weakref.WeakKeyDictionary()


def _existing(registry: CollectorRegistry, name: str, cls: type[_M]) -> _M | None:
    """The collector already registered under *name* (prometheus_client offers no public lookup)."""
    found: object = getattr(registry, "_names_to_collectors", {}).get(name)
    if found is not None and not isinstance(found, cls):
        raise TypeError(f"metric {name} already registered as {type(found).__name__}")
    return found


def _counter(registry: CollectorRegistry, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    found = _existing(registry, name, Counter)
    return found if found is not None else Counter(name, doc, labels, registry=registry)


def _gauge(registry: CollectorRegistry, name: str, doc: str, labels: tuple[str, ...]) -> Gauge:
    found = _existing(registry, name, Gauge)
    return found if found is not None else Gauge(name, doc, labels, registry=registry)


def get_metrics(registry: CollectorRegistry | None = None) -> IptablesMetrics:
    reg = registry if registry is not None else REGISTRY
    with _lock:
        m = _by_registry.get(reg)
        if m is None:
            lab = ("ip_version", "table")
            m = IptablesMetrics(
                restore_calls=_counter(reg, "felix_iptables_restore_calls", "Number of iptables-restore calls."),
                restore_errors=_counter(reg, "felix_iptables_restore_errors", "Number of iptables-restore errors."),
                save_calls=_counter(reg, "felix_iptables_save_calls", "Number of iptables-save calls."),
                save_errors=_counter(reg, "felix_iptables_save_errors", "Number of iptables-save errors."),
                chains=_gauge(reg, "felix_iptables_chains", "Number of active iptables chains.", lab),
                rules=_gauge(reg, "felix_iptables_rules", "Number of active iptables rules.", lab),
                lines_executed=_counter(reg, "felix_iptables_lines_executed",
                                        "Number of iptables rule updates executed.", lab),
            )
            _by_registry[reg] = m
        return m
