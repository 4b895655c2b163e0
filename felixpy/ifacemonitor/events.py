"""The values that cross the netlink shim boundary.

The shim (:mod:`felixpy.ifacemonitor.shim`) turns rtnetlink messages into
these and nothing else leaves it; the update filter, the tracker and every
test speak only these types.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Link:
    """One interface as the kernel reported it."""

    index: int
    name: str
    oper_up: bool  # IFF_RUNNING, not IFF_UP: admin-up alone does not carry traffic


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
