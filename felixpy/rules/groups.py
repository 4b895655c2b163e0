"""Policy groups: consecutive policies with one selector share a ``cali-gi-``/``cali-go-`` chain.

After Felix's ``PolicyGroup`` (``felix/rules/endpoints.go``) and the endpoint
manager's ``groupPolicies``.  Two endpoints that match one policy of a group
match all of it (same selector), so the group chain is shared and each
endpoint chain needs one jump per group instead of one per policy.

* The chain name is the prefix plus the first 20 characters (28 minus
  ``len("cali-gi-")``, for both backends) of the URL-safe unpadded base64
  SHA3-224 over the lines ``selector``, ``direction``, ``len(policies)`` and each
  policy's ``{Name: n, Namespace: ns, Kind: k}``, each followed by ``\\n``.
* A group with at most one non-staged policy is inlined (direct jumps).
* The group chain jumps to each non-staged policy in turn; in runs of 5 only
  the first of a run is unconditional, the rest require accept|pass clear,
  and between runs "accept|pass set ⇒ RETURN" ("Return on verdict").
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from felixpy.drivers.generictables.model import Chain, Jump, Match, Return, Rule
from felixpy.rules.names import (
    IPTABLES_MAX_CHAIN_NAME_LENGTH,
    POLICY_GROUP_INBOUND_PFX,
    POLICY_GROUP_OUTBOUND_PFX,
    POLICY_INBOUND_PFX,
    POLICY_OUTBOUND_PFX,
    PolicyID,
    policy_chain_name,
)

if TYPE_CHECKING:
    from felixpy.proto import felixbackend_pb2 as pb
    from felixpy.rules.context import RenderContext

__all__ = [
    "INBOUND",
    "MAX_POLICY_GROUP_UID_LENGTH",
    "OUTBOUND",
    "PolicyGroup",
    "TierPolicyGroups",
    "group_policies",
    "policy_group_chain",
    "tiers_from_proto",
]

INBOUND = "inbound"
OUTBOUND = "outbound"
MAX_POLICY_GROUP_UID_LENGTH = IPTABLES_MAX_CHAIN_NAME_LENGTH - len(POLICY_GROUP_INBOUND_PFX)
RETURN_STRIDE = 5


@dataclass(frozen=True, slots=True)
class PolicyGroup:
    direction: str  # INBOUND or OUTBOUND
    policies: tuple[PolicyID, ...]
    selector: str = ""

    def unique_id(self) -> str:
        h = hashlib.sha3_224()
        for line in (self.selector, self.direction, str(len(self.policies)),
                     *(p.go_string() for p in self.policies)):
            h.update(line.encode())
            h.update(b"\n")
        return base64.urlsafe_b64encode(h.digest()).decode().rstrip("=")[:MAX_POLICY_GROUP_UID_LENGTH]

    def chain_name(self) -> str:
        prefix = POLICY_GROUP_INBOUND_PFX if self.direction == INBOUND else POLICY_GROUP_OUTBOUND_PFX
        return prefix + self.unique_id()

    @property
    def non_staged(self) -> tuple[PolicyID, ...]:
        return tuple(p for p in self.policies if not p.staged)

    def should_be_inlined(self) -> bool:
        return len(self.non_staged) <= 1

    def has_non_staged_policies(self) -> bool:
        return bool(self.non_staged)


@dataclass(frozen=True, slots=True)
class TierPolicyGroups:
    """One tier as an endpoint chain sees it: its groups per direction and its default action."""

    name: str
    default_action: str = ""
    ingress: tuple[PolicyGroup, ...] = ()
    egress: tuple[PolicyGroup, ...] = ()


SelectorSource = Mapping[PolicyID, str] | Callable[[PolicyID], str]


def _selector(source: SelectorSource, policy: PolicyID) -> str:
    if callable(source):
        return source(policy)
    return source.get(policy, "")


def group_policies(policies: Sequence[PolicyID], selectors: SelectorSource, direction: str) -> tuple[PolicyGroup, ...]:
    """Split an ordered policy list into runs that share a selector (``Policy.original_selector``)."""
    groups: list[PolicyGroup] = []
    current: list[PolicyID] = []
    current_sel = ""
    for p in policies:
        sel = _selector(selectors, p)
        if current and sel != current_sel:
            groups.append(PolicyGroup(direction, tuple(current), current_sel))
            current = []
        if not current:
            current_sel = sel
        current.append(p)
    if current:
        groups.append(PolicyGroup(direction, tuple(current), current_sel))
    return tuple(groups)


def tiers_from_proto(tiers: Sequence[pb.TierInfo], selectors: SelectorSource) -> tuple[TierPolicyGroups, ...]:
    """Endpoint ``tiers`` (or ``untracked_tiers`` …) to grouped tiers, in order."""
    out = []
    for t in tiers:
        ingress = [PolicyID.from_proto(p) for p in t.ingress_policies]
        egress = [PolicyID.from_proto(p) for p in t.egress_policies]
        out.append(TierPolicyGroups(t.name, t.default_action, group_policies(ingress, selectors, INBOUND),
                                    group_policies(egress, selectors, OUTBOUND)))
    return tuple(out)


def policy_group_chain(ctx: RenderContext, group: PolicyGroup) -> Chain:
    """The group's chain (callers only program it when ``not group.should_be_inlined()``)."""
    marks = ctx.marks
    verdict = marks.pass_ | marks.accept
    prefix = POLICY_INBOUND_PFX if group.direction == INBOUND else POLICY_OUTBOUND_PFX
    rules: list[Rule] = []
    for count, policy in enumerate(group.non_staged):
        if count and count % RETURN_STRIDE == 0:
            rules.append(Rule(Match().mark_not_clear(verdict), Return(), ("Return on verdict",)))
        match = Match() if count % RETURN_STRIDE == 0 else Match().mark_clear(verdict)
        rules.append(Rule(match, Jump(policy_chain_name(prefix, policy, ctx.max_name_length))))
    return Chain(group.chain_name(), tuple(rules))
