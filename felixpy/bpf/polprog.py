"""Policy programs as eBPF bytecode, generated from a :class:`~felixpy.bpf.policy_ir.PolicySet`.

Structure (Felix's ``polprog.Builder.Instructions``)::

    header            r6 = ctx; r9 = &state (cali_state slot 0), NULL -> exit
    pre-DNAT tiers    host policy on the pre-NAT destination; allow -> allowed_by_host_policy
    to/from host?     -> to_or_from_host (or straight to allowed_by_host_policy when normal
                      host policy is suppressed)
    forward tiers     apply-on-forward host policy; then -> allowed_by_host_policy
    to_or_from_host:  normal host tiers + host profiles
    allowed_by_host_policy:
                      host interface -> allow; workload -> workload tiers, profiles, deny
    footer            deny: pol_rc = DENY, tail-call cb[1];  exit: return SHOT
                      allow: pol_rc = ALLOW, tail-call cb[0] (pol_rc = 10 and SHOT on failure)

XDP programs carry only untracked host policy, fall through to XDP_PASS, and tail-call fixed
allow/deny slots instead of cb[0]/cb[1].

Each rule is a run of tests that jump to ``rule_<n>_end`` on mismatch, in Felix's order:
protocol, not-protocol, source CIDRs (ORed), not-source CIDRs, destination CIDRs, not-destination
CIDRs, source IP sets (ANDed), not-source sets, destination sets, not-destination sets,
destination IP+port sets, source ports and named ports (ORed), negated, destination ports and
named ports, negated, ICMP type[/code], negated ICMP.  Addresses are compared as the raw
network-order words the program loads (so masks are little-endian encodings of the network
bytes); 32-bit compares use JMP32 so immediates are never sign-extended.

Large policies are split across sub-programs: before each rule, if the current program has
reached ``max_jumps`` conditional jumps (Felix: 8192 - 200) or ``max_insns`` instructions (kept
below the 16-bit jump range, so no trampolines are needed), outstanding labels get landing pads
that store their number in ``state.pol_rc`` and the program tail-calls part k+1 at
``cb[2] + k*10000`` (TC; XDP: ``entry + k*100``).  Part k+1 re-runs the header, reads and
clears ``pol_rc`` and jumps to the pending label.  Reading the entry from cb[2] (written by the
main program) rather than baking it in is what lets one policy program be shared by every
endpoint with the same rules.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from felixpy.bpf import asm, defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.asm import DW, JEQ, JLE, JLT, JNE, R0, R1, R2, R3, R6, R9, R10, B, H, W
from felixpy.bpf.errors import PolicyTooLarge
from felixpy.bpf.policy_ir import Action, PolicySet, PortRange, Profile, Rule, Tier

DEFAULT_MAX_JUMPS = 8192 - 200
DEFAULT_MAX_INSNS = 30000

# Stack layout (Felix's): state-map key, then the source and destination IP-set keys, each
# reserved at the IPv6 size.
OFF_STATE_KEY = -4
OFF_SRC_IPSET_KEY = -36
OFF_DST_IPSET_KEY = -68

SKB_CB0 = mt.SKB_CB_OFFSET
SKB_CB1 = mt.SKB_CB_OFFSET + 4
SKB_CB2 = mt.SKB_CB_OFFSET + 8

FOOTER_LABELS = frozenset({"allow", "deny", "exit", "xdp_pass"})

LEG_SRC = "src"
LEG_DST = "dst"  # post-NAT destination
LEG_DST_PRE_NAT = "dst_pre_nat"

_ADDR_OFF = {LEG_SRC: mt.STATE_OFF_IP_SRC, LEG_DST: mt.STATE_OFF_POST_NAT_IP_DST,
             LEG_DST_PRE_NAT: mt.STATE_OFF_PRE_NAT_IP_DST}
_PORT_OFF = {LEG_SRC: mt.STATE_OFF_SPORT, LEG_DST: mt.STATE_OFF_POST_NAT_DPORT,
             LEG_DST_PRE_NAT: mt.STATE_OFF_PRE_NAT_DPORT}


@dataclass(frozen=True, slots=True)
class ProgramMaps:
    """File descriptors the generated code embeds."""

    state: int
    ipsets: int
    progs: int  # generic prog array: allow/deny continuations
    jumps: int  # policy prog array: split sub-programs


@dataclass(frozen=True, slots=True)
class XdpSlots:
    allow: int
    deny: int
    entry: int  # this program's entry slot (split parts at entry + k*100)


class PolicyProgramBuilder:
    def __init__(self, maps: ProgramMaps, ipset_id: Callable[[str], int], *, v6: bool = False,
                 xdp: XdpSlots | None = None, max_jumps: int = DEFAULT_MAX_JUMPS,
                 max_insns: int = DEFAULT_MAX_INSNS) -> None:
        self.maps = maps
        self.ipset_id = ipset_id
        self.v6 = v6
        self.xdp = xdp
        self.max_jumps = max_jumps
        self.max_insns = max_insns
        self.blocks: list[asm.Block] = []
        self.b = asm.Block()
        self.part = 0
        self.rule_no = 0
        self.tier_no = 0

    # -- public ------------------------------------------------------------------------------

    def build(self, ps: PolicySet) -> list[bytes]:
        """Assemble the program(s); element k goes to jump slot entry + k*stride."""
        self._header()
        if self.xdp is not None:
            self._tiers(ps.host_normal_tiers, LEG_DST_PRE_NAT, "allowed_by_host_policy")
            self.b.ja("xdp_pass")
            self.b.label("allowed_by_host_policy")
            self.b.ja("allow")
        else:
            self._tiers(ps.host_pre_dnat_tiers, LEG_DST_PRE_NAT, "allowed_by_host_policy")
            self._jump_if_to_or_from_host(
                "allowed_by_host_policy" if ps.suppress_normal_host_policy else "to_or_from_host")
            self._tiers(ps.host_forward_tiers, LEG_DST, "allowed_by_host_policy")
            self.b.ja("allowed_by_host_policy")
            if not ps.suppress_normal_host_policy:
                self._label("to_or_from_host")
                self._tiers(ps.host_normal_tiers, LEG_DST, "allowed_by_host_policy")
                self._profiles(ps.host_profiles, "allowed_by_host_policy")
            self._label("allowed_by_host_policy")
            if ps.for_host_interface:
                self.b.ja("allow")
            else:
                self._tiers(ps.tiers, LEG_DST, "allow")
                self._profiles(ps.profiles, "allow")
        self._footer()
        self.blocks.append(self.b)
        return [blk.assemble() for blk in self.blocks]

    # -- structure -------------------------------------------------------------------------------

    def _label(self, name: str) -> None:
        self.b.label(name)

    def _header(self) -> None:
        b = self.b
        b.mov64_reg(R6, asm.R1)
        b.store_imm(W, R10, OFF_STATE_KEY, 0)
        b.mov64_reg(R2, R10)
        b.alu64_imm(asm.ADD, R2, OFF_STATE_KEY)
        b.ld_map_fd(R1, self.maps.state)
        b.call(asm.FN_MAP_LOOKUP_ELEM)
        b.jump(JEQ, R0, 0, "exit")
        b.mov64_reg(R9, R0)

    def _jump_if_to_or_from_host(self, label: str) -> None:
        self.b.load(DW, R1, R9, mt.STATE_OFF_FLAGS)
        self.b.alu64_imm(asm.AND, R1, defs.ST_DEST_IS_HOST | defs.ST_SRC_IS_HOST)
        self.b.jump(JNE, R1, 0, label)

    def _tiers(self, tiers: tuple[Tier, ...], dest_leg: str, allow_label: str) -> None:
        for tier in tiers:
            end_label = f"end_of_tier_{self.tier_no}"
            self.tier_no += 1
            labels = {Action.ALLOW: allow_label, Action.DENY: "deny", Action.PASS: end_label,
                      Action.LOG: "log"}
            for pol in tier.policies:
                if pol.staged:
                    continue  # staged policies are never enforced
                for rule in pol.rules:
                    self._rule(rule, labels[rule.action], dest_leg)
            self._rule(Rule(), labels[tier.end_action], dest_leg)  # end-of-tier
            self._label(end_label)

    def _profiles(self, profiles: tuple[Profile, ...], allow_label: str) -> None:
        labels = {Action.ALLOW: allow_label, Action.DENY: "deny", Action.PASS: "deny",
                  Action.LOG: "log"}
        for prof in profiles:
            for rule in prof.rules:
                self._rule(rule, labels[rule.action], LEG_DST)
        self._rule(Rule(), "deny", LEG_DST)  # no profile matched: default deny

    def _footer(self) -> None:
        b = self.b
        fail = defs.XDP_DROP if self.xdp else defs.TC_ACT_SHOT
        b.label("deny")
        b.store_imm(W, R9, mt.STATE_OFF_POL_RC, defs.POL_DENY)
        self._tail_call_continuation(deny=True)
        b.label("exit")
        b.mov64_imm(R0, fail)
        b.exit()
        if self.xdp is not None and b.is_referenced("xdp_pass"):
            b.label("xdp_pass")
            b.mov64_imm(R0, defs.XDP_PASS)
            b.exit()
        if b.is_referenced("allow"):
            b.label("allow")
            b.store_imm(W, R9, mt.STATE_OFF_POL_RC, defs.POL_ALLOW)
            self._tail_call_continuation(deny=False)
            b.store_imm(W, R9, mt.STATE_OFF_POL_RC, defs.POL_TAIL_CALL_FAILED)
            b.mov64_imm(R0, fail)
            b.exit()

    def _tail_call_continuation(self, *, deny: bool) -> None:
        b = self.b
        b.mov64_reg(R1, R6)
        b.ld_map_fd(R2, self.maps.progs)
        if self.xdp is not None:
            b.mov64_imm(R3, self.xdp.deny if deny else self.xdp.allow)
        else:
            b.load(W, R3, R6, SKB_CB1 if deny else SKB_CB0)
        b.call(asm.FN_TAIL_CALL)

    # -- splitting ----------------------------------------------------------------------------------

    def _maybe_split(self) -> None:
        if self.b.num_jumps >= self.max_jumps or len(self.b) >= self.max_insns:
            self._split()

    def _split(self) -> None:
        b = self.b
        pending = [lbl for lbl in b.pending_labels() if lbl not in FOOTER_LABELS]
        nxt = f"__next_part_{self.part}"
        b.mov64_imm(R0, 0)  # fall through: continue at the start of part k+1
        b.ja(nxt)
        for i, lbl in enumerate(pending, 1):
            b.label(lbl)
            b.mov64_imm(R0, i)
            b.ja(nxt)
        b.label(nxt)
        b.store_reg(W, R9, mt.STATE_OFF_POL_RC, R0)
        b.mov64_reg(R1, R6)
        b.ld_map_fd(R2, self.maps.jumps)
        nxt_part = self.part + 1
        if self.xdp is not None:
            b.mov64_imm(R3, self.xdp.entry + nxt_part * defs.XDP_POLICY_STRIDE)
        else:
            b.load(W, R3, R6, SKB_CB2)
            b.alu64_imm(asm.ADD, R3, nxt_part * defs.TC_POLICY_STRIDE)
        b.call(asm.FN_TAIL_CALL)
        b.mov64_imm(R0, defs.XDP_DROP if self.xdp else defs.TC_ACT_SHOT)
        b.exit()
        self._footer()
        self.blocks.append(b)

        self.part = nxt_part
        if self.part >= defs.MAX_POLICY_SUBPROGS:
            raise PolicyTooLarge(f"policy needs more than {defs.MAX_POLICY_SUBPROGS} sub-programs")
        self.b = asm.Block()
        self._header()
        if pending:
            self.b.load(W, R1, R9, mt.STATE_OFF_POL_RC)
            self.b.store_imm(W, R9, mt.STATE_OFF_POL_RC, 0)
            for i, lbl in enumerate(pending, 1):
                self.b.jump(JEQ, R1, i, lbl)
        else:
            self.b.store_imm(W, R9, mt.STATE_OFF_POL_RC, 0)

    # -- rules ------------------------------------------------------------------------------------------

    def _rule(self, rule: Rule, action_label: str, dest_leg: str) -> None:
        self._maybe_split()
        r = rule.for_family(self.v6)
        if r is None:
            return
        n = self.rule_no
        self.rule_no += 1
        end = f"rule_{n}_end"
        b = self.b

        if r.protocol is not None:
            b.load(B, R1, R9, mt.STATE_OFF_IP_PROTO)
            b.jump(JNE, R1, r.protocol, end)
        if r.not_protocol is not None:
            b.load(B, R1, R9, mt.STATE_OFF_IP_PROTO)
            b.jump(JEQ, R1, r.not_protocol, end)
        if r.src_nets:
            self._cidrs(r.src_nets, LEG_SRC, end, negate=False, tag=f"{n}_sn")
        if r.not_src_nets:
            self._cidrs(r.not_src_nets, LEG_SRC, end, negate=True, tag=f"{n}_nsn")
        if r.dst_nets:
            self._cidrs(r.dst_nets, dest_leg, end, negate=False, tag=f"{n}_dn")
        if r.not_dst_nets:
            self._cidrs(r.not_dst_nets, dest_leg, end, negate=True, tag=f"{n}_ndn")
        for sets, leg, op in ((r.src_ip_sets, LEG_SRC, JEQ), (r.not_src_ip_sets, LEG_SRC, JNE),
                              (r.dst_ip_sets, dest_leg, JEQ), (r.not_dst_ip_sets, dest_leg, JNE),
                              (r.dst_ip_port_sets, dest_leg, JEQ)):
            for s in sets:
                self._maybe_split()
                self._ipset_lookup(s, leg)
                self.b.jump(op, R0, 0, end)  # JEQ 0: not a member; JNE 0: a member
        if r.src_ports or r.src_named_port_ip_sets:
            self._ports(r.src_ports, r.src_named_port_ip_sets, LEG_SRC, end, False, f"{n}_sp")
        if r.not_src_ports or r.not_src_named_port_ip_sets:
            self._ports(r.not_src_ports, r.not_src_named_port_ip_sets, LEG_SRC, end, True, f"{n}_nsp")
        if r.dst_ports or r.dst_named_port_ip_sets:
            self._ports(r.dst_ports, r.dst_named_port_ip_sets, dest_leg, end, False, f"{n}_dp")
        if r.not_dst_ports or r.not_dst_named_port_ip_sets:
            self._ports(r.not_dst_ports, r.not_dst_named_port_ip_sets, dest_leg, end, True, f"{n}_ndp")
        if r.icmp_type is not None:
            self._icmp(r.icmp_type, r.icmp_code, end, negate=False)
        if r.not_icmp_type is not None:
            self._icmp(r.not_icmp_type, r.not_icmp_code, end, negate=True)

        b = self.b  # criteria may have split the program
        if action_label == "log":
            b.load(DW, R1, R9, mt.STATE_OFF_FLAGS)
            b.alu64_imm(asm.OR, R1, defs.ST_LOG_PACKET)
            b.store_reg(DW, R9, mt.STATE_OFF_FLAGS, R1)
        else:
            b.ja(action_label)
        if b.is_referenced(end):
            b.label(end)

    def _cidrs(self, nets: tuple[str, ...], leg: str, end: str, *, negate: bool, tag: str) -> None:
        """Positive: match if any CIDR matches.  Negated: no match if any CIDR matches."""
        b = self.b
        ok = f"cidr_{tag}_ok"
        off = _ADDR_OFF[leg]
        target = end if negate else ok
        parsed = [ipaddress.ip_network(c, strict=False) for c in nets]
        if not negate and any(n.prefixlen == 0 for n in parsed):
            return  # a catch-all in a positive list always matches: no test needed
        for i, net in enumerate(parsed):
            self._maybe_split()
            b = self.b
            raw = net.network_address.packed
            mask_raw = net.netmask.packed
            nxt = f"cidr_{tag}_{i}_next"
            words = [(j, int.from_bytes(raw[j:j + 4], "little"),
                      int.from_bytes(mask_raw[j:j + 4], "little"))
                     for j in range(0, len(raw), 4)]
            words = [w for w in words if w[2] != 0]
            for j, (wo, val, mask) in enumerate(words):
                b.load(W, R1, R9, off + wo)
                if mask != 0xFFFFFFFF:
                    b.alu32_imm(asm.AND, R1, mask)
                if j < len(words) - 1:
                    b.jump(JNE, R1, val, nxt, wide=False)
                else:
                    b.jump(JEQ, R1, val, target, wide=False)
            if b.is_referenced(nxt):
                b.label(nxt)
        if not negate:
            b = self.b
            b.ja(end)
            b.label(ok)

    def _ipset_lookup(self, set_name: str, leg: str) -> None:
        """r0 = bpf_map_lookup_elem(ip_sets, {set, leg address, leg port, proto})."""
        b = self.b
        k = OFF_SRC_IPSET_KEY if leg == LEG_SRC else OFF_DST_IPSET_KEY
        adj = 12 if self.v6 else 0
        set_id = self.ipset_id(set_name).to_bytes(8, "big")
        b.store_imm(W, R10, k, mt.IPSET_FULL_PREFIX_V6 if self.v6 else mt.IPSET_FULL_PREFIX_V4)
        b.store_imm(W, R10, k + 4, int.from_bytes(set_id[:4], "little"))
        b.store_imm(W, R10, k + 8, int.from_bytes(set_id[4:], "little"))
        off = _ADDR_OFF[leg]
        if self.v6:
            b.load(DW, R1, R9, off)
            b.store_reg(DW, R10, k + 12, R1)
            b.load(DW, R1, R9, off + 8)
            b.store_reg(DW, R10, k + 20, R1)
        else:
            b.load(W, R1, R9, off)
            b.store_reg(W, R10, k + 12, R1)
        b.load(H, R1, R9, _PORT_OFF[leg])
        b.store_reg(H, R10, k + 16 + adj, R1)
        b.load(B, R1, R9, mt.STATE_OFF_IP_PROTO)
        b.store_reg(B, R10, k + 18 + adj, R1)
        b.store_imm(B, R10, k + 19 + adj, 0)
        b.ld_map_fd(R1, self.maps.ipsets)
        b.mov64_reg(R2, R10)
        b.alu64_imm(asm.ADD, R2, k)
        b.call(asm.FN_MAP_LOOKUP_ELEM)

    def _ports(self, ranges: tuple[PortRange, ...], named: tuple[str, ...], leg: str, end: str,
               negate: bool, tag: str) -> None:
        """Positive: match if any range or named port matches.  Negated: the reverse."""
        b = self.b
        ok = f"ports_{tag}_ok"
        target = end if negate else ok
        port_off = _PORT_OFF[leg]
        for i, pr in enumerate(ranges):
            self._maybe_split()
            b = self.b
            b.load(H, R1, R9, port_off)  # per range: a split may come between ranges
            if pr.first == pr.last:
                b.jump(JEQ, R1, pr.first, target)
            else:
                nxt = f"ports_{tag}_{i}_next"
                b.jump(JLT, R1, pr.first, nxt)
                b.jump(JLE, R1, pr.last, target)
                b.label(nxt)
        for s in named:
            self._maybe_split()
            b = self.b
            self._ipset_lookup(s, leg)
            b.jump(JNE, R0, 0, target)
        if not negate:
            b = self.b
            b.ja(end)
            b.label(ok)

    def _icmp(self, icmp_type: int, icmp_code: int | None, end: str, *, negate: bool) -> None:
        b = self.b
        op = JEQ if negate else JNE
        if icmp_code is None:
            b.load(B, R1, R9, mt.STATE_OFF_ICMP_TYPE)
            b.jump(op, R1, icmp_type, end)
        else:
            b.load(H, R1, R9, mt.STATE_OFF_ICMP_TYPE)
            b.jump(op, R1, (icmp_code << 8) | icmp_type, end)


def log_filter_match_all(progs_fd: int) -> bytes:
    """The log-filter program for "debug everything": tail-call the debug main (cb[1]), else
    the fast main (cb[0]); TC_ACT_UNSPEC if neither is loaded."""
    b = asm.Block()
    b.mov64_reg(R6, asm.R1)
    for cb in (SKB_CB1, SKB_CB0):
        b.mov64_reg(R1, R6)
        b.ld_map_fd(R2, progs_fd)
        b.load(W, R3, R6, cb)
        b.call(asm.FN_TAIL_CALL)
    b.mov64_imm(R0, -1)
    b.exit()
    return b.assemble()
