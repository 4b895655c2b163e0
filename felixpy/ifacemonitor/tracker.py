"""What the kernel has, what we have reported, and the difference (Felix's ``storeAndNotifyLink``).

The tracker holds two views:

* the **kernel view**, per interface index: name, oper state and (for tracked
  interfaces) the set of local addresses — fed by link and address events that
  came through the :class:`~felixpy.ifacemonitor.update_filter.UpdateFilter`,
  and replaced wholesale by :meth:`IfaceTracker.resync`;
* the **reported view**, per interface name: the last
  :class:`~felixpy.managers.base.IfaceStateUpdate` and
  :class:`~felixpy.managers.base.IfaceAddrsUpdate` handed to the callbacks.

After every change it recomputes the names involved and reports only what
differs, so duplicates never reach the managers and a periodic resync reports
only real differences.

Reporting rules, as Felix:

* state is UP when the link has IFF_RUNNING, else DOWN; an interface that is
  gone is reported ``DOWN`` with index 0, and (if tracked) addresses ``None``;
* a link that appears is reported with its address set, even an empty one;
* a rename is a deletion of the old name and an addition of the new one;
* interfaces matching ``InterfaceExclude`` get state updates but no address
  tracking at all (not even ``None`` when they go);
* on every link event for a tracked interface the addresses are re-read from
  the kernel (``lookup_addrs``), so the link and address streams cannot race;
* **duplicate names are deferred**: if a new index shows up with a name that
  another index still holds (its deletion may still be damped in the update
  filter), the newcomer is kept but not reported until the old holder goes;
  then the name is reported with the newcomer's state, index and addresses.

Pure: no netlink, no threads, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import structlog

from felixpy.ifacemonitor.events import AddrEvent, Event, Link, LinkEvent
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate

log = structlog.get_logger(__name__)

StateCallback = Callable[[IfaceStateUpdate], None]
AddrsCallback = Callable[[IfaceAddrsUpdate], None]
# Current local addresses of an interface index; None when they could not be read.
AddrLookup = Callable[[int], frozenset[str] | None]


@dataclass(slots=True)
class _Iface:
    index: int
    name: str
    oper_up: bool
    track_addrs: bool
    kind: str | None = None
    addrs: set[str] = field(default_factory=set)


class IfaceTracker:
    def __init__(
        self,
        *,
        is_excluded: Callable[[str], bool],
        lookup_addrs: AddrLookup,
        on_state: StateCallback,
        on_addrs: AddrsCallback,
    ) -> None:
        self._is_excluded = is_excluded
        self._lookup_addrs = lookup_addrs
        self._on_state = on_state
        self._on_addrs = on_addrs
        self._ifaces: dict[int, _Iface] = {}
        self._indexes_by_name: dict[str, list[int]] = {}  # in order of arrival
        self._reported_state: dict[str, tuple[IfaceState, int]] = {}
        self._reported_addrs: dict[str, frozenset[str]] = {}

    # ------------------------------------------------------------------ inputs
    def handle(self, event: Event) -> None:
        if isinstance(event, LinkEvent):
            self.on_link(event.link, event.exists)
        else:
            self.on_addr(event)

    def on_link(self, link: Link, exists: bool) -> None:
        touched = self._store_link(link, exists, self._lookup_addrs)
        self._report(touched)

    def on_addr(self, event: AddrEvent) -> None:
        iface = self._ifaces.get(event.index)
        if iface is None:
            # Picked up with the link's own event, which re-reads its addresses.
            log.debug("address event for unknown interface", ifindex=event.index, addr=event.addr)
            return
        if not iface.track_addrs:
            return
        if event.exists:
            if event.addr in iface.addrs:
                return
            iface.addrs.add(event.addr)
        else:
            if event.addr not in iface.addrs:
                return
            iface.addrs.discard(event.addr)
        self._report([iface.name])

    def resync(self, links: Iterable[Link], addrs_by_index: Mapping[int, frozenset[str]]) -> None:
        """Replace the kernel view with a full dump; report what differs."""

        def lookup(index: int) -> frozenset[str]:
            return addrs_by_index.get(index, frozenset())

        seen: set[int] = set()
        touched: list[str] = []
        for link in links:
            seen.add(link.index)
            touched.extend(self._store_link(link, True, lookup))
        for index in [i for i in self._ifaces if i not in seen]:
            iface = self._ifaces[index]
            log.info("interface gone (spotted on resync)", iface=iface.name, ifindex=index)
            touched.extend(self._store_link(Link(index, iface.name, False), False, lookup))
        self._report(touched)

    # ----------------------------------------------------------------- queries
    def reported_names(self) -> list[str]:
        return list(self._reported_state)

    # ---------------------------------------------------------------- internals
    def _store_link(self, link: Link, exists: bool, lookup: AddrLookup) -> list[str]:
        """Update the kernel view; return the names whose report may change."""
        touched: list[str] = []
        old = self._ifaces.get(link.index)
        if old is not None and (old.name != link.name or not exists):
            if old.name != link.name:
                log.info("interface renamed: simulating deletion of the old name",
                         old_name=old.name, iface=link.name, ifindex=link.index)
            self._forget(old)
            touched.append(old.name)
            old = None
        if exists:
            iface = old
            if iface is None:
                iface = _Iface(link.index, link.name, link.oper_up, not self._is_excluded(link.name))
                self._ifaces[link.index] = iface
                holders = self._indexes_by_name.setdefault(link.name, [])
                holders.append(link.index)
                if len(holders) > 1:
                    log.info("duplicate interface name: newer index deferred until the older goes",
                             iface=link.name, ifindex=link.index, holder_ifindex=holders[0])
            iface.oper_up = link.oper_up
            if link.kind is not None:
                iface.kind = link.kind
            if iface.track_addrs:
                addrs = lookup(link.index)
                if addrs is None:
                    log.warning("could not read interface addresses; keeping the last known",
                                iface=link.name, ifindex=link.index)
                else:
                    iface.addrs = set(addrs)
            touched.append(link.name)
        return touched

    def _forget(self, iface: _Iface) -> None:
        del self._ifaces[iface.index]
        holders = self._indexes_by_name[iface.name]
        holders.remove(iface.index)
        if not holders:
            del self._indexes_by_name[iface.name]

    def _holder(self, name: str) -> _Iface | None:
        """The interface the name is reported for: the earliest arrival still present."""
        holders = self._indexes_by_name.get(name)
        if not holders:
            return None
        return self._ifaces[holders[0]]

    def _report(self, names: Iterable[str]) -> None:
        # Names that vanished first, so that a rename reads "old gone, new here".
        unique = list(dict.fromkeys(names))
        gone = [n for n in unique if self._holder(n) is None]
        present = [n for n in unique if n not in gone]
        for name in gone + present:
            self._report_one(name)

    def _report_one(self, name: str) -> None:
        iface = self._holder(name)
        if iface is None:
            if name in self._reported_state:
                del self._reported_state[name]
                self._on_state(IfaceStateUpdate(name, IfaceState.DOWN, 0))
            if name in self._reported_addrs:
                del self._reported_addrs[name]
                self._on_addrs(IfaceAddrsUpdate(name, None))
            return
        state = (IfaceState.UP if iface.oper_up else IfaceState.DOWN, iface.index)
        if self._reported_state.get(name) != state:
            self._reported_state[name] = state
            self._on_state(IfaceStateUpdate(name, state[0], state[1], iface.kind))
        if iface.track_addrs:  # exclusion is by name, so all holders of a name agree
            addrs = frozenset(iface.addrs)
            if self._reported_addrs.get(name) != addrs:
                self._reported_addrs[name] = addrs
                self._on_addrs(IfaceAddrsUpdate(name, addrs))
