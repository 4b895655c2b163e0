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
  whose policy set changed.  A policy or profile update rebuilds only the endpoints that use it
  (found through a policy/profile -> endpoints index, as Felix keeps; no scan of every endpoint),
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

from typing import Any, TypeVar

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
K = TypeVar("K")


def _key(wid: pb.WorkloadEndpointID) -> WlKey:
    return (wid.orchestrator_id, wid.workload_id, wid.endpoint_id)


def _drop_user(index: dict[K, set[WlKey]], item: K, key: WlKey) -> None:
    users = index.get(item)
    if users is not None:
        users.discard(key)
        if not users:
            del index[item]


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
        # Who uses what (Felix keeps the same index): a policy or profile change visits only its users.
        self._policy_users: dict[from_proto.PolicyKey, set[WlKey]] = {}
        self._profile_users: dict[str, set[WlKey]] = {}
        self._by_name: dict[str, set[WlKey]] = {}  # interface -> endpoints naming it (the lowest id wins)
        self._unbuilt: set[WlKey] = set()  # winners whose policy could not be built: retried every pass
        self._programmed: dict[str, WorkloadPolicy] = {}  # iface -> what we gave the driver
        self._allowed: frozenset[str] | None = None
        self._host_endpoints: set[str] = set()  # ids the feed sent; BPF mode does not attach them yet

    # ----------------------------------------------------------------------- updates
    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.WorkloadEndpointUpdate):
            key = _key(msg.id)
            self._unindex(key)
            self._endpoints[key] = msg.endpoint
            self._index(key, msg.endpoint)
            self._dirty_keys.add(key)
        elif isinstance(msg, pb.WorkloadEndpointRemove):
            key = _key(msg.id)
            self._unindex(key)
            self._endpoints.pop(key, None)
            self._dirty_keys.add(key)
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

    @staticmethod
    def _uses(ep: pb.WorkloadEndpoint) -> tuple[set[from_proto.PolicyKey], set[str]]:
        pols = {from_proto.policy_key(pid) for ti in ep.tiers for pid in (*ti.ingress_policies, *ti.egress_policies)}
        return pols, set(ep.profile_ids)

    def _index(self, key: WlKey, ep: pb.WorkloadEndpoint) -> None:
        pols, profs = self._uses(ep)
        for pk in pols:
            self._policy_users.setdefault(pk, set()).add(key)
        for pr in profs:
            self._profile_users.setdefault(pr, set()).add(key)
        if ep.name:
            self._by_name.setdefault(ep.name, set()).add(key)

    def _unindex(self, key: WlKey) -> None:
        ep = self._endpoints.get(key)
        if ep is None:
            return
        pols, profs = self._uses(ep)
        for pk in pols:
            _drop_user(self._policy_users, pk, key)
        for pr in profs:
            _drop_user(self._profile_users, pr, key)
        if ep.name:
            _drop_user(self._by_name, ep.name, key)

    # ---------------------------------------------------------------------- programming
    def complete_deferred_work(self) -> None:
        self._program_workloads()
        if self._host_endpoints:
            # Reported once by name (the loop's UnsupportedFeature path), never silently ignored.
            raise UnsupportedFeature("host endpoints in BPF mode",
                                     f"{len(self._host_endpoints)} host endpoint(s) sent (e.g. "
                                     f"{min(self._host_endpoints)!r}): their policy is not enforced; "
                                     "use an iptables or nftables mode for host endpoints")

    def _program_workloads(self) -> None:
        if not (self._dirty_keys or self._dirty_policies or self._dirty_profiles):
            return
        if self._dirty_keys:
            self._program_all()
        else:
            self._program_users_of_changed_policy()
        self._dirty_keys.clear()
        self._dirty_policies.clear()
        self._dirty_profiles.clear()

    def _program_all(self) -> None:
        """Endpoints changed: work out every interface's winner again (the lower id wins)."""
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
        changed = self._users_of_changed_policy()
        self._unbuilt.clear()
        for iface, (key, ep) in winners.items():
            if key not in self._dirty_keys and iface in self._programmed and key not in changed:
                continue
            self._build(iface, key, ep)

    def _program_users_of_changed_policy(self) -> None:
        """Only policies/profiles changed: the winners don't move; visit just their users (and any
        winner whose policy could not be built before)."""
        for key in sorted(self._users_of_changed_policy() | self._unbuilt):
            ep = self._endpoints.get(key)
            if ep is None or not ep.name or ep.state != "active" or min(self._by_name[ep.name]) != key:
                continue
            self._build(ep.name, key, ep)

    def _users_of_changed_policy(self) -> set[WlKey]:
        keys: set[WlKey] = set()
        for pk in self._dirty_policies:
            keys |= self._policy_users.get(pk, set())
        for pr in self._dirty_profiles:
            keys |= self._profile_users.get(pr, set())
        return keys

    def _build(self, iface: str, key: WlKey, ep: pb.WorkloadEndpoint) -> None:
        try:
            want = self._workload_policy(ep)
        except Exception:
            log.exception("Workload endpoint policy could not be built; interface stays closed",
                          iface=iface, ip_version=self.ip_version)
            if iface not in self._programmed:
                self._unbuilt.add(key)  # retried on every pass, as an unprogrammed winner always was
            return
        self._unbuilt.discard(key)
        if self._programmed.get(iface) != want:
            self._driver.set_workload(self.ip_version, iface, want)
            self._programmed[iface] = want

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
