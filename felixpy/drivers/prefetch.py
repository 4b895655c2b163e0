"""One read of the kernel started ahead of the apply step that needs it.

The loop asks the drivers whose next apply must read the kernel back (start of day, after a failure)
to start that read when the apply begins (:class:`felixpy.managers.base.PrefetchesReadBack`), so that
the read's child process runs while the managers render on the apply thread.  A driver keeps at most
one :class:`EarlyRead` and hands its result to the step that would otherwise have run the read itself;
a read that failed (or raised) is simply run again there, as if nothing had been prefetched.

Reads only: nothing started here writes to the kernel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def _thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="prefetch", daemon=True).start()


class EarlyRead(Generic[T]):
    """*read* running on a thread of its own from construction; :meth:`result` waits for it."""

    def __init__(self, read: Callable[[], T], start: Callable[[Callable[[], None]], None] = _thread) -> None:
        self._read = read
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self.seconds = 0.0
        start(self._run)

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._value = self._read()
        except BaseException as e:  # handed to the caller of result()
            self._error = e
        finally:
            self.seconds = time.perf_counter() - t0
            self._done.set()

    def result(self) -> T:
        """The read's value, once it has finished; re-raises what it raised."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
