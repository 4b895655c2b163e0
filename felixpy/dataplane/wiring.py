"""Building a dataplane for a config: which managers and drivers, per IP family and mode.

This is the one construction site (Felix's ``NewIntDataplaneDriver``): every
per-family manager and driver is created here, IPv6 ones when ``Ipv6Support``
is on, and registered with the loop in Felix's order.  A cross-cutting
component must be registered with every family's managers here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.dataplane.clock import Clock
from felixpy.dataplane.core import InternalDataplane

log = structlog.get_logger(__name__)


class FeedSummaryManager:
    """Counts what the feed delivered and logs a summary per apply (observability only)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._since_apply: Counter[str] = Counter()

    def on_update(self, msg: Any) -> None:
        name = type(msg).__name__
        self.counts[name] += 1
        self._since_apply[name] += 1

    def complete_deferred_work(self) -> None:
        if self._since_apply:
            log.info("Batch received", **{k: v for k, v in sorted(self._since_apply.items())})
            self._since_apply.clear()


def build_dataplane(config: Config, *, clock: Clock, status_sink: Any = None, on_first_sync: Any = None,
                    metrics: Any = None) -> InternalDataplane:
    dp = InternalDataplane(config, clock, status_sink=status_sink, on_first_sync=on_first_sync, metrics=metrics)
    dp.register_manager(FeedSummaryManager())
    return dp
