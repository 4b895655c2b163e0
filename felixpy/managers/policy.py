"""Policy manager (per IP family): active policies and profiles → their chains.

Felix's ``policyManager``: an ``ActivePolicyUpdate`` renders the policy's
``cali-pi-``/``cali-po-`` chains and hands them to the raw, mangle and filter
tables; a profile's ``cali-pri-``/``cali-pro-`` chains go to filter and mangle.
The tables only *record* (no kernel I/O here) and program a chain only while an
endpoint chain refers to it, so pushing to every table costs nothing where the
chain is unused (untracked policies end up in raw, pre-DNAT ones in mangle,
the rest in filter — wherever an endpoint references them).

Rendering happens in ``on_update`` (proportional to the message, as Felix);
a rule that cannot be rendered for this family is dropped by the renderer with
a log line naming the policy and rule index, never the whole policy.  An update
whose policy (or profile) is byte-for-byte the one last rendered for that ID — a
resend, e.g. after a resync — is not rendered again: the tables already hold
its chains.
"""

from __future__ import annotations

from typing import Any

import structlog

from felixpy.drivers.generictables.table import Table
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyID, ProfileID, RuleRenderer

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

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.ActivePolicyUpdate):
            self._on_policy(msg)
        elif isinstance(msg, pb.ActivePolicyRemove):
            pid = PolicyID.from_proto(msg.id)
            self._policy_rendered.pop(pid, None)
            self._remove(self._policy_chains.pop(pid, []), (self._raw, self._mangle, self._filter))
        elif isinstance(msg, pb.ActiveProfileUpdate):
            self._on_profile(msg)
        elif isinstance(msg, pb.ActiveProfileRemove):
            self._profile_rendered.pop(msg.id.name, None)
            self._remove(self._profile_chains.pop(msg.id.name, []), (self._mangle, self._filter))

    def _on_policy(self, msg: pb.ActivePolicyUpdate) -> None:
        pid = PolicyID.from_proto(msg.id)
        content = msg.policy.SerializeToString(deterministic=True)
        if self._policy_rendered.get(pid) == content:
            return  # unchanged: its chains are in the tables already
        self._policy_rendered.pop(pid, None)  # until this render succeeds
        try:
            chains = self._r.policy_chains(pid, msg.policy)
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

    def _on_profile(self, msg: pb.ActiveProfileUpdate) -> None:
        content = msg.profile.SerializeToString(deterministic=True)
        if self._profile_rendered.get(msg.id.name) == content:
            return
        self._profile_rendered.pop(msg.id.name, None)
        try:
            inbound, outbound = self._r.profile_chains(ProfileID(msg.id.name), msg.profile)
        except Exception:
            log.exception("Failed to render profile; keeping its previous chains", profile=msg.id.name,
                          ip_version=self.ip_version)
            return
        for table in (self._mangle, self._filter):
            table.update_chains([inbound, outbound])
        self._profile_chains[msg.id.name] = [inbound.name, outbound.name]
        self._profile_rendered[msg.id.name] = content

    @staticmethod
    def _remove(names: list[str], tables: tuple[Table, ...]) -> None:
        for table in tables:
            for name in names:
                table.remove_chain_by_name(name)

    def complete_deferred_work(self) -> None:
        pass  # the tables do the work in apply()
