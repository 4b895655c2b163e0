"""Refresh timers with jitter (interval + up to 10 %), as Felix's refresh tickers.

A popped timer only *queues* a resync on its drivers; the work happens in apply().
"""

from __future__ import annotations

import random


class RefreshTimer:
    def __init__(self, name: str, interval: float, now: float, rng: random.Random | None = None) -> None:
        self.name = name
        self.interval = interval
        self._rng = rng or random.Random()
        self.due: float | None = self._next(now)

    def _next(self, now: float) -> float | None:
        if self.interval <= 0:
            return None  # disabled (interval 0), as in Felix
        return now + self.interval * (1 + self._rng.uniform(0, 0.1))

    def pop(self, now: float) -> bool:
        """True (and re-armed) if the timer has fired by *now*."""
        if self.due is None or now < self.due:
            return False
        self.due = self._next(now)
        return True
