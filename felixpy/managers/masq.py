"""Masquerade manager (per IP family): IP pools → NAT-outgoing IP sets and chain.

Felix's ``masqManager``: ``network-ip-pools`` holds every pool of this family
except LoadBalancer-only ones, ``masq-ipam-pools`` the pools with
``masquerade`` set (both hash:net, created at start even when empty, because
static chains reference them); ``cali-nat-outgoing`` in nat is rendered active
only while some pool masquerades.  Only records into the IP sets and the nat
table (no kernel I/O).
"""

from __future__ import annotations

import ipaddress
from typing import Any

import structlog

from felixpy.drivers.generictables.table import Table
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import RuleRenderer
from felixpy.rules.ipset_names import IPSET_ID_ALL_POOLS, IPSET_ID_NAT_OUTGOING_MASQ_POOLS

log = structlog.get_logger(__name__)



class MasqManager:
    def __init__(self, ip_version: int, ipsets: IPSetsDataplane, nat: Table, renderer: RuleRenderer,
                 max_size: int) -> None:
        self.ip_version = ip_version
        self._ipsets = ipsets
        self._nat = nat
        self._r = renderer
        self._max = max_size
        self._pools: dict[str, pb.IPAMPool] = {}
        self._dirty = True

    update_types: tuple[type, ...] = (pb.IPAMPoolUpdate, pb.IPAMPoolRemove)  # what on_update acts on (managers/base.py)
    writes_ip_sets = True  # complete_deferred_work() feeds an IP-set dataplane: run before the write starts (managers/base.py)

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.IPAMPoolUpdate):
            try:
                version = ipaddress.ip_network(msg.pool.cidr, strict=False).version
            except ValueError:
                log.error("Ignoring IP pool with a bad CIDR", pool=msg.id, cidr=msg.pool.cidr)
                return
            if version != self.ip_version:
                return
            self._pools[msg.id] = msg.pool
            self._dirty = True
        elif isinstance(msg, pb.IPAMPoolRemove) and self._pools.pop(msg.id, None) is not None:
            self._dirty = True

    def complete_deferred_work(self) -> None:
        if not self._dirty:
            return
        all_pools = sorted({p.cidr for p in self._pools.values()
                            if list(p.allowed_uses) != ["LoadBalancer"]})
        masq = sorted({p.cidr for p in self._pools.values() if p.masquerade})
        self._ipsets.add_or_replace_ip_set(IPSetMetadata(IPSET_ID_ALL_POOLS, IPSetType.HASH_NET, self._max), all_pools)
        self._ipsets.add_or_replace_ip_set(IPSetMetadata(IPSET_ID_NAT_OUTGOING_MASQ_POOLS, IPSetType.HASH_NET, self._max), masq)
        self._nat.update_chain(self._r.nat_outgoing_chain(bool(masq)))
        self._dirty = False
