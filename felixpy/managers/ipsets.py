"""The IP sets manager: calc-graph IP set messages → IP-set dataplanes.

A port of Felix's ``dataplane/ipsets/ipsets_mgr.go``.  It is a pass-through:
``IPSetUpdate`` (full membership), ``IPSetDeltaUpdate`` and ``IPSetRemove`` go
straight to each :class:`~felixpy.drivers.ipsets_api.IPSetsDataplane` it feeds
(usually one per IP family: the ipset driver in iptables mode, nft sets in
nftables mode), which only record them; the loop applies the dataplanes.

Differences from Felix, on purpose:

* Members are routed to the family they belong to — an IPv6 member reaches only
  an IPv6 dataplane — instead of every dataplane filtering the whole list.  A
  member whose address part contains ``:`` is IPv6, as Felix judges it; the
  dataplane validates it fully and logs (with the set ID) and skips what is bad.
* An unknown set type is logged with the set ID and that set is skipped (Felix
  panics); deltas for a skipped or unknown set are dropped.

``complete_deferred_work`` has nothing to do: nothing is deferred here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import structlog

from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.proto import felixbackend_pb2 as pb

log = structlog.get_logger(__name__)

PROTO_TO_TYPE: dict[int, IPSetType] = {
    pb.IPSetUpdate.IP: IPSetType.HASH_IP,
    pb.IPSetUpdate.NET: IPSetType.HASH_NET,
    pb.IPSetUpdate.IP_AND_PORT: IPSetType.HASH_IP_PORT,
}


def split_by_family(members: Iterable[str], set_type: IPSetType | None) -> tuple[list[str], list[str]]:
    """(IPv4 members, IPv6 members), judged by a ``:`` in the address part."""
    if set_type is IPSetType.HASH_IP_PORT or set_type is None:
        v4: list[str] = []
        v6: list[str] = []
        for m in members:
            (v6 if ":" in m.partition(",")[0] else v4).append(m)
        return v4, v6
    members = members if isinstance(members, list) else list(members)
    return [m for m in members if ":" not in m], [m for m in members if ":" in m]


class IPSetsManager:
    """Feeds IP set updates to one or more IP-set dataplanes (one per family, typically)."""

    def __init__(self, name: str, dataplanes: IPSetsDataplane | Sequence[IPSetsDataplane],
                 max_ipset_size: int) -> None:
        self.name = name
        self.max_ipset_size = max_ipset_size
        self._dataplanes: list[IPSetsDataplane] = (
            [dataplanes] if isinstance(dataplanes, IPSetsDataplane) else list(dataplanes))
        self._types: dict[str, IPSetType] = {}
        self._log = log.bind(manager=name)

    def add_dataplane(self, dataplane: IPSetsDataplane) -> None:
        self._dataplanes.append(dataplane)

    # -- lookups used by other managers (rule rendering needs set types) --------------
    def get_ip_set_type(self, set_id: str) -> IPSetType | None:
        for dp in self._dataplanes:
            t = dp.get_type_of(set_id)
            if t is not None:
                return t
        return None

    def get_ip_set_members(self, set_id: str) -> frozenset[str] | None:
        found: frozenset[str] | None = None
        for dp in self._dataplanes:
            members = dp.get_desired_members(set_id)
            if members is not None:
                found = members if found is None else found | members
        return found

    # -- Manager protocol -----------------------------------------------------------
    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.IPSetDeltaUpdate):
            self._on_delta(msg)
        elif isinstance(msg, pb.IPSetUpdate):
            self._on_update(msg)
        elif isinstance(msg, pb.IPSetRemove):
            self._on_remove(msg)

    def complete_deferred_work(self) -> None:
        """Nothing is deferred: updates go straight into the dataplanes' desired state."""

    # -- handlers ---------------------------------------------------------------------
    def _routed(self, members: Iterable[str], set_type: IPSetType | None) -> dict[int, list[str]]:
        versions = {dp.ip_version for dp in self._dataplanes}
        if versions == {4} and set_type is not IPSetType.HASH_IP_PORT and set_type is not None:
            return {4: [m for m in members if ":" not in m]}
        if versions == {6} and set_type is not IPSetType.HASH_IP_PORT and set_type is not None:
            return {6: [m for m in members if ":" in m]}
        v4, v6 = split_by_family(members, set_type)
        return {4: v4, 6: v6}

    def _on_update(self, msg: Any) -> None:
        set_type = PROTO_TO_TYPE.get(msg.type)
        if set_type is None:
            self._log.error("IP set update with an unknown type; skipping the set", set_id=msg.id,
                            set_type=msg.type)
            self._types.pop(msg.id, None)
            return
        self._log.debug("IP set update", set_id=msg.id, num_members=len(msg.members))
        self._types[msg.id] = set_type
        meta = IPSetMetadata(msg.id, set_type, self.max_ipset_size)
        routed = self._routed(msg.members, set_type)
        for dp in self._dataplanes:
            dp.add_or_replace_ip_set(meta, routed.get(dp.ip_version, []))

    def _on_delta(self, msg: Any) -> None:
        set_type = self._types.get(msg.id)
        if set_type is None:
            self._log.warning("IP set delta for an unknown or skipped set; ignoring it", set_id=msg.id)
            return
        self._log.debug("IP set delta update", set_id=msg.id, num_added=len(msg.added_members),
                        num_removed=len(msg.removed_members))
        added = self._routed(msg.added_members, set_type)
        removed = self._routed(msg.removed_members, set_type)
        for dp in self._dataplanes:
            if added.get(dp.ip_version):
                dp.add_members(msg.id, added[dp.ip_version])
            if removed.get(dp.ip_version):
                dp.remove_members(msg.id, removed[dp.ip_version])

    def _on_remove(self, msg: Any) -> None:
        self._log.debug("IP set remove", set_id=msg.id)
        self._types.pop(msg.id, None)
        for dp in self._dataplanes:
            dp.remove_ip_set(msg.id)
