"""DSCP manager (per IP family): endpoints' egress DSCP → ``dscp-src-net`` and ``cali-egress-dscp``.

Felix's ``dscpManager``: a workload (or host endpoint) whose QoS policies carry a DSCP value has
its addresses (a host endpoint: its expected IPs) of this family put in ``dscp-src-net`` (hash:net)
and gets a ``-s <addr> → DSCP <value>`` rule in mangle ``cali-egress-dscp``, which
mangle POSTROUTING jumps to for traffic leaving the cluster.  The set and the
chain exist from the start (possibly empty) because the static chain refers to
them.  Only records into the IP sets and the mangle table.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import structlog

from felixpy.drivers.generictables.table import Table
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import RuleRenderer
from felixpy.rules.ipset_names import IPSET_ID_DSCP_ENDPOINTS

log = structlog.get_logger(__name__)



def endpoint_dscp(ep: pb.WorkloadEndpoint | pb.HostEndpoint, endpoint: object) -> int | None:
    """An endpoint's QoS DSCP as Felix takes it (the first non-zero one), None for none.  A value outside
    0-63 is bad input: logged and ignored (the endpoint is programmed without it), never handed to the
    kernel, which would refuse the whole mangle table (or, in BPF mode, set the wrong bits)."""
    dscp = next((q.dscp for q in ep.qos_policies if q.dscp), None)
    if dscp is not None and not 0 <= dscp <= 63:
        kind = "Host endpoint" if isinstance(ep, pb.HostEndpoint) else "Workload"
        log.error(f"{kind} QoS DSCP out of range (0-63); not set", endpoint=endpoint, dscp=dscp)
        return None
    return dscp


def _host_cidr(addr: str) -> str:
    """A host endpoint's expected IP as the one-address CIDR the rule and the set take."""
    ip = ipaddress.ip_address(addr)
    return f"{ip}/{ip.max_prefixlen}"


class DSCPManager:
    def __init__(self, ip_version: int, ipsets: IPSetsDataplane, mangle: Table, renderer: RuleRenderer,
                 max_size: int) -> None:
        self.ip_version = ip_version
        self._ipsets, self._mangle, self._r, self._max = ipsets, mangle, renderer, max_size
        # Workload endpoints by (orchestrator, workload, endpoint), host endpoints by ("hep", id).
        self._by_endpoint: dict[tuple[str, ...], dict[str, int]] = {}
        self._dirty = True

    update_types: tuple[type, ...] = (pb.WorkloadEndpointUpdate, pb.WorkloadEndpointRemove, pb.HostEndpointUpdate,
                                      pb.HostEndpointRemove)  # what on_update acts on (managers/base.py)
    writes_ip_sets = True  # complete_deferred_work() feeds an IP-set dataplane: run before the write starts (managers/base.py)

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.WorkloadEndpointUpdate):
            key: tuple[str, ...] = (msg.id.orchestrator_id, msg.id.workload_id, msg.id.endpoint_id)
            dscp = endpoint_dscp(msg.endpoint, key)
            nets = msg.endpoint.ipv4_nets if self.ip_version == 4 else msg.endpoint.ipv6_nets
            self._set(key, {n: dscp for n in nets if self._valid(n, key)} if dscp is not None else {})
        elif isinstance(msg, pb.HostEndpointUpdate):
            # Felix's dscpManager: a host endpoint's DSCP marks what leaves from its expected IPs.
            key = ("hep", msg.id.endpoint_id)
            dscp = endpoint_dscp(msg.endpoint, key)
            ips = msg.endpoint.expected_ipv4_addrs if self.ip_version == 4 else msg.endpoint.expected_ipv6_addrs
            new: dict[str, int] = {}
            if dscp is not None:
                for ip in ips:
                    try:
                        cidr = _host_cidr(ip)
                    except ValueError:
                        cidr = ip  # logged by _valid
                    if self._valid(cidr, key):
                        new[cidr] = dscp
            self._set(key, new)
        elif isinstance(msg, pb.WorkloadEndpointRemove):
            self._set((msg.id.orchestrator_id, msg.id.workload_id, msg.id.endpoint_id), {})
        elif isinstance(msg, pb.HostEndpointRemove):
            self._set(("hep", msg.id.endpoint_id), {})

    def _set(self, key: tuple[str, ...], new: dict[str, int]) -> None:
        if self._by_endpoint.get(key, {}) != new:
            if new:
                self._by_endpoint[key] = new
            else:
                self._by_endpoint.pop(key, None)
            self._dirty = True

    def _valid(self, net: str, key: tuple[str, ...]) -> bool:
        """Bad input must not reach the chain: the kernel would refuse the whole table."""
        try:
            if ipaddress.ip_network(net, strict=False).version == self.ip_version:
                return True
        except ValueError:
            pass
        log.error("Skipping bad endpoint address for DSCP", endpoint=key, cidr=net, ip_version=self.ip_version)
        return False

    def complete_deferred_work(self) -> None:
        if not self._dirty:
            return
        rules = sorted({(net, v) for ep in self._by_endpoint.values() for net, v in ep.items()})
        self._ipsets.add_or_replace_ip_set(IPSetMetadata(IPSET_ID_DSCP_ENDPOINTS, IPSetType.HASH_NET, self._max),
                                           [net for net, _ in rules])
        self._mangle.update_chain(self._r.egress_dscp_chain(rules))
        self._dirty = False
