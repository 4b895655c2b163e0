"""Policy manager (per IP family): active policies and profiles → their chains.

Felix's ``policyManager``: an ``ActivePolicyUpdate`` renders the policy's
``cali-pi-``/``cali-po-`` chains and hands them to the raw, mangle and filter
tables; a profile's ``cali-pri-``/``cali-pro-`` chains go to filter and mangle.
The tables only *record* (no kernel I/O here) and program a chain only while an
endpoint chain refers to it, so pushing to every table costs nothing where the
chain is unused (untracked policies end up in raw, pre-DNAT ones in mangle,
the rest in filter — wherever an endpoint references them).

``on_update`` only records the latest policy (or profile) per ID; rendering waits for
``complete_deferred_work``, just before the apply.  Felix renders in ``OnUpdate``; here a
batch that updates one policy many times (a churning calc graph, a flood) renders it once,
in its final form — the chains the tables hold after the apply are the same either way.
A rule that cannot be rendered for this family is dropped by the renderer with a log
line naming the policy and rule index, never the whole policy.  An update whose policy
(or profile) is byte-for-byte the one last rendered for that ID — a resend, e.g. after a
resync — is not rendered again: the tables already hold its chains.

BPF mode runs :class:`RawEgressPolicyManager` instead (Felix's ``newRawEgressPolicyManager``):
the programs enforce every policy but untracked egress, which stays in the raw table over Linux IP
sets.  It renders only untracked policies, keeps only their ``cali-po-`` chains (raw, beside the
host-endpoint manager's ``cali-th-`` chains that jump to them), ignores profiles, and hands the
names of the IP sets those chains match to the family's Linux IP-set dataplane as its filter
(:class:`~felixpy.drivers.ipsets_api.IPSetFilter`): only those sets reach the kernel.
"""

from __future__ import annotations

from typing import Any

import structlog

from felixpy.drivers.generictables.model import Chain
from felixpy.drivers.generictables.table import Table
from felixpy.drivers.ipsets_api import IPSetFilter
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyID, ProfileID, RuleRenderer
from felixpy.rules.names import POLICY_OUTBOUND_PFX

log = structlog.get_logger(__name__)


class PolicyManager:
    def __init__(self, ip_version: int, renderer: RuleRenderer, *, raw: Table, mangle: Table,
                 filter: Table) -> None:
        self.ip_version = ip_version
        self._r = renderer
        self._raw, self._mangle, self._filter = raw, mangle, filter
        self._policy_chains: dict[PolicyID, list[str]] = {}
        self._profile_chains: dict[str, list[str]] = {}
        # The serialised content last rendered per ID (deterministic: equal messages, equal bytes).
        self._policy_rendered: dict[PolicyID, bytes] = {}
        self._profile_rendered: dict[str, bytes] = {}
        # The latest update per ID since the last complete_deferred_work (insertion order kept: the
        # renders, and so their log lines, come in the order the IDs first changed).
        self._pending_policies: dict[PolicyID, pb.Policy] = {}
        self._pending_profiles: dict[str, pb.Profile] = {}

    update_types: tuple[type, ...] = (pb.ActivePolicyUpdate, pb.ActivePolicyRemove, pb.ActiveProfileUpdate, pb.ActiveProfileRemove)  # what on_update acts on (managers/base.py)

    def render_ahead(self) -> None:
        """Before InSync (managers/base.py): complete_deferred_work() only renders chains, so all of it."""
        self.complete_deferred_work()

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.ActivePolicyUpdate):
            self._pending_policies[PolicyID.from_proto(msg.id)] = msg.policy
        elif isinstance(msg, pb.ActivePolicyRemove):
            pid = PolicyID.from_proto(msg.id)
            self._pending_policies.pop(pid, None)
            self._policy_rendered.pop(pid, None)
            self._remove(self._policy_chains.pop(pid, []), (self._raw, self._mangle, self._filter))
        elif isinstance(msg, pb.ActiveProfileUpdate):
            self._pending_profiles[msg.id.name] = msg.profile
        elif isinstance(msg, pb.ActiveProfileRemove):
            self._pending_profiles.pop(msg.id.name, None)
            self._profile_rendered.pop(msg.id.name, None)
            self._remove(self._profile_chains.pop(msg.id.name, []), (self._mangle, self._filter))

    def _render_policy(self, pid: PolicyID, policy: pb.Policy) -> None:
        content = policy.SerializeToString(deterministic=True)
        if self._policy_rendered.get(pid) == content:
            return  # unchanged: its chains are in the tables already
        self._policy_rendered.pop(pid, None)  # until this render succeeds
        try:
            chains = self._r.policy_chains(pid, policy)
        except Exception:
            # The renderer drops bad rules itself; anything else is a bug, but one policy
            # must not take down the rest (its chains stay as they were).
            log.exception("Failed to render policy; keeping its previous chains", policy=pid.describe(),
                          ip_version=self.ip_version)
            return
        names = [c.name for c in chains]
        self._remove([n for n in self._policy_chains.get(pid, []) if n not in names],
                     (self._raw, self._mangle, self._filter))
        for table in (self._raw, self._mangle, self._filter):
            table.update_chains(chains)
        self._policy_chains[pid] = names
        self._policy_rendered[pid] = content

    def _render_profile(self, name: str, profile: pb.Profile) -> None:
        content = profile.SerializeToString(deterministic=True)
        if self._profile_rendered.get(name) == content:
            return
        self._profile_rendered.pop(name, None)
        try:
            inbound, outbound = self._r.profile_chains(ProfileID(name), profile)
        except Exception:
            log.exception("Failed to render profile; keeping its previous chains", profile=name,
                          ip_version=self.ip_version)
            return
        for table in (self._mangle, self._filter):
            table.update_chains([inbound, outbound])
        self._profile_chains[name] = [inbound.name, outbound.name]
        self._profile_rendered[name] = content

    @staticmethod
    def _remove(names: list[str], tables: tuple[Table, ...]) -> None:
        for table in tables:
            for name in names:
                table.remove_chain_by_name(name)

    def complete_deferred_work(self) -> None:
        """Render what changed since the last call (the tables program it in apply())."""
        policies, self._pending_policies = self._pending_policies, {}
        for pid, policy in policies.items():
            self._render_policy(pid, policy)
        profiles, self._pending_profiles = self._pending_profiles, {}
        for name, profile in profiles.items():
            self._render_profile(name, profile)


class RawEgressPolicyManager:
    """BPF mode's policy manager: untracked policies' egress chains in raw, and the Linux IP-set filter.

    Felix's ``policyManager`` with ``rawEgressOnly``: a policy that is not untracked has no chains here
    (an update that makes it so removes them); an untracked one keeps its ``cali-po-`` chain only.
    The union of the sets those chains match is the IP-set filter, set at the first
    ``complete_deferred_work`` (empty at start of day: every Calico set leaves the kernel) and again
    whenever it changes.  Rendering is deferred and skipped for a resend, as in :class:`PolicyManager`.
    """

    update_types: tuple[type, ...] = (pb.ActivePolicyUpdate, pb.ActivePolicyRemove)  # what on_update acts on (managers/base.py)
    writes_ip_sets = True  # complete_deferred_work() sets the IP-set filter: run before the write starts (managers/base.py)

    def __init__(self, ip_version: int, renderer: RuleRenderer, *, raw: Table, ipsets: IPSetFilter) -> None:
        self.ip_version = ip_version
        self._r, self._raw, self._ipsets = renderer, raw, ipsets
        # The latest update per ID since the last complete_deferred_work; None: removed.
        self._pending: dict[PolicyID, pb.Policy | None] = {}
        self._chains: dict[PolicyID, list[str]] = {}
        self._rendered: dict[PolicyID, bytes] = {}
        self._needed: dict[PolicyID, frozenset[str]] = {}  # IP-set names each policy's chains match
        self._filter_dirty = True  # start of day: the filter is set even with no policy

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.ActivePolicyUpdate):
            self._pending[PolicyID.from_proto(msg.id)] = msg.policy
        elif isinstance(msg, pb.ActivePolicyRemove):
            self._pending[PolicyID.from_proto(msg.id)] = None

    def complete_deferred_work(self) -> None:
        pending, self._pending = self._pending, {}
        for pid, policy in pending.items():
            if policy is not None and policy.untracked:
                self._render(pid, policy)
            else:
                self._clean_up(pid)
        if self._filter_dirty:
            needed = frozenset().union(*self._needed.values())
            log.debug("Linux IP sets for untracked egress policy", ip_version=self.ip_version, num_sets=len(needed))
            self._ipsets.set_filter(needed)
            self._filter_dirty = False

    def _render(self, pid: PolicyID, policy: pb.Policy) -> None:
        content = policy.SerializeToString(deterministic=True)
        if self._rendered.get(pid) == content:
            return
        self._rendered.pop(pid, None)
        try:
            chains = [c for c in self._r.policy_chains(pid, policy) if c.name.startswith(POLICY_OUTBOUND_PFX)]
        except Exception:
            log.exception("Failed to render untracked policy; keeping its previous chains", policy=pid.describe(),
                          ip_version=self.ip_version)
            return
        names = [c.name for c in chains]
        for stale in self._chains.get(pid, []):
            if stale not in names:
                self._raw.remove_chain_by_name(stale)
        self._raw.update_chains(chains)
        self._chains[pid] = names
        self._set_needed(pid, _ip_set_names(chains))
        self._rendered[pid] = content

    def _clean_up(self, pid: PolicyID) -> None:
        self._rendered.pop(pid, None)
        for name in self._chains.pop(pid, []):
            self._raw.remove_chain_by_name(name)
        self._set_needed(pid, frozenset())

    def _set_needed(self, pid: PolicyID, names: frozenset[str]) -> None:
        if self._needed.get(pid, frozenset()) == names:
            return
        if names:
            self._needed[pid] = names
        else:
            self._needed.pop(pid, None)
        self._filter_dirty = True


def _ip_set_names(chains: list[Chain]) -> frozenset[str]:
    return frozenset(name for c in chains for r in c.rules for name in r.match.ip_set_names())
