"""Interface monitor: netlink link and address events → IfaceStateUpdate / IfaceAddrsUpdate.

* :mod:`.events` — the values crossing the netlink boundary (Link, LinkEvent, AddrEvent).
* :mod:`.shim` — netlink sockets and decoding (the only module that sees pyroute2).
* :mod:`.update_filter` — Felix's 100 ms flap damping, pure and clock-injected.
* :mod:`.tracker` — kernel view vs reported view; reports only changes.
* :mod:`.excludes` — ``InterfaceExclude`` parsing.
* :mod:`.monitor` — :class:`InterfaceMonitor`, the thread tying them together.

See ``docs/ifacemonitor.md``.
"""

from felixpy.ifacemonitor.events import AddrEvent, Link, LinkEvent
from felixpy.ifacemonitor.excludes import compile_excludes, exclusion_matcher
from felixpy.ifacemonitor.monitor import InterfaceMonitor
from felixpy.ifacemonitor.tracker import IfaceTracker
from felixpy.ifacemonitor.update_filter import FLAP_DAMPING_DELAY, UpdateFilter

__all__ = [
    "FLAP_DAMPING_DELAY",
    "AddrEvent",
    "IfaceTracker",
    "InterfaceMonitor",
    "Link",
    "LinkEvent",
    "UpdateFilter",
    "compile_excludes",
    "exclusion_matcher",
]
