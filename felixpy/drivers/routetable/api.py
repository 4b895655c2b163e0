"""The route-table contract every producer of routes is written against.

:class:`~felixpy.drivers.routetable.table.RouteTable` implements it against the
kernel; :class:`~felixpy.drivers.routetable.dummy.DummyTable` (Felix's
``DummyTable``, for ``RouteSyncDisabled``) accepts everything and programs
nothing.  Consumers never test for ``None``: wiring hands them one or the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from felixpy.drivers.routetable.defs import Target
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.ifacemonitor.events import IfaceState


class RouteTableAPI(Protocol):
    ip_version: int

    @property
    def index(self) -> int: ...

    def set_routes(self, route_class: RouteClass, iface: str | None, targets: Iterable[Target]) -> None:
        """Replace the desired routes of one (class, interface) pair (only records)."""
        ...

    def route_update(self, route_class: RouteClass, iface: str | None, target: Target) -> None: ...

    def route_remove(self, route_class: RouteClass, iface: str | None, cidr: str) -> None: ...

    def on_iface_state(self, name: str, state: IfaceState, index: int) -> None: ...

    def queue_resync(self) -> None: ...

    def queue_resync_iface(self, name: str) -> None: ...

    def apply(self) -> None: ...

    def next_deadline(self) -> float | None: ...
