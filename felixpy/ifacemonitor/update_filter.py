"""Flap damping between the netlink events and the tracker (Felix's ``update_filter.go``).

Some DHCP clients remove an address and add it straight back while renewing
a lease; reporting that would make the managers tear down and rebuild state
for nothing.  So, per interface index, as Felix does:

* an address **deletion** waits :data:`FLAP_DAMPING_DELAY` (100 ms) before it
  is passed on;
* a link event saying the interface is down or gone waits the same delay
  (a flap can be a link-down plus an address removal, and the two must keep
  their order);
* an address **add**, or a link-up, passes straight through when nothing is
  waiting for that interface; otherwise it queues behind what is waiting,
  ready at once — events for one interface never overtake each other;
* a new event for an address squashes any queued event for the same address
  on that interface, so "delete x, add x" within the delay leaves only the add
  (which the tracker then finds changes nothing).  An event already past its
  deadline is released first and never squashed (Felix leaves that to which
  channel its ``select`` happens to pick).

Address events for index 0 are dropped.

Pure and clock-injected: :meth:`UpdateFilter.push` takes events,
:meth:`UpdateFilter.ready` hands back those due, in order, and
:meth:`UpdateFilter.next_deadline` says when to call again.  No threads, no
timers, no netlink.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from felixpy.ifacemonitor.events import AddrEvent, Event, LinkEvent

FLAP_DAMPING_DELAY = 0.1


@dataclass(slots=True)
class _Queued:
    ready_at: float
    event: Event


class UpdateFilter:
    def __init__(self, now: Callable[[], float], delay: float = FLAP_DAMPING_DELAY) -> None:
        self._now = now
        self._delay = delay
        self._queues: dict[int, list[_Queued]] = {}
        self._out: list[Event] = []

    def push(self, event: Event) -> None:
        # Release what is already due first: an event past its deadline has been
        # damped long enough and must not be squashed by a later one.
        self._release_due(self._now())
        if isinstance(event, LinkEvent):
            self._push_link(event)
        else:
            self._push_addr(event)

    def _push_link(self, event: LinkEvent) -> None:
        idx = event.index
        up = event.exists and event.link.oper_up
        queue = self._queues.get(idx)
        if up and not queue:
            self._out.append(event)
            return
        delay = 0.0 if up else self._delay
        self._queues.setdefault(idx, []).append(_Queued(self._now() + delay, event))

    def _push_addr(self, event: AddrEvent) -> None:
        idx = event.index
        if idx == 0:
            return
        queue = self._queues.get(idx)
        if event.exists:
            if not queue:
                self._out.append(event)
                return
            ready_at = self._now()
        else:
            ready_at = self._now() + self._delay
        kept = [q for q in queue or () if not (isinstance(q.event, AddrEvent) and q.event.addr == event.addr)]
        kept.append(_Queued(ready_at, event))
        self._queues[idx] = kept

    def ready(self) -> list[Event]:
        """Everything due now, in order (per interface, in arrival order)."""
        self._release_due(self._now())
        out, self._out = self._out, []
        return out

    def _release_due(self, now: float) -> None:
        for idx in list(self._queues):
            queue = self._queues[idx]
            n = 0
            while n < len(queue) and queue[n].ready_at <= now:
                self._out.append(queue[n].event)
                n += 1
            if n == len(queue):
                del self._queues[idx]
            elif n:
                del queue[:n]

    def next_deadline(self) -> float | None:
        """When the earliest queued event becomes due (None: nothing queued).

        Only queue heads matter: an event never leaves before those ahead of it.
        """
        heads = [q[0].ready_at for q in self._queues.values()]
        return min(heads) if heads else None

    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())
