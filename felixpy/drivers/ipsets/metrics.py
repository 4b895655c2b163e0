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

prometheus_client always appends ``_total`` to a Counter's name, which would
rename Felix's counters; they are therefore exposed by a small collector under
their exact names, typed ``untyped`` (the text format cannot declare a
``counter`` whose sample lacks ``_total``).  Everything registers in the default
``REGISTRY`` once per process; re-importing or reloading this module reuses the
registered collectors instead of failing on a duplicate name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from prometheus_client import REGISTRY, Gauge, Summary
from prometheus_client.metrics_core import Metric

T = TypeVar("T")


def _get_or_register(name: str, make: Callable[[], T]) -> T:
    """Return the collector already registered under *name*, else make (and register) it."""
    existing: Any = getattr(REGISTRY, "_names_to_collectors", {}).get(name)
    if existing is not None:
        # Unchecked on purpose: what is registered under *name* was built by ``make`` in an earlier
        # import of this module, and after importlib.reload ExactNameCounter is a new class object,
        # so isinstance cannot vouch for it (tests/ipsets/test_metrics.py reloads).
        return existing  # type: ignore[no-any-return]
    return make()


class ExactNameCounter:
    """A monotonically increasing value exposed under exactly *name*."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self._value = 0.0
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        with self._lock:
            self._value += amount

    def get(self) -> float:
        with self._lock:
            return self._value

    def collect(self) -> Iterator[Metric]:
        metric = Metric(self.name, self.documentation, "unknown")
        metric.add_sample(self.name, {}, self.get())
        yield metric


def _counter(name: str, documentation: str) -> ExactNameCounter:
    def make() -> ExactNameCounter:
        c = ExactNameCounter(name, documentation)
        REGISTRY.register(c)
        return c

    return _get_or_register(name, make)


ipsets_calico: Gauge = _get_or_register(
    "felix_ipsets_calico", lambda: Gauge("felix_ipsets_calico", "Number of active Calico IP sets.", ["ip_version"]))
ipsets_total: Gauge = _get_or_register(
    "felix_ipsets_total", lambda: Gauge("felix_ipsets_total", "Total number of active IP sets."))
ipset_calls = _counter("felix_ipset_calls", "Number of ipset commands executed.")
ipset_errors = _counter("felix_ipset_errors", "Number of ipset command failures.")
ipset_lines_executed = _counter("felix_ipset_lines_executed", "Number of ipset operations executed.")
exec_time_micros: Summary = _get_or_register(
    "felix_exec_time_micros",
    lambda: Summary("felix_exec_time_micros", "Summary of time taken to fork/exec child processes"))
