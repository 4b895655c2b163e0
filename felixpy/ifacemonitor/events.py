"""The interface monitor's values: what crosses the netlink shim, and what the monitor reports.

Inward (:class:`Link`, :class:`LinkEvent`, :class:`AddrEvent`): the shim
(:mod:`felixpy.ifacemonitor.shim`) turns rtnetlink messages into these and
nothing else leaves it; the update filter and the tracker speak only these.

Outward (:class:`IfaceStateUpdate`, :class:`IfaceAddrsUpdate`): what the
monitor reports to the dataplane, which fans them out to every manager and
forwards state changes to the route tables, FDBs and tunnel-device syncer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Link:
    """One interface as the kernel reported it."""

    index: int
    name: str
    oper_up: bool  # IFF_RUNNING, not IFF_UP: admin-up alone does not carry traffic
    kind: str | None = None  # IFLA_INFO_KIND ("veth", "netkit", ...; "" for none); None: not known


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """RTM_NEWLINK (``exists``) or RTM_DELLINK for one interface."""

    link: Link
    exists: bool

    @property
    def index(self) -> int:
        return self.link.index


@dataclass(frozen=True, slots=True)
class AddrEvent:
    """A local address appeared on (``exists``) or left interface ``index``.

    ``addr`` is the bare IP in canonical text form (no prefix length), as
    Felix reports it.  An RTM_NEWADDR for an address that is not usable yet
    (IPv6 tentative, DAD failed) arrives as ``exists=False``: the kernel has no
    local route for it, so Felix would not count it.
    """

    index: int
    addr: str
    exists: bool


Event = LinkEvent | AddrEvent


class IfaceState(enum.Enum):
    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class IfaceStateUpdate:
    """An interface's oper state changed (or it vanished: state DOWN, index 0).  ``kind`` is the
    link kind of that index (as :class:`Link` has it: "" for none, None when not known)."""

    name: str
    state: IfaceState
    index: int
    kind: str | None = None


@dataclass(frozen=True, slots=True)
class IfaceAddrsUpdate:
    """The full set of addresses now on an interface (None: interface gone)."""

    name: str
    addrs: frozenset[str] | None = field(default=None)
