"""Host-IP manager (per IP family): the ``this-host`` IP set of the node's own addresses.

Felix's ``hostIPManager``: every address on a non-workload interface (from the
interface monitor's IfaceAddrsUpdate) of this family goes into ``this-host``
(hash:ip), which the static chains use (e.g. mangle POSTROUTING's DSCP rule).
The set exists from the start (possibly empty) so rules that reference it can
always be programmed.  Only records into the IP-set dataplane (no kernel I/O).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.ifacemonitor.events import IfaceAddrsUpdate
from felixpy.rules.ipset_names import IPSET_ID_THIS_HOST_IPS



class HostIPManager:
    def __init__(self, ip_version: int, ipsets: IPSetsDataplane, workload_prefixes: tuple[str, ...],
                 max_size: int) -> None:
        self.ip_version = ip_version
        self._ipsets = ipsets
        self._prefixes = workload_prefixes
        self._max = max_size
        self._addrs: dict[str, frozenset[str]] = {}
        self._dirty = True

    update_types: tuple[type, ...] = (IfaceAddrsUpdate,)  # what on_update acts on (managers/base.py)
    writes_ip_sets = True  # complete_deferred_work() feeds an IP-set dataplane: run before the write starts (managers/base.py)

    def on_update(self, msg: Any) -> None:
        if not isinstance(msg, IfaceAddrsUpdate) or msg.name.startswith(self._prefixes):
            return
        if msg.addrs is None:
            self._addrs.pop(msg.name, None)
        else:
            self._addrs[msg.name] = frozenset(a for a in msg.addrs if self._in_family(a))
        self._dirty = True

    def _in_family(self, addr: str) -> bool:
        try:
            return ipaddress.ip_address(addr.split("/")[0]).version == self.ip_version
        except ValueError:
            return False

    def complete_deferred_work(self) -> None:
        if not self._dirty:
            return
        members = sorted({a.split("/")[0] for addrs in self._addrs.values() for a in addrs})
        self._ipsets.add_or_replace_ip_set(IPSetMetadata(IPSET_ID_THIS_HOST_IPS, IPSetType.HASH_IP, self._max), members)
        self._dirty = False
