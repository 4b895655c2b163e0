"""A :class:`~.evaluate.Trace` in an operator's terms: dispatch, endpoint, tiers, policies, the deciding rule.

What the kernel tells us, and how it maps back (felixpy renders it all, see
:mod:`felixpy.rules`):

* chain names carry the role: ``cali-from-wl-dispatch[-…]``/``cali-to-wl-dispatch[-…]``
  (and nftables' verdict maps of the same names) dispatch, ``cali-tw-``/``cali-fw-``
  (workload) and ``cali-th-``/``cali-fh-``/``-thfw-``/``-fhfw-`` (host) are endpoint
  chains, ``cali-pi-``/``cali-po-`` policies, ``cali-pri-``/``cali-pro-`` profiles,
  ``cali-gi-``/``cali-go-`` policy groups; nftables prefixes each with its layer;
* a policy chain name is ``<kind>/[<ns>/]<name>`` — hashed (``cali-pi-_<hash>``) when
  longer than iptables' 28 characters — but its **first rule's comment** always holds
  ``<Kind> [<ns>/]<name> ingress|egress``, which is where the name is read from (cut
  at 256 characters in iptables, 128 in nftables; for a hashed chain whose first rule
  has no comment the chain name is all there is, and is shown as such);
* the endpoint chain's ``Start of tier <t>`` comments name the tier of each policy
  jump that follows; its ``Return if policy accepted`` / ``Start of tier`` rules give the
  accept and pass mark bits;
* a policy's rule index counts the proto rules before the deciding one (each ends in a
  RETURN, DROP/REJECT or LOG rule).  Rules that were not rendered for this IP family
  are not in the kernel, so the index counts only this family's rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from felixpy.drivers.generictables import model as m
from felixpy.explain.evaluate import SetMatch, Step, Trace
from felixpy.explain.ruleset import KRule, Ruleset

_ENDPOINT_PFX = ("cali-tw-", "cali-fw-", "cali-th-", "cali-fh-", "cali-thfw-", "cali-fhfw-")
_POLICY_PFX = {"cali-pi-": "policy", "cali-po-": "policy", "cali-pri-": "profile", "cali-pro-": "profile"}
_LAYERS = ("filter-", "nat-", "mangle-", "raw-")
_TABLES = ("filter", "nat", "mangle", "raw", "security")
_PROTO_RULE_END = (m.Return, m.Drop, m.Reject, m.Log)


def bare(chain: str) -> str:
    """``filter/cali-tw-x`` or ``filter-cali-tw-x`` → ``cali-tw-x``."""
    table, sep, rest = chain.partition("/")
    name = rest if sep and table in _TABLES else chain
    for layer in _LAYERS:
        if name.startswith(layer):
            return name[len(layer):]
    return name


def role(chain: str) -> str:
    b = bare(chain)
    if not b.startswith("cali-"):
        return "hook" if b.isupper() else "other"
    if "dispatch" in b or b in ("cali-to-host-endpoint", "cali-from-host-endpoint", "cali-to-hep-forward",
                                "cali-from-hep-forward"):
        return "dispatch"
    if b.startswith(_ENDPOINT_PFX):
        return "endpoint"
    for pfx, r in _POLICY_PFX.items():
        if b.startswith(pfx):
            return r
    if b.startswith(("cali-gi-", "cali-go-")):
        return "group"
    return "felixpy"


@dataclass(slots=True)
class PolicyVisit:
    kind: str            # "policy" | "profile"
    chain: str
    name: str            # as the first-rule comment (or the chain name) gives it
    tier: str
    direction: str
    outcome: str = "no-match"   # "allow" | "deny" | "pass" | "no-match"
    rule_index: int | None = None
    kernel_rule: KRule | None = None

    def json(self, display: str) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "tier": self.tier or None,
                               "direction": self.direction, "chain": display, "outcome": self.outcome}
        if self.kernel_rule is not None:
            out["rule_index"] = self.rule_index
            out["kernel_rule"] = {"position": self.kernel_rule.position, "hash": self.kernel_rule.hash}
        return out


@dataclass(slots=True)
class Explanation:
    packet: str
    mode: str
    ip_version: int
    direction: str
    verdict: str
    hook_chains: list[dict[str, Any]] = field(default_factory=list)
    dispatch: list[str] = field(default_factory=list)
    endpoints: list[str] = field(default_factory=list)
    tiers: list[str] = field(default_factory=list)
    policies: list[dict[str, Any]] = field(default_factory=list)
    decided_by: dict[str, Any] | None = None
    ip_sets: list[dict[str, str]] = field(default_factory=list)
    path: list[dict[str, Any]] = field(default_factory=list)
    uncertain: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "mode": self.mode, "ip_version": self.ip_version, "packet": self.packet,
                "direction": self.direction, "hook_chains": self.hook_chains, "dispatch": self.dispatch,
                "endpoints": self.endpoints, "tiers": self.tiers, "policies": self.policies,
                "decided_by": self.decided_by, "ip_sets": self.ip_sets, "path": self.path,
                "uncertain": self.uncertain, "notes": self.notes}


def policy_name(rules: list[KRule], chain: str) -> tuple[str, str]:
    """(name, direction) from the first rule's comment, else from the chain name."""
    if rules:
        for c in rules[0].comments:
            stem, _, way = c.rpartition(" ")
            if way in ("ingress", "egress") and stem:
                return stem, way
    b = bare(chain)
    for pfx in _POLICY_PFX:
        if b.startswith(pfx):
            way = "ingress" if pfx in ("cali-pi-", "cali-pri-") else "egress"
            suffix = b[len(pfx):]
            if suffix.startswith("_"):
                return f"{b} (hashed chain name; the kernel holds no other name for it)", way
            return suffix, way
    return b, ""


def rule_index(rules: list[KRule], position: int) -> int:
    """The policy rule (0-based) the kernel rule at ``position`` belongs to."""
    return sum(1 for r in rules[:position - 1] if isinstance(r.action, _PROTO_RULE_END))


def _sets_bits(a: object) -> int:
    return a.mark if isinstance(a, m.SetMaskedMark) else a.mark if isinstance(a, m.SetMark) else 0


def _learn_bits(rules: list[KRule]) -> tuple[int, int]:
    """(accept bit, pass bit) from an endpoint chain's own rules (0 when it has no such rule)."""
    accept = pass_ = 0
    for r in rules:
        if any(c.startswith("Return if p") for c in r.comments):
            for c in r.criteria:
                if isinstance(c, m.MarkMatchesWithMask) and not c.negate:
                    accept = c.mask
        if any(c.startswith("Start of tier") for c in r.comments) and isinstance(r.action, m.SetMaskedMark):
            pass_ = r.action.mask
    return accept, pass_


def explain(rs: Ruleset, trace: Trace) -> Explanation:  # noqa: C901
    ex = Explanation(trace.packet.describe(), rs.backend, rs.ip_version, trace.direction, trace.verdict,
                     uncertain=list(dict.fromkeys(trace.uncertain)), notes=list(rs.notes))
    accept_bit = pass_bit = 0
    tier = ""
    open_visits: list[tuple[int, PolicyVisit]] = []   # (depth, visit) for policy chains being run
    visits: list[PolicyVisit] = []
    last_rule: tuple[str, KRule] | None = None
    filter_last: tuple[str, KRule] | None = None
    sets: list[SetMatch] = []
    for h in trace.hooks:
        ex.hook_chains.append({"chain": rs.display(h.entry.chain), "priority": h.entry.priority,
                               "outcome": h.outcome})
        for st in h.steps:
            r = role(st.chain)
            if st.event == "enter":
                ex.path.append({"enter": rs.display(st.chain), "via": st.detail or "hook"})
                if r == "dispatch" and rs.display(st.chain) not in ex.dispatch:
                    ex.dispatch.append(rs.display(st.chain))
                elif r == "endpoint":
                    ex.endpoints.append(rs.display(st.chain))
                    a, p = _learn_bits(rs.chains.get(st.chain) or [])
                    accept_bit, pass_bit = a or accept_bit, p or pass_bit
                elif r in ("policy", "profile"):
                    rules = rs.chains.get(st.chain) or []
                    name, way = policy_name(rules, st.chain)
                    v = PolicyVisit(r, st.chain, name, tier if r == "policy" else "", way)
                    open_visits.append((st.depth, v))
                    visits.append(v)
                continue
            if st.event in ("leave", "policy"):
                floor = 0 if st.event == "policy" else st.depth
                while open_visits and open_visits[-1][0] >= floor:
                    _, v = open_visits.pop()
                    if v.outcome == "no-match":
                        if accept_bit and st.mark & accept_bit:
                            v.outcome = "allow"
                        elif pass_bit and st.mark & pass_bit:
                            v.outcome = "pass"
                if st.event == "policy":
                    ex.path.append({"policy": rs.display(st.chain), "verdict": st.detail})
                continue
            assert st.rule is not None
            rule = st.rule
            last_rule = (st.chain, rule)
            if h.entry.label.startswith("filter"):
                filter_last = last_rule
            sets.extend(st.sets)
            entry: dict[str, Any] = {"chain": rs.display(st.chain), "rule": rule.position, "hash": rule.hash,
                                     "action": _action_text(rule)}
            if rule.comments:
                entry["comments"] = list(rule.comments)
            if st.detail:
                entry["detail"] = st.detail
            if st.sets:
                entry["ip_sets"] = [{"set": s.set_name, "direction": s.direction, "member": s.member}
                                    for s in st.sets]
            ex.path.append(entry)
            for c in rule.comments:
                if c.startswith("Start of tier "):
                    tier = c[len("Start of tier "):]
                    ex.tiers.append(tier)
            if open_visits and open_visits[-1][1].chain == st.chain:
                v = open_visits[-1][1]
                rules = rs.chains.get(st.chain) or []
                if _sets_bits(rule.action):
                    v.kernel_rule, v.rule_index = rule, rule_index(rules, rule.position)
                if isinstance(rule.action, (m.Drop, m.Reject)):
                    v.outcome = "deny"
    ex.policies = [v.json(rs.display(v.chain)) for v in visits]
    ex.ip_sets = [{"set": s.set_name, "direction": s.direction, "member": s.member}
                  for s in dict.fromkeys(sets)]
    ex.decided_by = _decision(rs, trace, visits, last_rule if trace.verdict == "deny" else filter_last or last_rule)
    return ex


def _decision(rs: Ruleset, trace: Trace, visits: list[PolicyVisit],
              last_rule: tuple[str, KRule] | None) -> dict[str, Any] | None:
    decisive = [v for v in visits if v.outcome in (("deny",) if trace.verdict == "deny" else ("allow",))]
    if decisive:
        v = decisive[-1]
        out = v.json(rs.display(v.chain))
        out["by"] = v.kind
        return out
    if last_rule is None:
        return None
    chain, rule = last_rule
    return {"by": "rule", "chain": rs.display(chain), "rule": rule.position, "hash": rule.hash,
            "comments": list(rule.comments), "action": _action_text(rule)}


def _action_text(rule: KRule) -> str:
    a = rule.action
    if a is None:
        return "continue"
    if isinstance(a, (m.Jump, m.Goto)):
        return f"{type(a).__name__.lower()} {a.target}"
    if isinstance(a, m.SetMaskedMark):
        return f"mark {a.mark:#x}/{a.mask:#x}"
    return type(a).__name__.lower()
