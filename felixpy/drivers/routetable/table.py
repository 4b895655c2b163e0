"""The route table driver: Calico's routes in one (kernel table, IP family).

What it owns
    The routes its :class:`~.ownership.OwnershipPolicy` calls ours: in the main
    table, routes with Calico's exclusive protocol, routes via workload
    interfaces (``cali*``) and via the VXLAN devices; in a Calico-only table
    (WireGuard), every route via its interfaces.  Also the static ARP entries
    for IPv4 workload routes that carry a MAC (written, never swept: they go
    with the interface; a full resync skips those the kernel already has).

How it recognises them after a restart
    It has no memory.  The first ``apply()`` (and every :meth:`queue_resync`,
    e.g. the loop's ``RouteRefreshInterval`` timer) lists all links and dumps
    the whole table; each route is classified by the policy (table, protocol,
    interface name), and ours-but-unwanted routes are deleted.  Unknown routes
    on a newly seen *workload* interface are spared for a grace period (10 s)
    because the CNI plugin adds the workload route before the datastore tells
    us about the endpoint.

Apply contract
    ``set_routes(route_class, iface, targets)`` replaces the desired set for
    one (class, interface) pair (``iface`` None: routes with no interface);
    ``route_update``/``route_remove`` are deltas on the same pair;
    ``on_iface_state`` feeds interface changes.  These only record.  For each
    CIDR the winning target is the lowest :class:`RouteClass`, then the higher
    ifindex; routes via down or unknown interfaces are not programmed.
    ``apply()`` does a full resync when one is queued (always the first time),
    else rescans only flapped interfaces; deletes unwanted routes, then writes
    the rest in one batch (``ip -batch``) — one failed route stays pending and does
    not stop the others; failures are retried once inline with a fresh handle
    and then raised as :class:`~felixpy.errors.DataplaneError` (work kept for
    the next apply).  A /32 or /128 that moves between interfaces is deleted
    first, its conntrack entries flushed on a worker thread, and only that
    route's add waits for the flush.  ``next_deadline()`` says when a grace
    period will expire (the loop should apply again then).  Not thread-safe:
    one apply at a time.
"""

from __future__ import annotations

import errno as _errno
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from felixpy.deltatracker import DeltaTracker
from felixpy.drivers.netlink.api import Netlink, NetlinkFactory
from felixpy.drivers.netlink.handle import CachedHandle
from felixpy.drivers.netlink.errors import NetlinkCallError
from felixpy.drivers.netlink.types import (
    AF_INET,
    AF_INET6,
    NUD_PERMANENT,
    RT_SCOPE_UNIVERSE,
    SPECIAL_ROUTE_TYPES,
    Neigh,
    Route,
    family_of,
)
from felixpy.drivers.drift import DriftTally
from felixpy.drivers.routetable import metrics
from felixpy.drivers.routetable.conntrack import ConntrackCleanupTracker, NoConntrackCleanup
from felixpy.drivers.routetable.defs import ROUTE_SHAPE, Target, canonical_cidr
from felixpy.drivers.routetable.ownership import OwnershipPolicy
from felixpy.errors import DataplaneError, FelixpyError
from felixpy.ifacemonitor.events import IfaceState
from felixpy.drivers.routetable.routeclass import RouteClass

log = structlog.get_logger(__name__)

GRACE_PERIOD = 10.0
IPV6_LINK_LOCAL = "fe80::/64"
_GONE_ERRNOS = frozenset({_errno.ENODEV, _errno.ENOENT, _errno.ENXIO})
_ABSENT_ERRNOS = frozenset({_errno.ESRCH, _errno.ENOENT})

Key = tuple[str, int, int]  # (cidr, tos, priority): the kernel's FIB key


@dataclass(slots=True)
class _Grace:
    first_seen: float
    expired: bool = False


class RouteTable:
    def __init__(
        self,
        *,
        ip_version: int,
        new_handle: NetlinkFactory,
        ownership: OwnershipPolicy,
        table_index: int = 254,
        default_protocol: int = 3,
        device_route_source_address: str | None = None,
        default_priority: int = 0,
        static_arp: bool = False,
        conntrack: ConntrackCleanupTracker | NoConntrackCleanup | None = None,
        clock: Callable[[], float] = time.monotonic,
        grace_period: float = GRACE_PERIOD,
    ) -> None:
        if static_arp and ip_version != 4:
            raise ValueError("static ARP entries are IPv4 only")
        self.ip_version = ip_version
        self.family = family_of(ip_version)
        self.table_index = table_index or 254
        self._nl = CachedHandle(new_handle)
        self.ownership = ownership
        self.default_protocol = default_protocol
        self.device_route_source_address = device_route_source_address
        self.default_priority = default_priority
        self.static_arp = static_arp
        self.conntrack = conntrack if conntrack is not None else NoConntrackCleanup()
        self.clock = clock
        self.grace_period = grace_period
        self.log = log.bind(table=self.table_index, ip_version=ip_version)
        label = metrics.table_label(ip_version, self.table_index)
        self._g_routes = metrics.num_routes.labels(label)
        self._g_ifaces = metrics.num_ifaces.labels(label)

        self._full_resync = True
        self._resynced_before = False  # a full resync with a belief to compare: drift is countable
        self._drift = DriftTally(self.log)
        self._ifaces_to_rescan: set[str] = set()
        self._claim_checked: set[tuple[str | None, int]] = set()   # (iface, protocol) seen by _check_claimed
        # Inputs: class -> iface -> cidr -> target, and the reverse index.
        self._iface_to_routes: dict[RouteClass, dict[str | None, dict[str, Target]]] = defaultdict(dict)
        self._cidr_to_ifaces: dict[RouteClass, dict[str, set[str | None]]] = defaultdict(dict)
        self._desired_key: dict[str, Key] = {}
        self.kernel: DeltaTracker[Key, Route] = DeltaTracker()
        self._pending_arps: dict[str, dict[str, str]] = {}

        self._name_to_index: dict[str, int] = {}
        self._index_to_name: dict[int, str] = {}
        self._index_to_state: dict[int, IfaceState] = {}
        self._grace: dict[int, _Grace] = {}
        self._last_grace_cleanup = -1e18
        self.last_errors: dict[str, str] = {}

    # ------------------------------------------------------------------ inputs
    @property
    def index(self) -> int:
        return self.table_index

    def on_iface_state(self, name: str, state: IfaceState, index: int) -> None:
        """Interface monitor hook (gone = DOWN with index 0)."""
        if not self.ownership.iface_is_ours(name):
            return
        if state is IfaceState.DOWN and index == 0:
            old = self._name_to_index.pop(name, None)
            if old is not None:
                self._index_to_name.pop(old, None)
                self._index_to_state.pop(old, None)
            self._ifaces_to_rescan.discard(name)
        else:
            self._on_iface_seen(index)
            self._index_to_state[index] = state
            old = self._name_to_index.get(name)
            if old is not None and old != index:
                self._index_to_name.pop(old, None)
                self._index_to_state.pop(old, None)
            self._name_to_index[name] = index
            self._index_to_name[index] = name
        if state is IfaceState.UP:
            # Routes often vanish when an interface goes down: re-read this one.
            self._ifaces_to_rescan.add(name)
        self._recheck_iface(name)

    def queue_resync(self) -> None:
        self._full_resync = True

    def queue_resync_iface(self, name: str) -> None:
        self._ifaces_to_rescan.add(name)

    def set_routes(self, route_class: RouteClass, iface: str | None, targets: Iterable[Target]) -> None:
        """Replace every desired route of ``route_class`` via ``iface``."""
        if not self.ownership.iface_is_ours(iface):
            self.log.error("set_routes for an interface this table does not manage", iface=iface)
            return
        by_iface = self._iface_to_routes[route_class]
        old = by_iface.get(iface, {})
        new: dict[str, Target] = {}
        for t in targets:
            self._check_target(iface, t)
            new[t.cidr] = t
        if new:
            by_iface[iface] = new
        else:
            by_iface.pop(iface, None)
        for cidr in old.keys() - new.keys():
            self._remove_owning_iface(route_class, iface, cidr)
        if iface is not None:
            self._pending_arps.pop(iface, None)
        for cidr, t in new.items():
            if old.get(cidr) != t:
                self._add_owning_iface(route_class, iface, cidr)
            self._update_pending_arp(iface, cidr, t.dest_mac)

    def route_update(self, route_class: RouteClass, iface: str | None, target: Target) -> None:
        if not self.ownership.iface_is_ours(iface):
            return
        self._check_target(iface, target)
        self._iface_to_routes[route_class].setdefault(iface, {})[target.cidr] = target
        self._add_owning_iface(route_class, iface, target.cidr)
        self._update_pending_arp(iface, target.cidr, target.dest_mac)

    def route_remove(self, route_class: RouteClass, iface: str | None, cidr: str) -> None:
        if not self.ownership.iface_is_ours(iface):
            return
        cidr = canonical_cidr(cidr)
        routes = self._iface_to_routes[route_class].get(iface)
        if routes is not None:
            routes.pop(cidr, None)
            if not routes:
                del self._iface_to_routes[route_class][iface]
        self._remove_owning_iface(route_class, iface, cidr)
        self._update_pending_arp(iface, cidr, None)

    def desired_targets(self, route_class: RouteClass, iface: str | None) -> dict[str, Target]:
        return dict(self._iface_to_routes.get(route_class, {}).get(iface, {}))

    def _check_target(self, iface: str | None, t: Target) -> None:
        if t.type.needs_no_interface and iface is not None:
            raise ValueError(f"{t.type.name} route {t.cidr} must have no interface")
        if (6 if ":" in t.cidr else 4) != self.ip_version:
            raise ValueError(f"IPv{self.ip_version} table given {t.cidr}")
        self._check_claimed(iface, t)

    def _check_claimed(self, iface: str | None, t: Target) -> None:
        """Log, once per (interface, protocol), a route the ownership policy would not call ours.

        The route is still programmed (refusing it would drop what a caller asked for), but a fresh
        process cannot recognise it from the kernel alone, so a restart would neither fix nor sweep it:
        a caller's bug (a route via an unclaimed device, or a no-interface route in the main table
        without Calico's exclusive protocol), made visible here.  The policy decides by interface and
        protocol only, hence the cache."""
        protocol = t.protocol or self.default_protocol
        key = (iface, protocol)
        if key in self._claim_checked:
            return
        probe = Route(self.family, t.cidr, table=self.table_index, protocol=protocol)
        self._claim_checked.add(key)
        if not self.ownership.route_is_ours(iface, probe):
            self.log.error("Programming a route this table will not recognise as its own after a restart "
                           "(it would be neither repaired nor removed then)", cidr=t.cidr, iface=iface,
                           protocol=protocol)

    def _update_pending_arp(self, iface: str | None, cidr: str, mac: str | None) -> None:
        if not self.static_arp or iface is None or not self.ownership.iface_should_have_arp(iface):
            return
        addr = cidr.rsplit("/", 1)[0]
        if mac:
            self._pending_arps.setdefault(iface, {})[addr] = mac
        else:
            pending = self._pending_arps.get(iface)
            if pending is not None:
                pending.pop(addr, None)
                if not pending:
                    del self._pending_arps[iface]

    # --------------------------------------------------------- conflict resolution
    def _add_owning_iface(self, route_class: RouteClass, iface: str | None, cidr: str) -> None:
        self._cidr_to_ifaces[route_class].setdefault(cidr, set()).add(iface)
        self._recalculate(cidr)

    def _remove_owning_iface(self, route_class: RouteClass, iface: str | None, cidr: str) -> None:
        ifaces = self._cidr_to_ifaces[route_class].get(cidr)
        if ifaces is None:
            return
        ifaces.discard(iface)
        if not ifaces:
            del self._cidr_to_ifaces[route_class][cidr]
        self._recalculate(cidr)

    def _recheck_iface(self, name: str) -> None:
        seen: set[str] = set()
        for by_iface in self._iface_to_routes.values():
            for cidr in by_iface.get(name, {}):
                if cidr not in seen:
                    seen.add(cidr)
                    self._recalculate(cidr)

    def _ifindex_for(self, iface: str | None) -> int | None:
        if iface is None:
            return 1 if self.ip_version == 6 else 0
        return self._name_to_index.get(iface)

    def _name_for(self, ifindex: int) -> tuple[bool, str | None]:
        if ifindex <= 1:
            return True, None
        name = self._index_to_name.get(ifindex)
        return name is not None, name

    def _recalculate(self, cidr: str) -> None:
        best: tuple[RouteClass, int, Target] | None = None
        for route_class, cidr_to_ifaces in self._cidr_to_ifaces.items():
            ifaces = cidr_to_ifaces.get(cidr)
            if not ifaces:
                continue
            for iface in ifaces:
                ifindex = self._ifindex_for(iface)
                if ifindex is None:
                    continue  # interface not known (yet)
                target = self._iface_to_routes[route_class].get(iface, {}).get(cidr)
                if target is None:
                    continue
                grace = self._grace.get(ifindex)
                if grace is not None:
                    grace.expired = True  # we have routes for it: no need to spare strays
                if iface is not None and self._index_to_state.get(ifindex) is not IfaceState.UP:
                    continue  # skip routes via down interfaces
                if best is None or route_class < best[0] or (route_class == best[0] and ifindex > best[1]):
                    best = (route_class, ifindex, target)
        old_key = self._desired_key.get(cidr)
        if best is None:
            if old_key is not None:
                self.kernel.delete_desired(old_key)
                del self._desired_key[cidr]
            self.conntrack.remove_owner(cidr)
            return
        route_class, ifindex, t = best
        route = self._kernel_route(t, ifindex)
        key = route.key  # one tuple for both maps (the property makes a new one each time)
        if old_key is not None and old_key != key:
            self.kernel.delete_desired(old_key)
        self._desired_key[cidr] = key
        self.kernel.set_desired(key, route)
        self.conntrack.update_owner(cidr, ifindex, route_class)

    def _kernel_route(self, t: Target, ifindex: int) -> Route:
        rtype, scope, onlink = ROUTE_SHAPE[t.type]
        priority = self.default_priority if t.priority is None else t.priority
        if self.ip_version == 6:
            scope = RT_SCOPE_UNIVERSE  # the kernel ignores (and reports 0 for) v6 scopes
            priority = priority or 1024  # ... and stores metric 0 as 1024
        return Route(
            family=self.family, dst=t.cidr, table=self.table_index, tos=0, priority=priority, type=rtype,
            scope=scope, protocol=t.protocol or self.default_protocol, oif=ifindex, gateway=t.gw,
            src=t.src or self.device_route_source_address, onlink=onlink, mtu=t.mtu or None,
        )

    # ------------------------------------------------------------------ apply
    def in_sync(self) -> bool:
        return (not self._full_resync and not self._ifaces_to_rescan and self.kernel.in_sync()
                and not self._pending_arps)

    def next_deadline(self) -> float | None:
        """Seconds until a grace period that is holding back a deletion expires."""
        now = self.clock()
        best: float | None = None
        for key in self.kernel.pending_deletions():
            route = self.kernel.get_dataplane(key)
            if route is None or not self._in_grace(route.oif):
                continue
            left = self._grace[route.oif].first_seen + self.grace_period - now
            best = left if best is None else min(best, left)
        return None if best is None else max(best, 0.0)

    def apply(self) -> None:
        if self.in_sync():
            return
        try:
            self._attempt()
            first_error: FelixpyError | None = None
        except FelixpyError as exc:
            first_error = exc
            self.log.warning("route table apply failed, retrying with a fresh handle", error=str(exc))
        if first_error is not None or self._ifaces_to_rescan:
            self._close_handle()
            self._attempt()  # raises if it fails again: the work stays pending
        if self._ifaces_to_rescan:
            raise DataplaneError(f"interfaces flapped during route update: {sorted(self._ifaces_to_rescan)}")

    def _handle(self) -> Netlink:
        return self._nl.get()

    def _close_handle(self) -> None:
        self._nl.drop()

    def close(self) -> None:
        self._close_handle()
        self.conntrack.close()

    def _attempt(self) -> None:
        nl = self._handle()
        if self._full_resync:
            self._do_full_resync(nl)
        else:
            self._resync_ifaces(nl)
        self._apply_updates(nl)
        self._drift.repaired()
        self._maybe_clean_grace()
        self._g_routes.set(self.kernel.desired_len())
        self._g_ifaces.set(len(self._name_to_index))

    def status_counts(self) -> dict[str, int]:
        """Routes felixpy wants in this table and routes of ours the kernel has."""
        return {"routes": self.kernel.desired_len(), "routes_in_kernel": self.kernel.dataplane_len()}

    # -- reading the kernel back ------------------------------------------------
    def _on_iface_seen(self, ifindex: int) -> None:
        if ifindex > 1 and ifindex not in self._grace:
            self._grace[ifindex] = _Grace(self.clock())

    def _route_is_ours(self, route: Route) -> bool:
        if route.oif <= 1 and route.type in SPECIAL_ROUTE_TYPES:
            iface = None
        elif route.family == AF_INET6 and route.dst == IPV6_LINK_LOCAL:
            return False  # the kernel manages these
        else:
            known, iface = self._name_for(route.oif)
            if not known or iface is None:
                return False  # unknown interface: racing its creation or deletion
        return self.ownership.route_is_ours(iface, route)

    def _refresh_links(self, nl: Netlink) -> dict[int, str]:
        """Read every link; returns their names by index as the listing found them (what the dumps
        after it start from: :meth:`Netlink.route_list`'s *names*)."""
        links = nl.link_list()
        for link in links:
            old = self._name_to_index.get(link.name)
            if old is not None and old != link.index:
                self.on_iface_state(link.name, IfaceState.DOWN, 0)
            old_name = self._index_to_name.get(link.index)
            if old_name is not None and old_name != link.name:
                self.on_iface_state(old_name, IfaceState.DOWN, 0)
        seen = set()
        for link in links:
            seen.add(link.name)
            state = IfaceState.UP if link.oper_up else IfaceState.DOWN
            if (self._name_to_index.get(link.name) != link.index
                    or self._index_to_state.get(link.index) is not state):
                self.on_iface_state(link.name, state, link.index)
        for name in [n for n in self._name_to_index if n not in seen]:
            self.on_iface_state(name, IfaceState.DOWN, 0)
        return {link.index: link.name for link in links}

    def _do_full_resync(self, nl: Netlink) -> None:
        start = time.monotonic()
        names = self._refresh_links(nl)
        owned: dict[Key, Route] = {}
        for route in nl.route_list(self.family, self.table_index, names=names):
            self._on_iface_seen(route.oif)
            if self._route_is_ours(route):
                owned[route.key] = route
        believed = dict(self.kernel.dataplane_items())
        for key, old in believed.items():
            if key not in owned:
                self.conntrack.on_dataplane_route_deleted(key[0], old.oif)
        self.kernel.replace_dataplane(owned)
        if self._resynced_before:
            self._count_drift(nl, believed, owned)
        self._resynced_before = True
        if self._pending_arps:
            self._drop_arps_already_present(nl, names)
        self._ifaces_to_rescan.clear()
        self._full_resync = False
        self.log.info("route table resynced", owned=len(owned), desired=self.kernel.desired_len(),
                      to_update=self.kernel.num_pending_updates(),
                      to_delete=self.kernel.num_pending_deletions(),
                      seconds=round(time.monotonic() - start, 4))
        metrics.resync_seconds.observe(time.monotonic() - start)

    def _count_drift(self, nl: Netlink, believed: dict[Key, Route], found: dict[Key, Route]) -> None:
        """Routes changed behind our back (believed → found) that this apply rewrites or deletes.

        A believed route via an ifindex that no longer exists (the device was deleted, or deleted and
        made again) is not counted: the routes went with the device, and rewriting them onto the new
        ifindex is the consequence of the device's repair, which the tunnel driver counts.  The link
        dump comes before the route dump (routes are judged ours by their interface), so a device
        deleted between the two looks alive to the first and is missing its routes in the second:
        a candidate's device is asked for again before its route is counted (only candidates: a
        quiet refresh makes no extra call).
        """
        def same_device(route: Route) -> bool:
            if route.oif <= 1:
                return True
            name = self._index_to_name.get(route.oif)
            if name is None:
                return False
            try:
                return nl.link_by_name(name).index == route.oif
            except NetlinkCallError as exc:
                if exc.not_found:
                    return False
                raise

        n = sum(1 for k in self.kernel.pending_update_keys()
                if k in believed and found.get(k) != believed[k] and same_device(believed[k]))
        n += sum(1 for k in self.kernel.pending_deletions()
                 if k not in believed and k in found and not self._in_grace(found[k].oif))
        self._drift.found("route", n)

    def _drop_arps_already_present(self, nl: Netlink, names: dict[int, str]) -> None:
        """Static ARP entries the kernel already has (permanent, same MAC) need no write.

        Only on a full resync (a restart re-feeds every endpoint), so that a
        restart with nothing to change writes nothing; in steady state the
        pending entries are for new workloads and are written without a dump.
        """
        # Only the interfaces with entries pending are asked about (the dump's names, as listed): a large
        # node's 5,000 VXLAN neighbours are then skipped before they are made into objects.
        asked = {i: n for i, n in names.items() if n in self._pending_arps}
        if not asked:
            return
        try:
            present = {(n.ifindex, n.dst): n.lladdr for n in nl.neigh_list(None, AF_INET, names=asked)
                       if n.state & NUD_PERMANENT}
        except NetlinkCallError as exc:
            self.log.warning("neighbour dump failed; writing every pending static ARP entry", error=str(exc))
            return
        for iface in list(self._pending_arps):
            ifindex = self._name_to_index.get(iface)
            if ifindex is None:
                continue
            pending = self._pending_arps[iface]
            for addr in [a for a, mac in pending.items() if present.get((ifindex, a)) == mac]:
                del pending[addr]
            if not pending:
                del self._pending_arps[iface]

    def _resync_ifaces(self, nl: Netlink) -> None:
        for name in list(self._ifaces_to_rescan):
            try:
                self._resync_iface(nl, name)
            except NetlinkCallError as exc:
                self.log.warning("interface rescan failed", iface=name, error=str(exc))
                continue
            self._ifaces_to_rescan.discard(name)

    def _resync_iface(self, nl: Netlink, name: str) -> None:
        with metrics.partial_resync_seconds.time():
            self._resync_iface_routes(nl, name)

    def _resync_iface_routes(self, nl: Netlink, name: str) -> None:
        try:
            link = nl.link_by_name(name)
        except NetlinkCallError as exc:
            if not exc.not_found:
                raise
            self.on_iface_state(name, IfaceState.DOWN, 0)
            return
        self.on_iface_state(name, IfaceState.UP if link.oper_up else IfaceState.DOWN, link.index)
        self._ifaces_to_rescan.discard(name)  # on_iface_state re-adds it when up
        seen: set[Key] = set()
        try:
            routes = nl.route_list(self.family, self.table_index, oif=link.index)
        except NetlinkCallError as exc:
            if exc.not_found:
                return
            raise
        for route in routes:
            if route.oif == link.index and self._route_is_ours(route):
                self.kernel.set_dataplane(route.key, route)
                seen.add(route.key)
        for key, route in list(self.kernel.dataplane_items()):
            if route.oif == link.index and key not in seen:
                self.kernel.delete_dataplane(key)

    # -- writing -----------------------------------------------------------------
    def _in_grace(self, ifindex: int) -> bool:
        grace = self._grace.get(ifindex)
        if grace is None or grace.expired:
            return False
        known, name = self._name_for(ifindex)
        if not known or not self.ownership.iface_should_have_grace_period(name):
            return False
        return self.clock() - grace.first_seen < self.grace_period

    def _maybe_clean_grace(self) -> None:
        now = self.clock()
        if now - self._last_grace_cleanup < self.grace_period:
            return
        self._last_grace_cleanup = now
        for ifindex in [i for i, g in self._grace.items()
                        if now - g.first_seen >= self.grace_period and i not in self._index_to_name]:
            del self._grace[ifindex]

    def _iface_gone_or_down(self, nl: Netlink, ifindex: int, err: int) -> str | None:
        """If a failure is explained by the interface vanishing/going down, its name."""
        known, name = self._name_for(ifindex)
        if not known or name is None:
            return None
        if err in _GONE_ERRNOS or err == _errno.ENETDOWN:
            return name
        try:
            link = nl.link_by_name(name)
        except NetlinkCallError as exc:
            return name if exc.not_found else None
        return None if link.admin_up else name

    def _apply_updates(self, nl: Netlink) -> None:
        errors: dict[str, str] = {}
        # 1. Deletions (sparing routes on workload interfaces still in their grace period),
        #    plus early deletion of single-address routes that are moving interface.
        to_delete: list[tuple[Key, Route]] = []
        for key in self.kernel.pending_deletions():
            route = self.kernel.get_dataplane(key)
            if route is not None and not self._in_grace(route.oif):
                to_delete.append((key, route))
        for key, _want in self.kernel.pending_updates():
            current = self.kernel.get_dataplane(key)
            if current is not None and self.conntrack.needs_early_cleanup(key[0], current.oif):
                to_delete.append((key, current))
        if to_delete:
            results = nl.routes_delete([r for _, r in to_delete])
            for (key, route), err in zip(to_delete, results):
                if err and err not in _ABSENT_ERRNOS:
                    errors[f"delete {key[0]}"] = _errno_name(err)
                    continue
                self.kernel.delete_dataplane(key)
                self.conntrack.on_dataplane_route_deleted(key[0], route.oif)
        self.conntrack.start_cleanup_and_reset()

        # 2. Adds/replaces in one batch; routes waiting for a conntrack flush go last.
        updates = self.kernel.pending_updates()
        ready = [(k, r) for k, r in updates if not self.conntrack.has_pending(k[0])]
        waiting = [(k, r) for k, r in updates if self.conntrack.has_pending(k[0])]
        for batch in (ready, waiting):
            if not batch:
                continue
            if batch is waiting:
                with metrics.conntrack_wait_seconds.time():
                    for key, _ in batch:
                        self.conntrack.wait_for_pending(key[0])
            results = nl.routes_replace([r for _, r in batch])
            for (key, route), err in zip(batch, results):
                if err == _errno.ENOBUFS:
                    self._full_resync = True  # lost error reports: re-read before trusting anything
                if not err:
                    self.kernel.set_dataplane(key, route)
                    continue
                name = self._iface_gone_or_down(nl, route.oif, err)
                if name is not None:
                    self._ifaces_to_rescan.add(name)  # common CNI race: rescan, don't fail
                else:
                    errors[f"replace {key[0]}"] = _errno_name(err)

        # 3. Static ARP entries for workload routes.
        if self._pending_arps:
            neighs: list[tuple[str, str, Neigh]] = []
            for iface, addr_to_mac in self._pending_arps.items():
                ifindex = self._name_to_index.get(iface)
                if ifindex is None:
                    continue  # interface not known yet: keep pending
                for addr, mac in addr_to_mac.items():
                    neighs.append((iface, addr, Neigh(AF_INET, ifindex, addr, mac)))
            results = nl.neighs_replace([n for _, _, n in neighs]) if neighs else []
            for (iface, addr, neigh), err in zip(neighs, results):
                if err:
                    name = self._iface_gone_or_down(nl, neigh.ifindex, err)
                    if name is not None:
                        self._ifaces_to_rescan.add(name)
                    else:
                        errors[f"arp {iface}/{addr}"] = _errno_name(err)
                        continue
                pending = self._pending_arps.get(iface)
                if pending is not None:
                    pending.pop(addr, None)
                    if not pending:
                        del self._pending_arps[iface]

        self.last_errors = errors
        if errors:
            sample = dict(list(errors.items())[:5])
            self.log.warning("some route updates failed; will retry", failed=len(errors), sample=sample)
            raise DataplaneError(f"{len(errors)} route operations failed in table {self.table_index}: {sample}")


def _errno_name(err: int) -> str:
    return _errno.errorcode.get(err, str(err))


