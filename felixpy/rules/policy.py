"""Policy and profile chains: proto rules to typed rules (Felix's ``felix/rules/policy.go``).

A proto rule becomes one or more :class:`Rule` values:

* the rule is skipped for the other family (``ip_version``) and its CIDR lists
  are filtered to this family; a non-empty CIDR field that filters to nothing,
  or a negated catch-all CIDR, drops the rule for this family;
* where one iptables rule cannot express an OR (more than one 15-slot multiport
  split or named-port set per direction, more than one positive CIDR, positive
  and negated CIDRs together) Felix's *match blocks* set scratch mark S0 ("all
  blocks pass") with S1 as the per-block scratch bit, and the final rule also
  requires S0;
* the verdict: allow/pass set the accept/pass mark then RETURN; deny sets the
  drop mark then applies the filter deny action; log is a single non-terminal
  LOG rule.  Trailing RETURN rules are stripped from the chain, and the first
  rule carries the chain comment (``GlobalNetworkPolicy name ingress``…).

felixpy addition: a rule field that cannot be rendered (bad port range, ports
without a port-bearing protocol, ICMP fields without the family's ICMP
protocol, malformed CIDR, set ID or protocol) drops just that rule for that
family, with a warning naming the policy and rule index; Felix would panic or
write a ruleset the kernel rejects.
"""

from __future__ import annotations

import ipaddress
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import structlog

from felixpy.drivers.generictables.model import (
    Chain,
    ClearMark,
    Log,
    Match,
    Nflog,
    PortRange,
    Return,
    Rule,
    SetMark,
    SetMaskedMark,
)
from felixpy.memo import LONGEST_CIDR, short_string_memo
from felixpy.rules import nflog
from felixpy.rules.ipset_names import SET_ID_RE
from felixpy.rules.names import (
    POLICY_INBOUND_PFX,
    POLICY_OUTBOUND_PFX,
    PROFILE_INBOUND_PFX,
    PROFILE_OUTBOUND_PFX,
    PolicyID,
    ProfileID,
    policy_chain_name,
    profile_chain_name,
)

if TYPE_CHECKING:
    from felixpy.proto import felixbackend_pb2 as pb
    from felixpy.rules.context import RenderContext

log = structlog.get_logger(__name__)

__all__ = [
    "PORT_PROTOCOL_NAMES",
    "PORT_PROTOCOL_NUMBERS",
    "Ident",
    "check_rule",
    "generate_log_prefix",
    "policy_chains",
    "profile_chains",
    "render_proto_rule",
    "render_proto_rules",
    "split_port_list",
]

Ident = PolicyID | ProfileID

MULTIPORT_SLOTS = 15
# Protocols whose packets carry ports that iptables' multiport (and nft's ``th``) can match.
PORT_PROTOCOL_NAMES = frozenset({"tcp", "udp", "sctp", "udplite", "dccp"})
PORT_PROTOCOL_NUMBERS = frozenset({6, 17, 132, 136, 33})
_ICMP = {4: (frozenset({"icmp"}), 1), 6: (frozenset({"icmpv6", "ipv6-icmp", "icmp6"}), 58)}
_PROTO_NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._+-]*\Z")  # \Z: "$" would let "tcp\n" through
_ACTIONS = frozenset({"", "allow", "deny", "pass", "next-tier", "log"})


# ----------------------------------------------------------------------- rule view
@dataclass(frozen=True, slots=True)
class _Proto:
    name: str | None = None
    number: int | None = None


@dataclass(frozen=True, slots=True)
class _Icmp:
    type: int
    code: int | None = None


class _View(NamedTuple):
    """The proto rule's matchable fields as plain values (the renderer edits copies of this).

    A NamedTuple rather than a frozen dataclass: as immutable, and ~5x cheaper to build and copy."""

    action: str = ""
    protocol: _Proto | None = None
    not_protocol: _Proto | None = None
    src_net: tuple[str, ...] = ()
    not_src_net: tuple[str, ...] = ()
    dst_net: tuple[str, ...] = ()
    not_dst_net: tuple[str, ...] = ()
    src_ports: tuple[PortRange, ...] = ()
    not_src_ports: tuple[PortRange, ...] = ()
    dst_ports: tuple[PortRange, ...] = ()
    not_dst_ports: tuple[PortRange, ...] = ()
    src_named_ports: tuple[str, ...] = ()
    not_src_named_ports: tuple[str, ...] = ()
    dst_named_ports: tuple[str, ...] = ()
    not_dst_named_ports: tuple[str, ...] = ()
    src_ip_sets: tuple[str, ...] = ()
    not_src_ip_sets: tuple[str, ...] = ()
    dst_ip_sets: tuple[str, ...] = ()
    not_dst_ip_sets: tuple[str, ...] = ()
    dst_ip_port_sets: tuple[str, ...] = ()
    icmp: _Icmp | None = None
    not_icmp: _Icmp | None = None
    annotations: tuple[tuple[str, str], ...] = ()


# Proto repeated-string fields → their _View field.
_STR_FIELDS = {
    "src_net": "src_net", "not_src_net": "not_src_net", "dst_net": "dst_net", "not_dst_net": "not_dst_net",
    "src_named_port_ip_set_ids": "src_named_ports", "not_src_named_port_ip_set_ids": "not_src_named_ports",
    "dst_named_port_ip_set_ids": "dst_named_ports", "not_dst_named_port_ip_set_ids": "not_dst_named_ports",
    "src_ip_set_ids": "src_ip_sets", "not_src_ip_set_ids": "not_src_ip_sets", "dst_ip_set_ids": "dst_ip_sets",
    "not_dst_ip_set_ids": "not_dst_ip_sets", "dst_ip_port_set_ids": "dst_ip_port_sets",
}
# Validated in this order (the first bad one names the error), as the fields of _View.
_PORT_FIELDS = ("src_ports", "not_src_ports", "dst_ports", "not_dst_ports")
_ICMP_FIELDS = {"icmp_type": "icmp", "icmp_type_code": "icmp", "not_icmp_type": "not_icmp",
                "not_icmp_type_code": "not_icmp"}


def _proto_of(rule: pb.Rule, field: str) -> _Proto | None:
    if not rule.HasField(field):
        return None
    p = getattr(rule, field)
    which = p.WhichOneof("number_or_name")
    if which == "number":
        return _Proto(number=p.number)
    if which == "name":
        return _Proto(name=p.name)
    return _Proto()  # present but empty: rejected by check_rule


def _ports(ranges: Sequence[pb.PortRange]) -> tuple[PortRange, ...]:
    if not ranges:  # the common case: no per-entry work
        return ()
    raw = [(r.first, r.last) for r in ranges]
    if any(a < 0 or b < 0 for a, b in raw):  # -1 would read as "single port" to PortRange
        raise ValueError("negative port")
    return tuple(PortRange(a, b) for a, b in raw)


def _view(rule: pb.Rule) -> _View:
    """The rule's view; raises ValueError for a bad port range.

    Reads only the fields that are present (``ListFields``; a rule sets a handful of its ~30): the
    others keep the view's defaults, which are what an absent field reads as."""
    kw: dict[str, Any] = {}
    ports: dict[str, Any] = {}
    for fd, value in rule.ListFields():
        name = fd.name
        if (target := _STR_FIELDS.get(name)) is not None:
            kw[target] = tuple(value)
        elif name in _PORT_FIELDS:
            ports[name] = value
        elif name == "action":
            kw["action"] = value
        elif name in ("protocol", "not_protocol"):
            kw[name] = _proto_of(rule, name)
        elif (oneof := _ICMP_FIELDS.get(name)) is not None:
            kw[oneof] = _Icmp(value) if isinstance(value, int) else _Icmp(value.type, value.code)
        elif name == "metadata":
            kw["annotations"] = tuple(sorted(value.annotations.items()))
    for name in _PORT_FIELDS:
        if name in ports:
            kw[name] = _ports(ports[name])
    return _View(**kw)


# ----------------------------------------------------------------------- validation
_CIDR_FORM = re.compile(r"\A[0-9A-Fa-f:.]+(?:/[0-9]{1,3})?\Z")


@short_string_memo(LONGEST_CIDR, maxsize=8192)  # pure; parsing (an IPv6 CIDR especially) is the slow part of checking a rule
def cidr_problem(cidr: str) -> str | None:
    """Why *cidr* is not an address or ``<address>/<prefix length>`` (None when it is).

    Python's ``ip_network`` also takes ``a/255.255.255.0`` (a netmask) and ``a/0.0.0.255`` (a
    *hostmask*, read as /24), which the kernel tools read differently — ``ip saddr 1.2.3.4/0.0.0.255``
    is a bitmask match in nft — and Go's ``net.ParseCIDR`` (Felix) refuses: only prefix lengths here."""
    if not _CIDR_FORM.match(cidr):
        return "not <address>[/<prefix length>]"
    try:
        ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:
        return str(exc)
    return None


def _check_protocol(p: _Proto | None, what: str) -> str | None:
    if p is None:
        return None
    if p.number is not None:
        if not 0 <= p.number <= 255:
            return f"{what} number {p.number} out of range 0-255"
        return None
    if p.name is None:
        return f"{what} has neither a name nor a number"
    if not _PROTO_NAME_RE.match(p.name):
        return f"{what} name {p.name!r} is not a protocol name"
    return None


def _bears_ports(p: _Proto | None) -> bool:
    if p is None:
        return False
    if p.number is not None:
        return p.number in PORT_PROTOCOL_NUMBERS
    return (p.name or "").lower() in PORT_PROTOCOL_NAMES


def _is_family_icmp(p: _Proto | None, ip_version: int) -> bool:
    if p is None:
        return False
    names, number = _ICMP[ip_version]
    if p.number is not None:
        return p.number == number
    return (p.name or "").lower() in names


def check_rule(rule: pb.Rule, ip_version: int) -> str | None:
    """Why this rule cannot be rendered for ``ip_version`` (None when it can)."""
    return _checked_view(rule, ip_version)[1]


class _Checked:
    """A rule's view (None if its ports are bad) and, per family once asked, why it can't render."""

    __slots__ = ("bad_ports", "reasons", "view")

    def __init__(self, view: _View | None, bad_ports: str | None) -> None:
        self.view = view
        self.bad_ports = bad_ports
        self.reasons: dict[int, str | None] = {}


VIEW_MEMO_SIZE = 4096
# Rule content (its deterministic serialisation: equal rules, equal bytes; different rules, different
# bytes) → its checked view.  Building a view costs ~40 µs, serialising ~2 µs: both families' renderers
# share one view of each rule of an update, and a rule that recurs (``allow``, a namespace's selector…)
# is read once.  The view is immutable and a pure function of the bytes, so the memo can't go stale;
# eviction only costs a rebuild.
_view_memo: OrderedDict[bytes, _Checked] = OrderedDict()


def _checked_view(rule: pb.Rule, ip_version: int) -> tuple[_View | None, str | None]:
    """(the rule's view, why it cannot be rendered for ``ip_version`` or None); one view per rule content."""
    key = rule.SerializeToString(deterministic=True)
    entry = _view_memo.get(key)
    if entry is None:
        try:
            entry = _Checked(_view(rule), None)
        except ValueError as exc:  # PortRange validates 0 <= first <= last <= 65535
            entry = _Checked(None, f"bad port range ({exc})")
        _view_memo[key] = entry
        if len(_view_memo) > VIEW_MEMO_SIZE:
            _view_memo.popitem(last=False)
    else:
        _view_memo.move_to_end(key)
    if entry.view is None:
        return None, entry.bad_ports
    if ip_version not in entry.reasons:
        entry.reasons[ip_version] = _check_view(entry.view, ip_version)
    return entry.view, entry.reasons[ip_version]


def _check_view(v: _View, ip_version: int) -> str | None:
    if v.action not in _ACTIONS:
        return f"unknown action {v.action!r}"
    for p, what in ((v.protocol, "protocol"), (v.not_protocol, "not_protocol")):
        if (reason := _check_protocol(p, what)) is not None:
            return reason
    for field in ("src_net", "not_src_net", "dst_net", "not_dst_net"):
        for cidr in getattr(v, field):
            if (why := cidr_problem(cidr)) is not None:
                return f"{field} {cidr!r} is not a CIDR ({why})"
    for field in ("src_named_ports", "not_src_named_ports", "dst_named_ports", "not_dst_named_ports",
                  "src_ip_sets", "not_src_ip_sets", "dst_ip_sets", "not_dst_ip_sets", "dst_ip_port_sets"):
        for set_id in getattr(v, field):
            if not SET_ID_RE.match(set_id):
                return f"{field} has a malformed IP set ID {set_id!r}"
    if (v.src_ports or v.dst_ports or v.not_src_ports or v.not_dst_ports) and not _bears_ports(v.protocol):
        return "ports need protocol tcp, udp, sctp, udplite or dccp"
    for icmp, what in ((v.icmp, "icmp"), (v.not_icmp, "not_icmp")):
        if icmp is None:
            continue
        if not 0 <= icmp.type <= 255 or (icmp.code is not None and not 0 <= icmp.code <= 255):
            return f"{what} type/code out of range 0-255"
        if not _is_family_icmp(v.protocol, ip_version):
            return f"{what} type/code needs protocol {'icmp' if ip_version == 4 else 'icmpv6'} in an IPv{ip_version} rule"
    return None


def _icmp_rule_for_other_family(rule: pb.Rule, ip_version: int) -> bool:
    """A family-less rule with the other family's ICMP protocol and type is simply not for us."""
    if rule.ip_version != 0 or (rule.WhichOneof("icmp") is None and rule.WhichOneof("not_icmp") is None):
        return False
    other = 6 if ip_version == 4 else 4
    return _is_family_icmp(_proto_of(rule, "protocol"), other)


def _is_catch_all(cidr: str, ip_version: int) -> bool:
    return (ip_version == 4 and cidr == "0.0.0.0/0") or (ip_version == 6 and cidr == "::/0")


def _filter_nets(cidrs: tuple[str, ...], ip_version: int, negated: bool) -> tuple[tuple[str, ...], str | None]:
    """Felix's filterNets: (CIDRs of this family, reason the whole rule must go, or None)."""
    if not cidrs:
        return (), None
    want_v6 = ip_version == 6
    kept: list[str] = []
    for cidr in cidrs:
        if (":" in cidr) != want_v6:
            continue
        if negated and _is_catch_all(cidr, ip_version):
            return (), f"negated catch-all CIDR {cidr}"
        kept.append(cidr)
    return tuple(kept), (None if kept else "no CIDR of this IP version")


# ----------------------------------------------------------------------- port splits
def split_port_list(ports: Sequence[PortRange]) -> list[tuple[PortRange, ...]]:
    """Pack ports in order into groups of at most 15 multiport slots (a range takes two)."""
    splits: list[tuple[PortRange, ...]] = []
    current: list[PortRange] = []
    free = MULTIPORT_SLOTS
    for p in ports:
        if free < p.slots:
            splits.append(tuple(current))
            current, free = [], MULTIPORT_SLOTS
        current.append(p)
        free -= p.slots
    if current:
        splits.append(tuple(current))
    return splits


def _protocol_match(m: Match, p: _Proto | None) -> Match:
    if p is None:
        return m
    if p.number is not None:
        return m.protocol_num(p.number)
    return m.protocol(p.name or "")


# ----------------------------------------------------------------------- match blocks
class _MatchBlocks:
    def __init__(self, all_pass: int, this_pass: int) -> None:
        self.all_pass = all_pass
        self.this_pass = this_pass
        self.using = False
        self._done_first_positive = False
        self.rules: list[Rule] = []

    def _initial(self, initial_bits: int) -> None:
        if self.using:
            return
        self.rules.append(Rule(Match(), SetMaskedMark(initial_bits, self.all_pass | self.this_pass)))
        self.using = True

    def _mark_to_set(self) -> int:
        return self.this_pass if self._done_first_positive else self.all_pass

    def _finish_positive(self) -> None:
        if not self._done_first_positive:
            self._done_first_positive = True
            return
        self.rules.append(Rule(Match().mark_clear(self.this_pass), ClearMark(self.all_pass)))

    def ports(self, ctx: RenderContext, protocol: _Proto | None, splits: list[tuple[PortRange, ...]],
              named_port_ids: tuple[str, ...], src: bool) -> None:
        self._initial(0)
        mark = self._mark_to_set()
        for split in splits:
            m = _protocol_match(Match(), protocol)
            m = m.source_ports(*split) if src else m.dest_ports(*split)
            self.rules.append(Rule(m, SetMark(mark)))
        for set_id in named_port_ids:
            name = ctx.ipset(set_id)
            m = Match().source_ip_port_set(name) if src else Match().dest_ip_port_set(name)
            self.rules.append(Rule(m, SetMark(mark)))
        self._finish_positive()

    def cidrs(self, cidrs: tuple[str, ...], src: bool) -> None:
        self._initial(0)
        mark = self._mark_to_set()
        for cidr in cidrs:
            m = Match().source_net(cidr) if src else Match().dest_net(cidr)
            self.rules.append(Rule(m, SetMark(mark)))
        self._finish_positive()

    def negated_cidrs(self, cidrs: tuple[str, ...], src: bool) -> None:
        self._initial(self.all_pass)
        for cidr in cidrs:
            m = Match().source_net(cidr) if src else Match().dest_net(cidr)
            self.rules.append(Rule(m, ClearMark(self.all_pass)))


# ----------------------------------------------------------------------- single rule
def _rule_match(ctx: RenderContext, v: _View) -> Match:
    """Felix's CalculateRuleMatch: positive criteria, then the negations, in Felix's order."""
    ip = ctx.ip_version
    m = _protocol_match(Match(), v.protocol)
    if v.src_net:
        m = m.source_net(v.src_net[0])
    for s in v.src_ip_sets:
        m = m.source_ip_set(ctx.ipset(s))
    if v.src_ports:
        m = m.source_ports(*v.src_ports)
    for s in v.src_named_ports:
        m = m.source_ip_port_set(ctx.ipset(s))
    if v.dst_net:
        m = m.dest_net(v.dst_net[0])
    for s in v.dst_ip_sets:
        m = m.dest_ip_set(ctx.ipset(s))
    for s in v.dst_ip_port_sets:
        m = m.dest_ip_port_set(ctx.ipset(s))
    if v.dst_ports:
        m = m.dest_ports(*v.dst_ports)
    for s in v.dst_named_ports:
        m = m.dest_ip_port_set(ctx.ipset(s))
    if v.icmp is not None:
        m = _icmp_match(m, v.icmp, ip, negate=False)

    if v.not_protocol is not None:
        if v.not_protocol.number is not None:
            m = m.not_protocol_num(v.not_protocol.number)
        else:
            m = m.not_protocol(v.not_protocol.name or "")
    if v.not_src_net:
        m = m.not_source_net(v.not_src_net[0])
    for s in v.not_src_ip_sets:
        m = m.not_source_ip_set(ctx.ipset(s))
    for split in split_port_list(v.not_src_ports):
        m = m.not_source_ports(*split)
    for s in v.not_src_named_ports:
        m = m.not_source_ip_port_set(ctx.ipset(s))
    if v.not_dst_net:
        m = m.not_dest_net(v.not_dst_net[0])
    for s in v.not_dst_ip_sets:
        m = m.not_dest_ip_set(ctx.ipset(s))
    for split in split_port_list(v.not_dst_ports):
        m = m.not_dest_ports(*split)
    for s in v.not_dst_named_ports:
        m = m.not_dest_ip_port_set(ctx.ipset(s))
    if v.not_icmp is not None:
        m = _icmp_match(m, v.not_icmp, ip, negate=True)
    return m


def _icmp_match(m: Match, icmp: _Icmp, ip_version: int, negate: bool) -> Match:
    if ip_version == 4:
        if icmp.code is None:
            return m.not_icmp_type(icmp.type) if negate else m.icmp_type(icmp.type)
        return (m.not_icmp_type_and_code(icmp.type, icmp.code) if negate
                else m.icmp_type_and_code(icmp.type, icmp.code))
    if icmp.code is None:
        return m.not_icmpv6_type(icmp.type) if negate else m.icmpv6_type(icmp.type)
    return (m.not_icmpv6_type_and_code(icmp.type, icmp.code) if negate
            else m.icmpv6_type_and_code(icmp.type, icmp.code))


_LOG_PREFIX_RE = re.compile(r"%[tknp]")


def generate_log_prefix(configured: str, ident: Ident, tier: str) -> str:
    """LogPrefix with ``%t`` tier, ``%k`` kind short name, ``%n`` name, ``%p`` [ns/]name."""
    prefix = configured or "calico-packet"
    if "%" not in prefix:
        return prefix
    if isinstance(ident, PolicyID):
        kind, name, namespace = ident.kind_short_name, ident.name, ident.namespace
    else:
        kind, name, namespace = "pro", ident.name, ""

    def sub(m: re.Match[str]) -> str:
        spec = m.group(0)
        if spec == "%k":
            return kind
        if spec == "%p":
            return f"{namespace}/{name}" if namespace else name
        if spec == "%n":
            return name
        return tier

    return _LOG_PREFIX_RE.sub(sub, prefix)


def _combine_match_and_actions(ctx: RenderContext, action: str, match: Match, owner: str, direction: str,
                               index: int, ident: Ident, tier: str, untracked: bool) -> list[Rule]:
    """Felix's CombineMatchAndActionsForProtoRule."""
    marks = ctx.marks
    group = nflog.NFLOG_INBOUND_GROUP if direction == nflog.DIR_INGRESS else nflog.NFLOG_OUTBOUND_GROUP
    action_rules: list[Rule] = []
    mark = 0
    if action == "log":
        log_match = Match()
        if ctx.config.LogActionRateLimit:
            log_match = log_match.limit(ctx.config.LogActionRateLimit, ctx.config.LogActionRateLimitBurst)
        action_rules.append(Rule(log_match, Log(generate_log_prefix(ctx.config.LogPrefix, ident, tier))))
    elif action in ("", "allow", "next-tier", "pass"):
        allow = action in ("", "allow")
        mark = marks.accept if allow else marks.pass_
        if not untracked and ctx.flow_logs:
            code = nflog.ACTION_ALLOW if allow else nflog.ACTION_PASS
            action_rules.append(Rule(Match(), Nflog(group, nflog.rule_prefix(code, owner, direction, index,
                                                                              ident.id()))))
        action_rules.append(Rule(Match(), Return()))
    else:  # deny
        mark = marks.drop
        if not untracked and ctx.flow_logs:
            action_rules.append(Rule(Match(), Nflog(group, nflog.rule_prefix(nflog.ACTION_DENY, owner, direction,
                                                                              index, ident.id()))))
        action_rules.append(Rule(Match(), ctx.deny))

    out: list[Rule] = []
    if mark:
        out.append(Rule(match, SetMark(mark)))
        match = Match().mark_single_bit_set(mark)
    criteria = match.criteria
    for r in action_rules:
        out.append(Rule(Match(r.match.criteria + criteria) if r.match.criteria else match, r.action, r.comments))
    return out


def render_proto_rule(ctx: RenderContext, rule: pb.Rule, *, owner: str, direction: str, index: int,
                      ident: Ident, tier: str = "", untracked: bool = False) -> list[Rule]:
    """One proto rule to its rules for ``ctx.ip_version``; [] if it doesn't apply or can't render."""
    ip = ctx.ip_version
    if rule.ip_version not in (0, ip):
        return []
    if _icmp_rule_for_other_family(rule, ip):
        log.debug("Skipping ICMP rule of the other IP version", policy=_describe(ident), rule_index=index)
        return []
    view, reason = _checked_view(rule, ip)
    if reason is not None or view is None:
        log.warning("Dropping policy rule that cannot be rendered for this IP version",
                    policy=_describe(ident), rule_index=index, direction=direction, ip_version=ip, reason=reason)
        return []
    v = view
    filtered: dict[str, tuple[str, ...]] = {}
    for field, negated in (("src_net", False), ("not_src_net", True), ("dst_net", False), ("not_dst_net", True)):
        nets = getattr(v, field)
        if not nets:
            continue
        kept, why = _filter_nets(nets, ip, negated)
        if why is not None:
            # Normal for a family-less rule written for the other family; bad input otherwise.
            bad = rule.ip_version == ip or why.startswith("negated")
            (log.warning if bad else log.debug)(
                "Dropping policy rule for this IP version", policy=_describe(ident), rule_index=index,
                direction=direction, ip_version=ip, reason=f"{field}: {why}")
            return []
        if kept != nets:
            filtered[field] = kept
    if filtered:
        get = filtered.get
        v = v._replace(src_net=get("src_net", v.src_net), not_src_net=get("not_src_net", v.not_src_net),
                       dst_net=get("dst_net", v.dst_net), not_dst_net=get("not_dst_net", v.not_dst_net))

    blocks = _MatchBlocks(ctx.marks.scratch0, ctx.marks.scratch1)
    src_splits = split_port_list(v.src_ports)
    if len(src_splits) + len(v.src_named_ports) > 1:
        blocks.ports(ctx, v.protocol, src_splits, v.src_named_ports, src=True)
        v = v._replace(src_ports=(), src_named_ports=())
    dst_splits = split_port_list(v.dst_ports)
    if len(dst_splits) + len(v.dst_named_ports) > 1:
        blocks.ports(ctx, v.protocol, dst_splits, v.dst_named_ports, src=False)
        v = v._replace(dst_ports=(), dst_named_ports=())
    if len(v.src_net) > 1:
        blocks.cidrs(v.src_net, src=True)
        v = v._replace(src_net=())
    if len(v.dst_net) > 1:
        blocks.cidrs(v.dst_net, src=False)
        v = v._replace(dst_net=())
    if len(v.src_net) + len(v.not_src_net) > 1:
        blocks.negated_cidrs(v.not_src_net, src=True)
        v = v._replace(not_src_net=())
    if len(v.dst_net) + len(v.not_dst_net) > 1:
        blocks.negated_cidrs(v.not_dst_net, src=False)
        v = v._replace(not_dst_net=())

    match = _rule_match(ctx, v)
    if blocks.using:
        match = match.mark_single_bit_set(blocks.all_pass)
    rules = blocks.rules + _combine_match_and_actions(ctx, v.action, match, owner, direction, index, ident,
                                                      tier, untracked)
    if v.annotations:
        extra = tuple(f"{k}={val}" for k, val in v.annotations)
        rules = [replace(r, comments=r.comments + extra) for r in rules]
    return rules


def _describe(ident: Ident) -> str:
    return ident.describe()


def render_proto_rules(ctx: RenderContext, rules: Sequence[pb.Rule], *, owner: str, direction: str,
                       ident: Ident, tier: str = "", untracked: bool = False,
                       chain_comment: str | None = None) -> tuple[Rule, ...]:
    """Felix's ProtoRulesToIptablesRules: all rules, trailing RETURNs stripped, chain comment first."""
    out: list[Rule] = []
    for i, r in enumerate(rules):
        out.extend(render_proto_rule(ctx, r, owner=owner, direction=direction, index=i, ident=ident, tier=tier,
                                     untracked=untracked))
    while out and isinstance(out[-1].action, Return):
        out.pop()
    if chain_comment is not None:
        if not out:
            out.append(Rule())
        out[0] = replace(out[0], comments=out[0].comments + (chain_comment,))
    return tuple(out)


def policy_chains(ctx: RenderContext, policy_id: PolicyID, policy: pb.Policy) -> list[Chain]:
    """``cali-pi-<id>`` and ``cali-po-<id>``; nothing for staged policies (never programmed)."""
    if policy_id.staged:
        return []
    limit = ctx.max_name_length
    return [
        Chain(policy_chain_name(POLICY_INBOUND_PFX, policy_id, limit),
              render_proto_rules(ctx, policy.inbound_rules, owner=nflog.OWNER_POLICY, direction=nflog.DIR_INGRESS,
                                 ident=policy_id, tier=policy.tier, untracked=policy.untracked,
                                 chain_comment=f"{policy_id.describe()} ingress")),
        Chain(policy_chain_name(POLICY_OUTBOUND_PFX, policy_id, limit),
              render_proto_rules(ctx, policy.outbound_rules, owner=nflog.OWNER_POLICY, direction=nflog.DIR_EGRESS,
                                 ident=policy_id, tier=policy.tier, untracked=policy.untracked,
                                 chain_comment=f"{policy_id.describe()} egress")),
    ]


def profile_chains(ctx: RenderContext, profile_id: ProfileID, profile: pb.Profile) -> tuple[Chain, Chain]:
    """(``cali-pri-<name>``, ``cali-pro-<name>``)."""
    limit = ctx.max_name_length
    inbound = Chain(profile_chain_name(PROFILE_INBOUND_PFX, profile_id, limit),
                    render_proto_rules(ctx, profile.inbound_rules, owner=nflog.OWNER_PROFILE,
                                       direction=nflog.DIR_INGRESS, ident=profile_id,
                                       chain_comment=f"Profile {profile_id.name} ingress"))
    outbound = Chain(profile_chain_name(PROFILE_OUTBOUND_PFX, profile_id, limit),
                     render_proto_rules(ctx, profile.outbound_rules, owner=nflog.OWNER_PROFILE,
                                        direction=nflog.DIR_EGRESS, ident=profile_id,
                                        chain_comment=f"Profile {profile_id.name} egress"))
    return inbound, outbound
