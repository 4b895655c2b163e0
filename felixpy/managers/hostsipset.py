"""Hosts IP-set manager (per IP family): ``all-hosts-net``, every Calico node's address.

Felix registers it when IPIP is on (the static chains only accept IPIP from other
nodes) or ``NATOutgoingExclusions=IPPoolsAndHostIPs`` (traffic to other nodes is not
masqueraded).  Members: each node's address of this family from
``HostMetadataUpdate`` (v4 ``ipv4_addr``, v6 ``ipv6_addr``, either may carry a
prefix length) plus ``ExternalNodesCIDRList``.  The set (hash:net) exists from the
first apply, even empty, because the rules that reference it are static.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

import structlog

from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules.ipset_names import IPSET_ID_ALL_HOST_NETS

log = structlog.get_logger(__name__)



class HostsIPSetManager:
    def __init__(self, ip_version: int, ipsets: IPSetsDataplane, external_cidrs: Iterable[str],
                 max_size: int) -> None:
        self.ip_version = ip_version
        self._ipsets = ipsets
        self._max = max_size
        self._external = sorted(c for c in (self._canon(x, "ExternalNodesCIDRList") for x in external_cidrs) if c)
        self._hosts: dict[str, str] = {}
        self._dirty = True

    def _canon(self, addr: str, source: str) -> str | None:
        try:
            net = ipaddress.ip_network(addr.strip(), strict=False)
        except ValueError:
            log.error("Ignoring a bad host address", source=source, address=addr)
            return None
        return str(net) if net.version == self.ip_version else None

    update_types: tuple[type, ...] = (pb.HostMetadataUpdate, pb.HostMetadataRemove)  # what on_update acts on (managers/base.py)
    writes_ip_sets = True  # complete_deferred_work() feeds an IP-set dataplane: run before the write starts (managers/base.py)

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.HostMetadataUpdate):
            raw = msg.ipv4_addr if self.ip_version == 4 else msg.ipv6_addr
            addr = self._canon(raw.split("/")[0], f"host {msg.hostname}") if raw else None
            if addr is None:
                if self._hosts.pop(msg.hostname, None) is not None:
                    self._dirty = True
            elif self._hosts.get(msg.hostname) != addr:
                self._hosts[msg.hostname] = addr
                self._dirty = True
        elif isinstance(msg, pb.HostMetadataRemove) and self._hosts.pop(msg.hostname, None) is not None:
            self._dirty = True

    def complete_deferred_work(self) -> None:
        if not self._dirty:
            return
        members = sorted(set(self._hosts.values()) | set(self._external))
        self._ipsets.add_or_replace_ip_set(IPSetMetadata(IPSET_ID_ALL_HOST_NETS, IPSetType.HASH_NET, self._max), members)
        self._dirty = False
