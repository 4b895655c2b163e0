"""A stateful fake netlink source and a callback recorder for the monitor tests."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypedDict

from felixpy.ifacemonitor.events import AddrEvent, Event, Link, LinkEvent
from felixpy.ifacemonitor.shim import DumpFailed, EventsLost
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceStateUpdate

Update = IfaceStateUpdate | IfaceAddrsUpdate


class Callbacks(TypedDict):
    on_state: Callable[[IfaceStateUpdate], None]
    on_addrs: Callable[[IfaceAddrsUpdate], None]
    on_in_sync: Callable[[], None]
    on_fatal: Callable[[BaseException], None]


class FakeSource:
    """A fake kernel: links and addresses, plus the event stream their changes produce.

    Changing state through :meth:`set_link` / :meth:`add_addr` / ... also queues
    the matching event (pass ``announce=False`` to change the kernel silently,
    as if the event had been lost).  Failure flags: ``fail_dumps``,
    ``lose_next_read``.
    """

    def __init__(self) -> None:
        self.links: dict[int, Link] = {}
        self.addrs: dict[int, set[str]] = {}
        self.fail_dumps = False
        self.lose_next_read = False
        self.dumps = 0
        self.closed = False
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # kernel changes
    def set_link(self, link: Link, announce: bool = True) -> None:
        self.links[link.index] = link
        self.addrs.setdefault(link.index, set())
        if announce:
            self._emit(LinkEvent(link, True))

    def del_link(self, index: int, announce: bool = True) -> None:
        link = self.links.pop(index)
        self.addrs.pop(index, None)
        if announce:
            self._emit(LinkEvent(Link(index, link.name, False), False))

    def add_addr(self, index: int, addr: str, announce: bool = True) -> None:
        self.addrs[index].add(addr)
        if announce:
            self._emit(AddrEvent(index, addr, True))

    def del_addr(self, index: int, addr: str, announce: bool = True) -> None:
        self.addrs[index].discard(addr)
        if announce:
            self._emit(AddrEvent(index, addr, False))

    def _emit(self, event: Event) -> None:
        with self._lock:
            self._pending.append(event)
        os.write(self._w, b"x")

    # NetlinkSource
    def fileno(self) -> int:
        return self._r

    def read_events(self) -> list[Event]:
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            events, self._pending = self._pending, []
        if self.lose_next_read:
            self.lose_next_read = False
            raise EventsLost("fake ENOBUFS")
        return events

    def list_links(self) -> list[Link]:
        if self.fail_dumps:
            raise DumpFailed("fake dump failure")
        self.dumps += 1
        return list(self.links.values())

    def list_addrs(self, index: int | None = None) -> dict[int, frozenset[str]]:
        if self.fail_dumps:
            raise DumpFailed("fake dump failure")
        return {i: frozenset(a) for i, a in self.addrs.items() if a and (index is None or i == index)}

    def close(self) -> None:
        self.closed = True
        os.close(self._r)
        os.close(self._w)


class Recorder:
    """The monitor's callbacks; records everything, thread-safely."""

    def __init__(self) -> None:
        self.updates: list[Update] = []
        self.in_sync = 0
        self.updates_at_sync = -1
        self.fatal: list[BaseException] = []
        self._cond = threading.Condition()

    def callbacks(self) -> Callbacks:
        return {"on_state": self._add, "on_addrs": self._add, "on_in_sync": self._sync,
                "on_fatal": self._fatal}

    def _add(self, update: Update) -> None:
        with self._cond:
            self.updates.append(update)
            self._cond.notify_all()

    def _sync(self) -> None:
        with self._cond:
            self.in_sync += 1
            self.updates_at_sync = len(self.updates)
            self._cond.notify_all()

    def _fatal(self, exc: BaseException) -> None:
        with self._cond:
            self.fatal.append(exc)
            self._cond.notify_all()

    def wait(self, pred: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Wait until ``pred()``; re-checked on every callback and every 10 ms."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.01))
            return True

    def wait_for_update(self, update: Update, timeout: float = 5.0) -> None:
        assert self.wait(lambda: update in self.updates, timeout), (
            f"no {update} within {timeout}s; got {self.updates}")

    def take(self) -> list[Update]:
        with self._cond:
            out, self.updates = self.updates, []
            return out

    def for_iface(self, name: str) -> list[Update]:
        with self._cond:
            return [u for u in self.updates if u.name == name]

    def quiet_for(self, seconds: float) -> list[Update]:
        """Wait ``seconds`` and return (and clear) what arrived meanwhile."""
        time.sleep(seconds)
        return self.take()
