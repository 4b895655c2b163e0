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
* Host endpoints (Felix's ``applyPolicyToDataIface``): the feed's HEPs are resolved to host
  interfaces exactly as the *tables modes resolve them
  (:func:`felixpy.managers.hostendpoints.resolve_host_endpoints`: by name, by expected IP, the
  lowest ID winning; a ``*`` HEP covers every host interface no specific HEP claims).  Every
  interface matching ``BPFDataIfacePattern`` gets programs, one no HEP covers with
  :data:`NO_HOST_ENDPOINT` (allow, but seen by the programs); TC ingress enforces the HEP's
  ingress policy (pre-DNAT tiers, then normal tiers + profiles for traffic to the host, forward
  tiers for forwarded traffic), TC egress its egress policy, through
  :meth:`~felixpy.drivers.bpfendpoints.api.BPFEndpointsAPI.set_host_endpoint`; the programs'
  failsafe checks come before policy.  A HEP with no policy denies everything but the failsafes
  (the policy program's end-of-profiles drop); an interface that stops being a HEP goes back to
  :data:`NO_HOST_ENDPOINT` (traffic open again), one that stops being a data interface is detached.  The ``*`` HEP's pre-DNAT and forward tiers also go into every workload's
  programs, in the inverse direction, its normal tiers never (Felix's current ``applyPolicyToWeps``:
  :func:`felixpy.bpf.from_proto.workload_policy_set`).  A specific HEP's untracked (doNotTrack) tiers
  in the ingress direction become its interface's XDP program (``HostEndpointPolicy.xdp``: deny drops
  before conntrack, allow skips TC's policy and Linux conntrack); their egress direction is the raw
  table's (the *tables host-endpoint and raw-egress policy managers, as Felix).  Floating IPs are
  reported unsupported by name (see docs/bpf.md).
* An endpoint's QoS DSCP goes with its policy to the driver (``WorkloadPolicy.dscp``,
  ``HostEndpointPolicy.dscp``), which writes it into the globals of the hook its traffic leaves by (a
  workload's TC ingress, a host endpoint's TC egress): the programs set it on the flows out of the
  cluster -- a host endpoint's for what the host itself sends (Felix's BPF DSCP; the *tables modes'
  ``cali-egress-dscp``).
* ``on_devices_applied`` (after the driver's apply) reads which interfaces are READY for this
  family and rewrites ``cali-to-wl-dispatch`` to accept exactly those, so the *tables admit an
  interface only once its programs are in place, and drop it again before they are detached.

Routes, interface sysctls and status stay with the *tables endpoint manager, which wiring runs
in BPF mode with its chains discarded (Felix's endpoint manager in BPF mode does the same).
This manager never touches the kernel.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any, TypeVar

import structlog

from felixpy.bpf import from_proto
from felixpy.drivers.bpfendpoints.api import BPFEndpointsAPI, HostEndpointPolicy, WorkloadPolicy
from felixpy.drivers.generictables.table import Table
from felixpy.errors import UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceAddrsUpdate
from felixpy.managers.dscp import endpoint_dscp
from felixpy.managers.endpoints import wl_key
from felixpy.managers.hostendpoints import ResolvedHEP, record_host_addrs, resolution_input, resolve_host_endpoints
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import bpfmode
from felixpy.rules.context import RenderContext
from felixpy.rules.names import ALL_INTERFACES

log = structlog.get_logger(__name__)

# A data interface that no host endpoint covers: both policy slots left empty, which the main program
# takes as allow on a host interface (Felix's applyPolicyToDataIface without a HEP) -- unlike an allow-all
# policy program, also for a mid-flow packet of a flow that predates the programs (tc.c skip_policy).
NO_HOST_ENDPOINT = HostEndpointPolicy(ingress=None, egress=None)

WlKey = tuple[str, str, str]
K = TypeVar("K")

_Uses = tuple[frozenset[from_proto.PolicyKey], frozenset[str], str]  # policies, profiles, interface
Refs = tuple[tuple[bytes, ...], tuple[str, ...]]
# An endpoint's refs with the policies and profiles they name (see BPFEndpointManager._shared).
_Shared = tuple[Refs, frozenset[from_proto.PolicyKey], frozenset[str]]


def _refs(ep: pb.WorkloadEndpoint) -> Refs:
    """What an endpoint's programs are built from, besides policies and profiles: its tiers (as bytes) and
    its profile ids."""
    return tuple(ti.SerializeToString() for ti in ep.tiers), tuple(ep.profile_ids)


@dataclasses.dataclass(frozen=True, slots=True)
class _Endpoint:
    """A workload endpoint as the manager keeps it between applies: what every pass reads (its interface,
    admin state, and the tiers and profiles its programs are built from, as bytes: the policy memo's key)
    and the update's wire bytes, parsed again only to build its programs.  Not the parsed message: that
    stays resident at ~2.4 KiB, 12 MiB at 5,000 workloads (#17)."""

    name: str
    state: str
    refs: Refs  # one object shared by every endpoint with equal refs (BPFEndpointManager._shared)
    wire: bytes

    @classmethod
    def of(cls, ep: pb.WorkloadEndpoint, refs: Refs) -> _Endpoint:
        # Interned: each proto access is a new string (5,000 interface names, 5,000 "active").
        return cls(sys.intern(ep.name), sys.intern(ep.state), refs, ep.SerializeToString())

    def parsed(self) -> pb.WorkloadEndpoint:
        return pb.WorkloadEndpoint.FromString(self.wire)


def _drop_user(index: dict[K, set[WlKey]], item: K, key: WlKey) -> None:
    users = index.get(item)
    if users is not None:
        users.discard(key)
        if not users:
            del index[item]


class BPFEndpointManager:
    update_types: tuple[type, ...] = (  # what on_update acts on (managers/base.py)
        pb.WorkloadEndpointUpdate, pb.WorkloadEndpointRemove, pb.ActivePolicyUpdate, pb.ActivePolicyRemove,
        pb.ActiveProfileUpdate, pb.ActiveProfileRemove, pb.HostEndpointUpdate, pb.HostEndpointRemove,
        IfaceAddrsUpdate)

    def __init__(self, ip_version: int, ctx: RenderContext, driver: BPFEndpointsAPI, *, filter: Table) -> None:
        self.ip_version = ip_version
        self._ctx = ctx
        self._driver = driver
        self._filter = filter
        self._endpoints: dict[WlKey, _Endpoint] = {}
        self._pending_eps: dict[WlKey, pb.WorkloadEndpoint | None] = {}  # since the last apply (None: removed)
        # Bodies held as wire bytes (from_proto.HeldMessage: a parsed one is ~25 times its size).
        self._policies: dict[from_proto.PolicyKey, from_proto.HeldMessage] = {}
        self._profiles: dict[str, from_proto.HeldMessage] = {}
        self._dirty_keys: set[WlKey] = set()
        # Policies/profiles changed since the last apply: only endpoints that use one are rebuilt.
        self._dirty_policies: set[from_proto.PolicyKey] = set()
        self._dirty_profiles: set[str] = set()
        self._rules = from_proto.RuleCache()  # each message's rules converted once, not per endpoint
        # Who uses what (Felix keeps the same index): a policy or profile change visits only its users.
        self._policy_users: dict[from_proto.PolicyKey, set[WlKey]] = {}
        self._profile_users: dict[str, set[WlKey]] = {}
        self._by_name: dict[str, set[WlKey]] = {}  # interface -> endpoints naming it (the lowest id wins)
        self._indexed: dict[WlKey, _Uses] = {}  # what each endpoint is indexed under in the three above
        self._unbuilt: set[WlKey] = set()  # winners whose policy could not be built: retried every pass
        self._programmed: dict[str, WorkloadPolicy] = {}  # iface -> what we gave the driver
        self._allowed: frozenset[str] | None = None
        # Host endpoints: the feed's, their resolution inputs, and the host interfaces' addresses.
        self._heps: dict[str, pb.HostEndpoint] = {}
        self._hep_inputs: dict[str, ResolvedHEP] = {}
        self._host_addrs: dict[str, frozenset[str]] = {}
        self._heps_dirty = True
        self._hep_programmed: dict[str, HostEndpointPolicy] = {}  # iface -> what we gave the driver
        self._data_iface = _data_iface_regex(ctx.config.BPFDataIfacePattern)
        self._floating_ips = ctx.config.FloatingIPs == "Enabled"
        self._nat_endpoints: set[WlKey] = set()  # endpoints with floating IPs (reported, not programmed)
        self._wildcard_seen: pb.HostEndpoint | None = None  # the '*' HEP the workload programs were built with
        # Endpoints with the same tiers and profiles get the same policy: built once, one shared object
        # (whose hash and IP-set walk are then computed once, not per endpoint and slot).  Valid while
        # no policy, profile or '*' HEP changes; emptied when one does.
        self._policy_memo: dict[Refs, WorkloadPolicy] = {}
        # Endpoints with equal refs share one refs tuple and one frozenset each of the policies and profiles
        # they name (at 5,000 workloads with 500 distinct policy sets, per-endpoint copies were ~9 MiB, #17).
        # Bounded as the policy memo: emptied when it outgrows the endpoints (those held keep their objects).
        self._shared_refs: dict[Refs, _Shared] = {}

    # ----------------------------------------------------------------------- updates
    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.WorkloadEndpointUpdate):
            self._pending_eps[wl_key(msg.id)] = msg.endpoint  # the latest version, taken at the apply
        elif isinstance(msg, pb.WorkloadEndpointRemove):
            self._pending_eps[wl_key(msg.id)] = None
        elif isinstance(msg, pb.ActivePolicyUpdate):
            key = from_proto.policy_key(msg.id)
            self._rules.forget(self._policies.get(key))
            self._policies[key] = from_proto.HeldMessage(msg.policy)
            self._dirty_policies.add(key)
        elif isinstance(msg, pb.ActivePolicyRemove):
            key = from_proto.policy_key(msg.id)
            self._rules.forget(self._policies.pop(key, None))
            self._dirty_policies.add(key)
        elif isinstance(msg, pb.ActiveProfileUpdate):
            self._rules.forget(self._profiles.get(msg.id.name))
            self._profiles[msg.id.name] = from_proto.HeldMessage(msg.profile)
            self._dirty_profiles.add(msg.id.name)
        elif isinstance(msg, pb.ActiveProfileRemove):
            self._rules.forget(self._profiles.pop(msg.id.name, None))
            self._dirty_profiles.add(msg.id.name)
        elif isinstance(msg, pb.HostEndpointUpdate):
            hid = msg.id.endpoint_id
            self._heps[hid] = msg.endpoint
            self._hep_inputs[hid] = resolution_input(hid, msg.endpoint)
            self._heps_dirty = True
        elif isinstance(msg, pb.HostEndpointRemove):
            self._heps.pop(msg.id.endpoint_id, None)
            self._hep_inputs.pop(msg.id.endpoint_id, None)
            self._heps_dirty = True
        elif isinstance(msg, IfaceAddrsUpdate):
            if record_host_addrs(self._host_addrs, msg, self._ctx.workload_prefixes):
                self._heps_dirty = True

    def _take_pending_endpoints(self) -> None:
        """Endpoint updates since the last apply, the latest per endpoint (a flood updates one several
        times between applies): stored, indexed by the policies, profiles and interface they name (left
        alone when those did not change), and marked dirty."""
        for key, ep in self._pending_eps.items():
            if ep is None:
                self._unindex(key)
                self._endpoints.pop(key, None)
                self._nat_endpoints.discard(key)
            else:
                old = self._endpoints.get(key)
                refs, pols, profs = self._shared(ep)
                held = _Endpoint.of(ep, refs)
                if old is None or old.name != held.name or old.refs != held.refs:
                    self._unindex(key)
                    self._index(key, (pols, profs, held.name))
                self._endpoints[key] = held
                if ep.ipv4_nat or ep.ipv6_nat:
                    self._nat_endpoints.add(key)
                else:
                    self._nat_endpoints.discard(key)
            self._dirty_keys.add(key)
        self._pending_eps.clear()

    def _shared(self, ep: pb.WorkloadEndpoint) -> _Shared:
        """The endpoint's refs and the policies and profiles they name, as the objects every endpoint with
        equal refs shares."""
        refs = _refs(ep)
        got = self._shared_refs.get(refs)
        if got is None:
            if len(self._shared_refs) > 2 * len(self._endpoints) + 64:
                self._shared_refs.clear()
            pols = frozenset(from_proto.policy_key(pid)
                             for ti in ep.tiers for pid in (*ti.ingress_policies, *ti.egress_policies))
            got = self._shared_refs[refs] = (refs, pols, frozenset(ep.profile_ids))
        return got

    def _index(self, key: WlKey, uses: _Uses) -> None:
        pols, profs, name = uses
        self._indexed[key] = uses
        for pk in pols:
            self._policy_users.setdefault(pk, set()).add(key)
        for pr in profs:
            self._profile_users.setdefault(pr, set()).add(key)
        if name:
            self._by_name.setdefault(name, set()).add(key)

    def _unindex(self, key: WlKey) -> None:
        uses = self._indexed.pop(key, None)
        if uses is None:
            return
        pols, profs, name = uses
        for pk in pols:
            _drop_user(self._policy_users, pk, key)
        for pr in profs:
            _drop_user(self._profile_users, pr, key)
        if name:
            _drop_user(self._by_name, name, key)

    # ---------------------------------------------------------------------- programming
    def render_ahead(self) -> None:
        """Before the first ``InSync`` (managers/base.py): the endpoints that arrived so far taken in
        (held, indexed by what they use, marked dirty); their policy sets are built by the apply.  Only
        this part: it costs what arrived, where building walks every endpoint for the interfaces'
        winners, which per batch of a flooding feed would cost the endpoints times the batches.  At
        1,000 dual-stack workloads it was ~17 ms of the first apply."""
        self._take_pending_endpoints()

    def complete_deferred_work(self) -> None:
        self._take_pending_endpoints()
        if self._dirty_policies or self._dirty_profiles:
            self._heps_dirty = self._heps_dirty or bool(self._heps)
        wildcard = self._wildcard()
        if self._dirty_policies or self._dirty_profiles or wildcard is not self._wildcard_seen or \
                len(self._policy_memo) > 2 * len(self._endpoints) + 64:
            self._policy_memo.clear()
        if wildcard is not self._wildcard_seen or (wildcard is not None and self._uses_dirty_policy(
                (*wildcard.pre_dnat_tiers, *wildcard.forward_tiers))):
            # The '*' HEP's pre-DNAT and forward tiers are part of every workload's programs.
            self._dirty_keys.update(self._endpoints)
            self._wildcard_seen = wildcard
        self._program_workloads()
        self._program_host_endpoints()
        # Reported once each by name (the loop's UnsupportedFeature path), never silently ignored.
        unsupported = self._unsupported()
        if len(unsupported) == 1:
            raise unsupported[0]
        if unsupported:
            raise ExceptionGroup("features unsupported in BPF mode", unsupported)

    def _unsupported(self) -> list[UnsupportedFeature]:
        out = []
        if self._floating_ips and self._nat_endpoints:
            out.append(UnsupportedFeature(
                "floating IPs in BPF mode",
                "Felix's eBPF dataplane does not support floating IPs (Calico docs, 'Enable the eBPF "
                "dataplane', not supported: floating IPs; projectcalico/calico#5251): their NAT is not programmed"))
        return out

    def _uses_dirty_policy(self, tiers: Any) -> bool:
        if self._dirty_policies:
            for ti in tiers:
                for pid in (*ti.ingress_policies, *ti.egress_policies):
                    if from_proto.policy_key(pid) in self._dirty_policies:
                        return True
        return False

    def _wildcard(self) -> pb.HostEndpoint | None:
        """The ``*`` host endpoint that applies (the lowest ID, as resolution picks it), if any."""
        ids = sorted(hid for hid, inp in self._hep_inputs.items() if inp.all_interfaces)
        return self._heps[ids[0]] if ids else None

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
        winners: dict[str, tuple[WlKey, _Endpoint]] = {}
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

    def _build(self, iface: str, key: WlKey, held: _Endpoint) -> None:
        ep = held.parsed()
        try:
            want = self._workload_policy(ep)
        except Exception:
            log.exception("Workload endpoint policy could not be built; interface stays closed",
                          iface=iface, ip_version=self.ip_version)
            if iface not in self._programmed:
                self._unbuilt.add(key)  # retried on every pass, as an unprogrammed winner always was
            return
        self._unbuilt.discard(key)
        dscp = endpoint_dscp(ep, iface)
        if dscp is not None:
            want = dataclasses.replace(want, dscp=dscp)
        if self._programmed.get(iface) != want:
            self._driver.set_workload(self.ip_version, iface, want)
            self._programmed[iface] = want

    def _workload_policy(self, ep: pb.WorkloadEndpoint) -> WorkloadPolicy:
        # Everything of the endpoint the policy depends on (the rest is the policies, profiles and '*'
        # HEP, whose changes empty the memo): equal bytes, equal tiers (as _Endpoint.refs).
        key = _refs(ep)
        got = self._policy_memo.get(key)
        if got is not None:
            return got
        wildcard = self._wildcard_seen
        got = WorkloadPolicy(
            to_workload=from_proto.workload_policy_set(ep, self._policies, self._profiles, from_proto.INGRESS,
                                                       host_ep=wildcard, rules_of=self._rules),
            from_workload=from_proto.workload_policy_set(ep, self._policies, self._profiles, from_proto.EGRESS,
                                                         host_ep=wildcard, rules_of=self._rules))
        self._policy_memo[key] = got
        return got

    # ----------------------------------------------------------------- host endpoints
    def _program_host_endpoints(self) -> None:
        if not self._heps_dirty:
            return
        self._heps_dirty = False
        winners, _shadowed = resolve_host_endpoints(self._hep_inputs, self._host_addrs)
        wildcard = winners.get(ALL_INTERFACES)
        # Every data interface gets programs (Felix's applyPolicyToDataIface); one that no host endpoint
        # covers (None) gets NO_HOST_ENDPOINT: all traffic allowed, but seen by the programs (conntrack,
        # the source and blackhole checks, the FIB).
        want: dict[str, str | None] = {}
        for iface in self._host_addrs:
            if self._data_iface(iface):
                want[iface] = winners.get(iface, wildcard)
        for iface in sorted(set(self._hep_programmed) - set(want)):
            log.info("Host interface is no longer a data interface; its programs go", iface=iface,
                     ip_version=self.ip_version)
            self._driver.remove_host_endpoint(self.ip_version, iface)
            del self._hep_programmed[iface]
        for iface, hid in sorted(want.items()):
            if hid is None:
                if self._hep_programmed.get(iface) != NO_HOST_ENDPOINT:
                    self._driver.set_host_endpoint(self.ip_version, iface, NO_HOST_ENDPOINT)
                    self._hep_programmed[iface] = NO_HOST_ENDPOINT
                continue
            try:
                # Untracked policy only on a specific host endpoint's interface: Felix ignores it on '*'.
                pol = self._host_policy(self._heps[hid], untracked=iface in winners)
                dscp = endpoint_dscp(self._heps[hid], hid)
                if dscp is not None:
                    pol = dataclasses.replace(pol, dscp=dscp)
            except Exception:
                log.exception("Host endpoint policy could not be built; interface left as it was",
                              host_endpoint=hid, iface=iface, ip_version=self.ip_version)
                continue
            if self._hep_programmed.get(iface) != pol:
                self._driver.set_host_endpoint(self.ip_version, iface, pol)
                self._hep_programmed[iface] = pol

    def _host_policy(self, hep: pb.HostEndpoint, *, untracked: bool) -> HostEndpointPolicy:
        return HostEndpointPolicy(
            ingress=from_proto.host_policy_set(hep, self._policies, self._profiles, from_proto.INGRESS),
            egress=from_proto.host_policy_set(hep, self._policies, self._profiles, from_proto.EGRESS),
            xdp=from_proto.xdp_policy_set(hep, self._policies) if untracked else None)

    @property
    def host_endpoint_interfaces(self) -> dict[str, HostEndpointPolicy]:
        return dict(self._hep_programmed)

    def on_devices_applied(self) -> None:
        ready = self._driver.ready_interfaces(self.ip_version) & frozenset(self._programmed)
        if ready != self._allowed:
            self._filter.update_chain(bpfmode.workload_allow_chain(self._ctx, ready))
            self._allowed = ready

    @property
    def allowed_interfaces(self) -> frozenset[str]:
        return self._allowed or frozenset()


def _data_iface_regex(pattern: str) -> Any:
    """``BPFDataIfacePattern`` as a predicate; a pattern that does not compile matches nothing (logged)."""
    try:
        rx = re.compile(pattern)
    except re.error as e:
        log.error("BPFDataIfacePattern does not compile; no host interface gets programs", pattern=pattern,
                  error=str(e))
        return lambda _name: False
    return lambda name: rx.match(name) is not None
