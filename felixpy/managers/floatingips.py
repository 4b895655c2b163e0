"""Floating IPs (per IP family): workload ``ipv4_nat``/``ipv6_nat`` → ``cali-fip-dnat``/``cali-fip-snat``.

Felix's ``floatingIPManager``.  A floating (external) IP is DNAT'd to the
workload's internal IP on the way in (nat PREROUTING and OUTPUT jump to
``cali-fip-dnat``); the SNAT chain only handles the hairpin case, a workload
reaching itself through its floating IP.  Mappings are programmed when
``FloatingIPs=Enabled`` or for OpenStack endpoints (as Felix).  Conflicts
resolve as Felix: one external IP → the lowest internal IP; one internal IP →
the lowest external IP for the reverse SNAT.  The endpoint manager routes the
external IP to the workload.

A mapping whose addresses do not parse or are not of this family is logged
with the endpoint's ID and skipped; the endpoint's other mappings are kept.
Both chains exist from start of day (the static nat chains jump to them).
Only records into the nat table.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import structlog

from felixpy.drivers.generictables.table import Table
from felixpy.managers.endpoints import ORCHESTRATOR_OPENSTACK, WlKey, wl_key
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import RuleRenderer

log = structlog.get_logger(__name__)


class FloatingIPManager:
    def __init__(self, ip_version: int, renderer: RuleRenderer, nat: Table, enabled: bool) -> None:
        self.ip_version = ip_version
        self._r = renderer
        self._nat = nat
        self._enabled = enabled
        self._nat_info: dict[WlKey, list[tuple[str, str]]] = {}
        self._dirty = True

    update_types: tuple[type, ...] = (pb.WorkloadEndpointUpdate, pb.WorkloadEndpointRemove)  # what on_update acts on (managers/base.py)

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.WorkloadEndpointUpdate):
            key = wl_key(msg.id)
            if self._enabled or msg.id.orchestrator_id == ORCHESTRATOR_OPENSTACK:
                infos = msg.endpoint.ipv4_nat if self.ip_version == 4 else msg.endpoint.ipv6_nat
                self._nat_info[key] = [m for m in (self._valid(key, n) for n in infos) if m is not None]
            elif self._nat_info.pop(key, None) is None:
                return
            self._dirty = True
        elif isinstance(msg, pb.WorkloadEndpointRemove):
            if self._nat_info.pop(wl_key(msg.id), None) is not None:
                self._dirty = True

    def _valid(self, key: WlKey, nat: pb.NatInfo) -> tuple[str, str] | None:
        try:
            ext, internal = ipaddress.ip_address(nat.ext_ip), ipaddress.ip_address(nat.int_ip)
        except ValueError as exc:
            log.error("Skipping bad floating IP mapping", endpoint=key, ext_ip=nat.ext_ip, int_ip=nat.int_ip,
                      error=str(exc))
            return None
        if ext.version != self.ip_version or internal.version != self.ip_version:
            log.error("Skipping floating IP mapping of the wrong IP family", endpoint=key, ext_ip=nat.ext_ip,
                      int_ip=nat.int_ip, ip_version=self.ip_version)
            return None
        return str(ext), str(internal)

    def complete_deferred_work(self) -> None:
        if not self._dirty:
            return
        dnats: dict[str, str] = {}
        for mappings in self._nat_info.values():
            for ext, internal in mappings:
                if ext not in dnats or internal < dnats[ext]:
                    dnats[ext] = internal
        snats: dict[str, str] = {}
        for ext, internal in dnats.items():
            if internal not in snats or ext < snats[internal]:
                snats[internal] = ext
        self._nat.update_chains([self._r.fip_dnat_chain(dnats), self._r.fip_snat_chain(snats)])
        self._dirty = False

    def mappings(self) -> dict[WlKey, list[tuple[str, str]]]:
        return {k: list(v) for k, v in self._nat_info.items()}
