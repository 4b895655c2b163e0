"""Which host interface holds which address, from the interface monitor's reports (pure).

The routing managers find a tunnel's parent (data) interface by this node's
address.  They learn it from :class:`~felixpy.ifacemonitor.events.IfaceAddrsUpdate`
instead of asking the kernel, so they never touch it; the monitor's initial dump
arrives before the first apply.
"""

from __future__ import annotations

import ipaddress

from felixpy.ifacemonitor.events import IfaceAddrsUpdate


def _canon(address: str) -> str | None:
    try:
        return str(ipaddress.ip_address(address.split("/")[0]))
    except ValueError:
        return None


class InterfaceAddresses:
    def __init__(self) -> None:
        self._by_iface: dict[str, frozenset[str]] = {}

    def on_update(self, msg: IfaceAddrsUpdate) -> None:
        if msg.addrs is None:
            self._by_iface.pop(msg.name, None)
        else:
            self._by_iface[msg.name] = frozenset(a for a in map(_canon, msg.addrs) if a is not None)

    def iface_with(self, address: str) -> str | None:
        """The interface holding *address* (lowest name if several do), or None."""
        want = _canon(address)
        if want is None:
            return None
        holders = sorted(name for name, addrs in self._by_iface.items() if want in addrs)
        return holders[0] if holders else None
