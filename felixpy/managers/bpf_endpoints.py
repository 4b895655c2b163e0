"""BPF endpoint manager (per IP family): workload endpoints → per-interface policy programs and
the *tables allow list (Felix's ``bpfEndpointManager``, the desired-state half).

* ``on_update`` only records: workload endpoints (by interface), active policies and profiles
  (as the calc graph sent them).
* ``complete_deferred_work`` computes, for each workload interface whose endpoint or policies
  changed, the two :class:`~felixpy.bpf.policy_ir.PolicySet` values its programs enforce (policy
  ingress = to the workload, egress = from it; Felix's tier/profile extraction in
  :mod:`felixpy.bpf.from_proto`), and hands them to the BPF endpoint
  driver (:class:`~felixpy.drivers.bpfendpoints.api.BPFEndpointsAPI`).  The driver compares
  values, so an unchanged endpoint costs nothing and a changed policy swaps only the programs
  whose policy set changed.  A policy or profile update rebuilds only the endpoints that use it,
  and each message's rules are converted once (``from_proto.RuleCache``), not once per endpoint.  Two endpoints on one interface: the lower id wins (as the *tables
  endpoint manager does).  (The routes map -- workload and host addresses -- is the BPF route
  manager's, :mod:`felixpy.managers.bpf_maps`.)
* ``on_devices_applied`` (after the driver's apply) reads which interfaces are READY for this
  family and rewrites ``cali-to-wl-dispatch`` to accept exactly those, so the *tables admit an
  interface only once its programs are in place, and drop it again before they are detached.

Routes, interface sysctls and status stay with the *tables endpoint manager, which wiring runs
in BPF mode with its chains discarded (Felix's endpoint manager in BPF mode does the same).
This manager never touches the kernel.
"""

from __future__ import annotations

from typing import Any

import structlog

from felixpy.bpf import from_proto
from felixpy.drivers.bpfendpoints.api import BPFEndpointsAPI, WorkloadPolicy
from felixpy.drivers.generictables.table import Table
from felixpy.errors import UnsupportedFeature
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import bpfmode
from felixpy.rules.context import RenderContext

log = structlog.get_logger(__name__)

WlKey = tuple[str, str, str]


def _key(wid: pb.WorkloadEndpointID) -> WlKey:
    return (wid.orchestrator_id, wid.workload_id, wid.endpoint_id)


class BPFEndpointManager:
    def __init__(self, ip_version: int, ctx: RenderContext, driver: BPFEndpointsAPI, *, filter: Table) -> None:
        self.ip_version = ip_version
        self._ctx = ctx
        self._driver = driver
        self._filter = filter
        self._endpoints: dict[WlKey, pb.WorkloadEndpoint] = {}
        self._policies: dict[from_proto.PolicyKey, Any] = {}
        self._profiles: dict[str, Any] = {}
        self._dirty_keys: set[WlKey] = set()
        # Policies/profiles changed since the last apply: only endpoints that use one are rebuilt.
        self._dirty_policies: set[from_proto.PolicyKey] = set()
        self._dirty_profiles: set[str] = set()
        self._rules = from_proto.RuleCache()  # each message's rules converted once, not per endpoint
        self._programmed: dict[str, WorkloadPolicy] = {}  # iface -> what we gave the driver
        self._allowed: frozenset[str] | None = None
        self._host_endpoints: set[str] = set()  # ids the feed sent; BPF mode does not attach them yet

    # ----------------------------------------------------------------------- updates
    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.WorkloadEndpointUpdate):
            self._endpoints[_key(msg.id)] = msg.endpoint
            self._dirty_keys.add(_key(msg.id))
        elif isinstance(msg, pb.WorkloadEndpointRemove):
            self._endpoints.pop(_key(msg.id), None)
            self._dirty_keys.add(_key(msg.id))
        elif isinstance(msg, pb.ActivePolicyUpdate):
            key = from_proto.policy_key(msg.id)
            self._rules.forget(self._policies.get(key))
            self._policies[key] = msg.policy
            self._dirty_policies.add(key)
        elif isinstance(msg, pb.ActivePolicyRemove):
            key = from_proto.policy_key(msg.id)
            self._rules.forget(self._policies.pop(key, None))
            self._dirty_policies.add(key)
        elif isinstance(msg, pb.ActiveProfileUpdate):
            self._rules.forget(self._profiles.get(msg.id.name))
            self._profiles[msg.id.name] = msg.profile
            self._dirty_profiles.add(msg.id.name)
        elif isinstance(msg, pb.ActiveProfileRemove):
            self._rules.forget(self._profiles.pop(msg.id.name, None))
            self._dirty_profiles.add(msg.id.name)
        elif isinstance(msg, pb.HostEndpointUpdate):
            self._host_endpoints.add(msg.id.endpoint_id)
        elif isinstance(msg, pb.HostEndpointRemove):
            self._host_endpoints.discard(msg.id.endpoint_id)

    # ---------------------------------------------------------------------- programming
    def complete_deferred_work(self) -> None:
        self._program_workloads()
        if self._host_endpoints:
            # Reported once by name (the loop's UnsupportedFeature path), never silently ignored.
            raise UnsupportedFeature("host endpoints in BPF mode",
                                     f"{len(self._host_endpoints)} host endpoint(s) sent (e.g. "
                                     f"{min(self._host_endpoints)!r}): their policy is not enforced; "
                                     "use an iptables or nftables mode for host endpoints")

    def _uses_changed_policy(self, ep: pb.WorkloadEndpoint) -> bool:
        if self._dirty_profiles and not self._dirty_profiles.isdisjoint(ep.profile_ids):
            return True
        if self._dirty_policies:
            for ti in ep.tiers:
                for pid in (*ti.ingress_policies, *ti.egress_policies):
                    if from_proto.policy_key(pid) in self._dirty_policies:
                        return True
        return False

    def _program_workloads(self) -> None:
        if not (self._dirty_keys or self._dirty_policies or self._dirty_profiles):
            return
        winners: dict[str, tuple[WlKey, pb.WorkloadEndpoint]] = {}
        for key in sorted(self._endpoints):
            ep = self._endpoints[key]
            if ep.name and ep.name not in winners:
                winners[ep.name] = (key, ep)
        # An admin-down endpoint passes nothing (the *tables modes' endpoint chains drop all): its
        # interface is not programmed, so it is not READY, fib_approve refuses it and the *tables
        # drop it both ways, host traffic included.
        winners = {i: w for i, w in winners.items() if w[1].state == "active"}
        for iface in sorted(set(self._programmed) - set(winners)):
            self._driver.remove_workload(self.ip_version, iface)
            del self._programmed[iface]
        for iface, (key, ep) in winners.items():
            if key not in self._dirty_keys and iface in self._programmed and not self._uses_changed_policy(ep):
                continue
            try:
                want = self._workload_policy(ep)
            except Exception:
                log.exception("Workload endpoint policy could not be built; interface stays closed",
                              iface=iface, ip_version=self.ip_version)
                continue
            if self._programmed.get(iface) != want:
                self._driver.set_workload(self.ip_version, iface, want)
                self._programmed[iface] = want
        self._dirty_keys.clear()
        self._dirty_policies.clear()
        self._dirty_profiles.clear()

    def _workload_policy(self, ep: pb.WorkloadEndpoint) -> WorkloadPolicy:
        action = self._ctx.config.DefaultEndpointToHostAction
        return WorkloadPolicy(
            to_workload=from_proto.workload_policy_set(ep, self._policies, self._profiles, from_proto.INGRESS,
                                                       ep_to_host_action=action, rules_of=self._rules),
            from_workload=from_proto.workload_policy_set(ep, self._policies, self._profiles, from_proto.EGRESS,
                                                         ep_to_host_action=action, rules_of=self._rules))

    def on_devices_applied(self) -> None:
        ready = self._driver.ready_interfaces(self.ip_version) & frozenset(self._programmed)
        if ready != self._allowed:
            self._filter.update_chain(bpfmode.workload_allow_chain(self._ctx, ready))
            self._allowed = ready

    @property
    def allowed_interfaces(self) -> frozenset[str]:
        return self._allowed or frozenset()
