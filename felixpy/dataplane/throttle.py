"""Felix's apply throttle: a leaky bucket of capacity 10, one token per 100 ms, full at start.

Under a flood of updates this bounds applies to 10 in the first second and ~10/s
after, so messages coalesce into bigger batches (cheaper per message).
"""

from __future__ import annotations

import random


class LeakyBucket:
    def __init__(self, now: float, capacity: int = 10, refill_interval: float = 0.1,
                 jitter: float = 0.01, rng: random.Random | None = None) -> None:
        self.capacity = capacity
        self.refill_interval = refill_interval
        self._jitter = jitter
        self._rng = rng or random.Random()
        self._tokens = capacity
        self._next_refill = now + self._interval()

    def _interval(self) -> float:
        return self.refill_interval + (self._rng.uniform(0, self._jitter) if self._jitter else 0.0)

    def _refill(self, now: float) -> None:
        while self._tokens < self.capacity and now >= self._next_refill:
            self._tokens += 1
            self._next_refill += self._interval()
        if self._tokens >= self.capacity and now >= self._next_refill:
            # A full bucket doesn't bank time.
            self._next_refill = now + self._interval()

    def try_take(self, now: float) -> bool:
        self._refill(now)
        if self._tokens <= 0:
            return False
        if self._tokens == self.capacity:
            self._next_refill = now + self._interval()
        self._tokens -= 1
        return True

    def next_token_at(self, now: float) -> float:
        self._refill(now)
        return now if self._tokens > 0 else self._next_refill
