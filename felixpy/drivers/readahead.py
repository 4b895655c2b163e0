"""A kernel read started ahead of the apply step that takes it (#17).

A driver that must read the kernel back before its next write (start of day, or after a failure emptied
its view) can start that read when the apply begins (the loop's ``_prefetch``, the protocol
:class:`~felixpy.managers.base.PrefetchesReadBack`): the read's child process then runs beside the
managers' renders and the other drivers' reads instead of after them, and the driver's own step takes the
result.  Used by the ipset driver (``ipset save``), the iptables tables (``*-save``) and the cleanup of
the iptables backend not in use (its first ``*-save``, which nothing the apply writes before it touches);
the nftables
table has its own listings worker (``nftables/listing.py``), which also merges reads with its writes.
The iptables tables also run their rule hashing ahead this way (``HashesAhead``): no kernel read at all,
but the same start / take / drop.

The rules that keep a read ahead as fresh as one taken on the step's own path:

* It reads only, and only the driver's own step takes it: no write of that driver's can come between
  (the driver is not in sync, so its step loads before it writes).
* Each ``start`` (and ``drop``) forgets one nobody took, so a result is never older than the start of
  the apply that takes it — except a big iptables table's or ipset driver's start-of-day read, which may
  start before ``InSync`` (``PrefetchesBeforeInSync``, managers/base.py): nothing of ours writes before
  then, and the driver reads again in the background once the apply that took it is done.  A result
  holding something to let go (the ipset driver's kept output file) is handed to *discard* when
  forgotten, at once or when its read ends.
* A read that failed, or a thread that could not start, is logged and the step reads on its own path,
  exactly as without it.

It owns no kernel object and writes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
U = TypeVar("U")

StartBackground = Callable[[Callable[[], None]], None]


class ReadAhead(Generic[T]):
    """At most one read ahead (see the module docstring); used from one thread (the read runs on its own).
    *what* names the read in the log lines of *log*; *discard* lets go of a result nobody took."""

    def __init__(self, what: str, log: Any, start_background: StartBackground | None = None,
                 thread_name: str = "read-ahead", discard: Callable[[T], None] | None = None) -> None:
        self._what = what
        self._log = log
        self._start = start_background or (
            lambda fn: threading.Thread(target=fn, name=thread_name, daemon=True).start())
        self._discard = discard
        self._fut: Future[T] | None = None
        self._early = False  # the read held was started before InSync (mark_early)

    @property
    def started(self) -> bool:
        return self._fut is not None

    @property
    def early(self) -> bool:
        """Whether the read held (started, not yet taken or dropped) was started before ``InSync``."""
        return self._early

    def mark_early(self) -> None:
        """The read held, if any, was started before ``InSync`` (``PrefetchesBeforeInSync``): its taker
        reads again in the background once its apply is done.  Forgotten with the read."""
        self._early = self._fut is not None

    def drop(self) -> None:
        """Forget the read, running or done: nothing will take it."""
        fut, self._fut = self._fut, None
        self._early = False
        if fut is not None and self._discard is not None:
            discard = self._discard

            def let_go(f: Future[T]) -> None:
                if f.exception() is None:
                    discard(f.result())
            fut.add_done_callback(let_go)  # at once if done

    def start(self, read: Callable[[], T]) -> None:
        """Run *read* on a thread of its own, replacing one nobody took.  A thread that cannot be started
        is logged, and nothing is started."""
        self.drop()
        fut: Future[T] = Future()

        def run() -> None:
            try:
                fut.set_result(read())
            except BaseException as e:  # handed to take(), which logs it
                fut.set_exception(e)
        try:
            self._start(run)
        except Exception as e:  # e.g. no thread to be had
            self._log.warning(f"Could not start {self._what} ahead; doing it on the apply path", error=str(e))
            return
        self._fut = fut

    @overload
    def take(self, on_error: Callable[[], None] | None = None) -> T | None: ...

    @overload
    def take(self, on_error: Callable[[], None] | None, finish: Callable[[T], U]) -> U | None: ...

    def take(self, on_error: Callable[[], None] | None = None,
             finish: Callable[[T], Any] | None = None) -> Any:
        """The read's result, waiting for it, passed through *finish* if given (the part of the read
        that must wait for its taker, e.g. a decode into what the taker holds by then); None if none
        was started or the read or *finish* failed (logged, and *on_error* called): the caller then
        reads on its own path."""
        fut, self._fut = self._fut, None
        self._early = False
        if fut is None:
            return None
        try:
            return fut.result() if finish is None else finish(fut.result())
        except Exception as e:
            self._log.warning(f"{self._what} started ahead failed; doing it again on the apply path", error=str(e))
            if on_error is not None:
                on_error()
            return None
