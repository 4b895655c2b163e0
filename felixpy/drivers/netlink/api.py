"""The netlink handle the routing drivers and managers are written against.

Two implementations: :class:`felixpy.drivers.netlink.pyroute.PyrouteNetlink`
(the real kernel, via pyroute2, and iproute2's ``ip -batch``/``ip -j`` for bulk
writes and dumps) and
:class:`felixpy.drivers.netlink.fake.FakeNetlink` (stateful, with failure
flags).  Everything crossing this interface is a frozen value from
:mod:`felixpy.drivers.netlink.types`.

Error contract: single operations raise
:class:`~felixpy.drivers.netlink.errors.NetlinkCallError` (``LinkNotFound``
for a missing interface); the batch operations (``routes_replace``,
``routes_delete``, ``neighs_replace``) never raise per item and return one
errno per input (0 = done).  Deleting something absent is reported as
``ESRCH``/``ENOENT``, which callers treat as success.  A handle is used by one
thread at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from felixpy.drivers.netlink.types import (
    Addr,
    FDBEntry,
    Link,
    LinkSpec,
    Neigh,
    Route,
    Rule,
    WireguardDevice,
)


class Netlink(Protocol):
    # links
    def link_list(self) -> list[Link]: ...
    def link_by_name(self, name: str) -> Link: ...
    def link_add(self, spec: LinkSpec) -> None: ...
    def link_del(self, index: int) -> None: ...
    def link_set_mtu(self, index: int, mtu: int) -> None: ...
    def link_set_up(self, index: int) -> None: ...

    # addresses
    def addr_list(self, index: int | None = None, family: int | None = None) -> list[Addr]: ...
    def addr_add(self, addr: Addr) -> None: ...
    def addr_del(self, addr: Addr) -> None: ...

    # routes (bulk)
    # names: index -> name of every interface, as a link listing just before this call found them (the
    # dump then checks only the interfaces it names for a change, not the whole map again).
    def route_list(self, family: int, table: int, oif: int | None = None, *,
                   names: Mapping[int, str] | None = None) -> list[Route]: ...
    def routes_replace(self, routes: Sequence[Route]) -> list[int]: ...
    def routes_delete(self, routes: Sequence[Route]) -> list[int]: ...

    # neighbours / FDB
    def neighs_replace(self, neighs: Sequence[Neigh]) -> list[int]: ...
    def neigh_list(self, ifindex: int | None, family: int, *,  # ifindex None: all interfaces
                   names: Mapping[int, str] | None = None) -> list[Neigh]: ...
    def neigh_del(self, neigh: Neigh) -> None: ...
    def fdb_list(self, ifindex: int) -> list[FDBEntry]: ...
    def fdb_replace(self, entry: FDBEntry) -> None: ...
    def fdbs_replace(self, entries: Sequence[FDBEntry]) -> list[int]: ...  # bulk, one errno per entry
    def fdb_del(self, entry: FDBEntry) -> None: ...

    # rules
    def rule_list(self, family: int) -> list[Rule]: ...
    def rule_add(self, rule: Rule) -> None: ...
    def rule_del(self, rule: Rule) -> None: ...

    # wireguard (genetlink)
    def wireguard_get(self, name: str) -> WireguardDevice | None: ...
    def wireguard_set(self, name: str, device: WireguardDevice, replace_peers: bool = True) -> None: ...

    def close(self) -> None: ...


NetlinkFactory = Callable[[], Netlink]
"""Opens a fresh handle; drivers call it again after a failure (Felix's handle manager)."""
