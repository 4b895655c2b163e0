"""Injectable time, so the loop's decisions are testable without real time.

:class:`Clock` is the protocol every composition root takes; :class:`SystemClock` is the
real one.  The fake lives with the other test support, in :mod:`felixpy.testing.clock`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()
