"""Service-loop prevention (per IP family): ``GlobalBGPConfigUpdate`` service CIDRs → ``cali-cidr-block``.

Felix's ``serviceLoopManager``.  Traffic forwarded to an address in a service
cluster/external/load-balancer CIDR that kube-proxy did not DNAT is addressed
to nothing; when service CIDRs are advertised over BGP it would loop between
this node and its gateway, so filter ``cali-FORWARD`` ends by jumping to
``cali-cidr-block``, which drops or rejects it per ``ServiceLoopPrevention``
(``Disabled``: the chain stays empty).  The chain exists from start of day.

A CIDR that does not parse is logged (with the message's name) and skipped;
the others are programmed.  Only records into the filter table.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import structlog

from felixpy.drivers.generictables.table import Table
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import RuleRenderer

log = structlog.get_logger(__name__)


class ServiceLoopManager:
    def __init__(self, ip_version: int, renderer: RuleRenderer, filter: Table) -> None:
        self.ip_version = ip_version
        self._r = renderer
        self._filter = filter
        self._cidrs: list[str] = []
        self._dirty = True

    update_types: tuple[type, ...] = (pb.GlobalBGPConfigUpdate,)  # what on_update acts on (managers/base.py)

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.GlobalBGPConfigUpdate):
            cidrs = set()
            for field, values in (("service_cluster_cidrs", msg.service_cluster_cidrs),
                                  ("service_external_cidrs", msg.service_external_cidrs),
                                  ("service_loadbalancer_cidrs", msg.service_loadbalancer_cidrs)):
                for raw in values:
                    try:
                        net = ipaddress.ip_network(raw, strict=False)
                    except ValueError as exc:
                        log.error("Skipping bad service CIDR", object="GlobalBGPConfigUpdate", field=field,
                                  cidr=raw, error=str(exc))
                        continue
                    if net.version == self.ip_version:
                        cidrs.add(str(net))
            self._cidrs = sorted(cidrs)
            self._dirty = True

    def complete_deferred_work(self) -> None:
        if self._dirty:
            self._filter.update_chain(self._r.cidr_block_chain(self._cidrs))
            self._dirty = False

    def blocked_cidrs(self) -> list[str]:
        return list(self._cidrs)
