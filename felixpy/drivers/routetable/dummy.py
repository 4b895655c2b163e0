"""Felix's ``DummyTable``: the route table for ``RouteSyncDisabled``.

What it owns
    Nothing in the kernel: every call is accepted and dropped, and ``apply()``
    never touches the kernel.  Producers (endpoint, VXLAN, IPIP, no-encap
    managers) are handed this instead of ``None`` so none of them branches on
    route sync.

How a fresh process recognises its objects
    There are none, so there is nothing to recognise or sweep; routes an
    earlier instance programmed with route sync on are left alone, as Felix does.
"""

from __future__ import annotations

from collections.abc import Iterable

from felixpy.drivers.routetable.defs import Target
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.ifacemonitor.events import IfaceState
from felixpy.kernelnames import MAIN_ROUTE_TABLE


class DummyTable:
    def __init__(self, ip_version: int, table_index: int = MAIN_ROUTE_TABLE) -> None:
        self.ip_version = ip_version
        self._index = table_index

    @property
    def index(self) -> int:
        return self._index

    def set_routes(self, route_class: RouteClass, iface: str | None, targets: Iterable[Target]) -> None:
        pass

    def route_update(self, route_class: RouteClass, iface: str | None, target: Target) -> None:
        pass

    def route_remove(self, route_class: RouteClass, iface: str | None, cidr: str) -> None:
        pass

    def on_iface_state(self, name: str, state: IfaceState, index: int) -> None:
        pass

    def queue_resync(self) -> None:
        pass

    def queue_resync_iface(self, name: str) -> None:
        pass

    def apply(self) -> None:
        pass

    def next_deadline(self) -> float | None:
        return None
