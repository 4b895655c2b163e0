"""The *tables rules BPF mode keeps (felixpy/rules/bpfmode.py): what cali-INPUT lets workloads
send to the host for each DefaultEndpointToHostAction, what raw cali-PREROUTING marks, and what raw
cali-OUTPUT hands the TC egress program after untracked egress policy, evaluated over the rendered rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from felixpy.config import Config
from felixpy.dataplane.wiring import renderer_options
from felixpy.drivers.generictables.model import Accept, Drop, Return
from felixpy.rules import bpfmode
from felixpy.rules.renderer import RuleRenderer


def input_rules(action: str, v: int) -> list[str]:
    c = replace(Config(), BPFEnabled=True, DefaultEndpointToHostAction=action)
    ctx = RuleRenderer(c, v, options=renderer_options(c)).ctx
    return [f"{r.match} -> {type(r.action).__name__}" for r in bpfmode.input_chain(ctx).rules]


def _first_verdict(action: str, v: int, *, established: bool, icmpv6_type: int | None = None) -> type:
    """The action of the first cali-INPUT rule a SEEN packet from a workload matches."""
    c = replace(Config(), BPFEnabled=True, DefaultEndpointToHostAction=action)
    ctx = RuleRenderer(c, v, options=renderer_options(c)).ctx
    for r in bpfmode.input_chain(ctx).rules:
        names = {type(x).__name__: x for x in r.match.criteria}
        mark = names.get("MarkMatchesWithMask")
        if mark is not None and mark.mark != bpfmode.MARK_SEEN:
            continue  # the fall-through rules: not a SEEN packet
        if "ConntrackState" in names and not established:
            continue
        if "ICMPV6Type" in names and names["ICMPV6Type"].type != icmpv6_type:
            continue
        if "ProtocolNum" in names and icmpv6_type is None:
            continue
        if "InInterface" not in names:
            continue
        return type(r.action)
    raise AssertionError("no rule matched")


@pytest.mark.parametrize("v", [4, 6])
@pytest.mark.parametrize("action,new_flow", [("DROP", Drop), ("ACCEPT", Accept), ("RETURN", Return)])
def test_endpoint_to_host_action_applies_to_new_flows_only(v: int, action: str, new_flow: type) -> None:
    assert _first_verdict(action, v, established=False) is new_flow
    # A workload's reply to a flow the host opened is never cut by the action.
    assert _first_verdict(action, v, established=True) is Accept


@pytest.mark.parametrize("action", ["DROP", "RETURN"])
def test_ipv6_workloads_keep_reaching_their_router(action: str) -> None:
    for t in (130, 131, 132, 133, 135, 136):
        assert _first_verdict(action, 6, established=False, icmpv6_type=t) is Accept
    assert _first_verdict(action, 6, established=False, icmpv6_type=128) is not Accept  # echo: policy's
    assert not any("ICMPV6Type" in r for r in input_rules(action, 4))


def _raw_verdict(v: int, *, iface: str, mark: int, local: bool) -> tuple[str, int]:
    """(last action, mark after) for one packet walking raw cali-PREROUTING."""
    from felixpy.drivers.generictables.model import DestAddrType, InInterface, MarkClear, SetMaskedMark

    c = replace(Config(), BPFEnabled=True)
    ctx = RuleRenderer(c, v, options=renderer_options(c)).ctx
    for r in bpfmode.raw_prerouting_chain(ctx).rules:
        ok = True
        for crit in r.match.criteria:
            if isinstance(crit, InInterface):
                ok &= iface.startswith(crit.iface.rstrip("+*")) != crit.negate
            elif isinstance(crit, MarkClear):
                ok &= mark & crit.mark == 0
            elif isinstance(crit, DestAddrType):
                ok &= (crit.addr_type == "LOCAL" and local) != crit.negate
            else:  # the BYPASS_XDP exact match
                ok &= mark == bpfmode.MARK_BYPASS_XDP
        if not ok:
            continue
        if isinstance(r.action, SetMaskedMark):
            mark = (mark & ~r.action.mask) | r.action.mark
            continue
        return type(r.action).__name__, mark
    return "end", mark


@pytest.mark.parametrize("v", [4, 6])
def test_raw_prerouting_marks_host_bound_traffic_skip_fib_but_never_an_unseen_workloads(v: int) -> None:
    # From a host interface (or from a workload a program approved) to a local address: SKIP_FIB, so a
    # flow the host then DNATs to a workload keeps its replies in the host stack.
    assert _raw_verdict(v, iface="eth0", mark=0, local=True) == ("end", bpfmode.MARK_SKIP_FIB)
    assert _raw_verdict(v, iface="cali1", mark=bpfmode.MARK_SEEN, local=True) == ("end", bpfmode.MARK_SKIP_FIB)
    assert _raw_verdict(v, iface="eth0", mark=0, local=False) == ("end", 0)
    # A workload whose programs are not attached gets no SEEN bit here (INPUT's fail-closed drop sees it).
    assert _raw_verdict(v, iface="cali1", mark=0, local=True) == ("Return", 0)


# ------------------------------------------------------------------ raw cali-OUTPUT (untracked egress policy)
def _raw_output_walk(v: int, *, accepted: bool, mark: int = 0, vxlan: bool = False) -> tuple[str, int]:
    """(verdict, mark after) for a host-originated packet walking raw cali-OUTPUT; the host-endpoint dispatch
    it jumps to sets the accept bit when untracked egress policy *accepted* the packet."""
    from felixpy.drivers.generictables.model import (
        ClearMark, Jump, MarkMatchesWithMask, MarkSingleBitSet, NoTrack, Protocol, SetMaskedMark,
    )

    c = replace(Config(), BPFEnabled=True, VXLANEnabled=vxlan)
    r = RuleRenderer(c, v, options=renderer_options(c))
    for rule in bpfmode.raw_output_chain(r.ctx).rules:
        crit = rule.match.criteria
        if any(isinstance(x, Protocol) for x in crit):
            continue  # the VXLAN NOTRACK rule: not a VXLAN packet
        if any(isinstance(x, MarkSingleBitSet) and not mark & x.mark for x in crit):
            continue
        if any(isinstance(x, MarkMatchesWithMask) and mark & x.mask != x.mark for x in crit):
            continue
        a = rule.action
        if isinstance(a, ClearMark):
            mark &= ~a.mark
        elif isinstance(a, Jump):
            assert a.target == "cali-to-host-endpoint"
            mark |= r.marks.accept if accepted else 0
        elif isinstance(a, SetMaskedMark):
            mark = (mark & ~a.mask) | a.mark
        elif isinstance(a, NoTrack):
            raise AssertionError("NOTRACK without a protocol match")
        else:
            return type(a).__name__, mark
    return "end", mark


@pytest.mark.parametrize("v", [4, 6])
@pytest.mark.parametrize("vxlan", [False, True])
def test_raw_output_hands_what_untracked_egress_policy_accepted_to_the_tc_program_as_bypass(v: int,
                                                                                         vxlan: bool) -> None:
    # Accepted: exactly BYPASS (the TC egress program compares the whole mark), then ACCEPT.
    assert _raw_output_walk(v, accepted=True, vxlan=vxlan) == ("Accept", bpfmode.MARK_BYPASS)
    assert _raw_output_walk(v, accepted=True, mark=0x4000, vxlan=vxlan) == ("Accept", bpfmode.MARK_BYPASS)
    # Not accepted (no untracked policy, or none matched): on to the tracked path, a socket's mark kept, and
    # a stale accept bit from someone else's rules cleared first.
    assert _raw_output_walk(v, accepted=False, mark=0x4000, vxlan=vxlan) == ("end", 0x4000)
    c = replace(Config(), BPFEnabled=True)
    accept_bit = RuleRenderer(c, v, options=renderer_options(c)).marks.accept
    assert _raw_output_walk(v, accepted=False, mark=accept_bit, vxlan=vxlan) == ("end", 0)


@pytest.mark.parametrize("v", [4, 6])
def test_bpf_mode_raw_output_is_the_tables_modes_chain_with_the_bypass_mark(v: int) -> None:
    from felixpy.drivers.generictables.model import Accept, Jump, Match, Rule, SetMaskedMark
    from felixpy.rules import static
    from felixpy.rules.names import CHAIN_DISPATCH_TO_HOST_ENDPOINT, CHAIN_FAILSAFE_OUT, CHAIN_RAW_OUTPUT

    c = replace(Config(), BPFEnabled=True)
    ctx = RuleRenderer(c, v, options=renderer_options(c)).ctx
    raw = {ch.name: ch for ch in bpfmode.static_chains(ctx, "raw")}
    out, tables_mode = raw[CHAIN_RAW_OUTPUT], static.raw_output_chain(ctx)
    accepted = Match().mark_single_bit_set(ctx.marks.accept)
    assert out.rules[:-2] == tables_mode.rules[:-1]  # clear our bits, jump to cali-to-host-endpoint
    assert tables_mode.rules[-1] == Rule(accepted, Accept())
    assert out.rules[-2:] == (Rule(accepted, SetMaskedMark(bpfmode.MARK_BYPASS, 0xFFFFFFFF)),
                              Rule(Match().mark_matches_with_mask(bpfmode.MARK_BYPASS, 0xFFFFFFFF), Accept()))
    assert Rule(Match(), Jump(CHAIN_DISPATCH_TO_HOST_ENDPOINT)) in out.rules
    # The untracked endpoint chains jump to the raw failsafes (the dispatch chain is the host-endpoint
    # manager's, created at its first apply); raw PREROUTING is unchanged.
    assert raw[CHAIN_FAILSAFE_OUT] == static.failsafe_out_chain(ctx, "raw")
    assert raw["cali-PREROUTING"] == bpfmode.raw_prerouting_chain(ctx)
    hooks = {(h.chain, h.rules) for h in bpfmode.kernel_hooks(ctx) if h.table == "raw"}
    assert hooks == {("PREROUTING", (Rule(Match(), Jump("cali-PREROUTING")),)),
                     ("OUTPUT", (Rule(Match(), Jump(CHAIN_RAW_OUTPUT)),))}


@pytest.mark.parametrize("v", [4, 6])
def test_bpf_mode_raw_output_renders_for_both_backends(v: int) -> None:
    from felixpy.drivers.iptables.detect import Features
    from felixpy.drivers.iptables.render import render_body
    from felixpy.drivers.nftables.render import rule_text

    c = replace(Config(), BPFEnabled=True)
    ctx = RuleRenderer(c, v, options=renderer_options(c)).ctx
    rules = bpfmode.raw_output_chain(ctx).rules
    assert [render_body(r, Features()) for r in rules[-2:]] == [
        "-m mark --mark 0x10000/0x10000 --jump MARK --set-mark 0x3000000/0xffffffff",
        "-m mark --mark 0x3000000/0xffffffff --jump ACCEPT"]
    assert [rule_text(r, v) for r in rules[-2:]] == [
        "meta mark & 0x10000 == 0x10000 counter meta mark set mark & 0x0 ^ 0x3000000",
        "meta mark & 0xffffffff == 0x3000000 counter accept"]


# ------------------------------------------------------------------ BPFHostConntrackBypass (raw untracked flows)
def _bypass_ctx(v: int, bypass: bool, **changes: object):  # type: ignore[no-untyped-def]
    c = replace(Config(), BPFEnabled=True, BPFHostConntrackBypass=bypass, **changes)
    return RuleRenderer(c, v, options=renderer_options(c)).ctx


def _untracked_walk(v: int, *, iface: str, dst_local: bool, dst: str, mark: int, **changes: object) -> str:
    """What raw cali-PREROUTING (and the cali-untracked-flows it may go to) does with one packet:
    "notrack", or "tracked" when it leaves raw without NOTRACK."""
    import ipaddress

    from felixpy.drivers.generictables.model import (
        DestAddrType, DestNet, Goto, InInterface, MarkClear, MarkMatchesWithMask, NoTrack, SetMaskedMark,
    )

    ctx = _bypass_ctx(v, True, **changes)
    chains = {ch.name: ch for ch in bpfmode.static_chains(ctx, "raw")}
    chain = chains["cali-PREROUTING"]
    while True:
        for r in chain.rules:
            ok = True
            for crit in r.match.criteria:
                if isinstance(crit, InInterface):
                    name = crit.iface
                    ok &= (iface.startswith(name[:-1]) if name.endswith("+") else iface == name) != crit.negate
                elif isinstance(crit, MarkClear):
                    ok &= mark & crit.mark == 0
                elif isinstance(crit, MarkMatchesWithMask):
                    ok &= mark & crit.mask == crit.mark
                elif isinstance(crit, DestAddrType):
                    ok &= (crit.addr_type == "LOCAL" and dst_local) != crit.negate
                elif isinstance(crit, DestNet):
                    ok &= ipaddress.ip_address(dst) in ipaddress.ip_network(crit.net)
                else:
                    raise AssertionError(f"unexpected criterion {crit!r}")
            if not ok:
                continue
            a = r.action
            if isinstance(a, SetMaskedMark):
                mark = (mark & ~a.mask) | a.mark
                continue
            if isinstance(a, Goto):
                chain = chains[a.target]
                break
            if isinstance(a, NoTrack):
                return "notrack"
            return "tracked"  # Return
        else:
            return "tracked"


@pytest.mark.parametrize("v", [4, 6])
def test_without_host_conntrack_bypass_untracked_flows_is_empty_and_unreferenced(v: int) -> None:
    from felixpy.drivers.generictables.model import Goto

    ctx = _bypass_ctx(v, False)
    raw = {ch.name: ch for ch in bpfmode.static_chains(ctx, "raw")}
    assert raw["cali-untracked-flows"].rules == ()
    assert not any(isinstance(r.action, Goto) and r.action.target == "cali-untracked-flows"
                   for r in raw["cali-PREROUTING"].rules)


@pytest.mark.parametrize("v", [4, 6])
def test_host_conntrack_bypass_notracks_forwarded_traffic_but_what_linux_must_track(v: int) -> None:
    peer, link_local = ("10.96.0.2", "169.254.1.1") if v == 4 else ("fd00:96::2", "fe80::1")
    walk = _untracked_walk
    # Forwarded traffic the programs handle: out of Linux conntrack, from a workload or from the uplink.
    assert walk(v, iface="cali1", dst_local=False, dst=peer, mark=bpfmode.MARK_BYPASS) == "notrack"
    assert walk(v, iface="eth0", dst_local=False, dst=peer, mark=bpfmode.MARK_SEEN) == "notrack"
    assert walk(v, iface="eth0", dst_local=False, dst=peer, mark=0) == "notrack"
    # Kept in Linux conntrack: to the host itself, link-local, docker (the default force-track filter),
    # and what the programs handed to the host stack on purpose.
    assert walk(v, iface="eth0", dst_local=True, dst=peer, mark=0) == "tracked"
    assert walk(v, iface="eth0", dst_local=False, dst=link_local, mark=0) == "tracked"
    assert walk(v, iface="docker0", dst_local=False, dst=peer, mark=0) == "tracked"
    for m in (bpfmode.MARK_SKIP_FIB, bpfmode.MARK_FALLTHROUGH, bpfmode.MARK_MASQ, bpfmode.MARK_NAT_OUT):
        assert walk(v, iface="cali1", dst_local=False, dst=peer, mark=m) == "tracked", hex(m)
    # An unseen workload's packets are not touched (they are dropped in filter, tracked or not).
    assert walk(v, iface="cali1", dst_local=False, dst=peer, mark=0) == "tracked"
    # A custom force-track list replaces the default one.
    custom = {"BPFForceTrackPacketsFromIfaces": ("br0", "vm+")}
    assert walk(v, iface="docker0", dst_local=False, dst=peer, mark=0, **custom) == "notrack"
    assert walk(v, iface="br0", dst_local=False, dst=peer, mark=0, **custom) == "tracked"
    assert walk(v, iface="vm12", dst_local=False, dst=peer, mark=0, **custom) == "tracked"
    assert walk(v, iface="br01", dst_local=False, dst=peer, mark=0, **custom) == "notrack"


@pytest.mark.parametrize("v", [4, 6])
def test_host_conntrack_bypass_chains_render_as_felix_in_both_backends(v: int) -> None:
    from felixpy.drivers.iptables.detect import Features
    from felixpy.drivers.iptables.render import render_body
    from felixpy.drivers.nftables.render import rule_text

    ctx = _bypass_ctx(v, True)
    raw = {ch.name: ch for ch in bpfmode.static_chains(ctx, "raw")}
    link_local = "169.254.0.0/16" if v == 4 else "fe80::/10"
    assert [render_body(r, Features()) for r in raw["cali-untracked-flows"].rules] == [
        '-m comment --comment "Track interface docker+" --in-interface docker+ --jump RETURN',
        f'-m comment --comment "link-local" --destination {link_local} --jump RETURN',
        '-m comment --comment "MarkSeenSkipFIB Mark" -m mark --mark 0x1100000/0x1100000 --jump RETURN',
        '-m comment --comment "MarkSeenFallThrough Mark" -m mark --mark 0x5000000/0x5000000 --jump RETURN',
        '-m comment --comment "MarkSeenMASQ Mark" -m mark --mark 0x3600000/0x3f00000 --jump RETURN',
        '-m comment --comment "MarkSeenNATOutgoing Mark" -m mark --mark 0x3800000/0x3f00000 --jump RETURN',
        "--jump NOTRACK"]
    assert render_body(raw["cali-PREROUTING"].rules[-1], Features()) == (
        '-m comment --comment "Check if forwarded traffic needs to be TRACKed" -m addrtype ! --dst-type LOCAL '
        '--goto cali-untracked-flows')
    nft = [rule_text(r, v) for r in raw["cali-untracked-flows"].rules]
    assert nft[0] == "iifname docker* counter return" and nft[-1].endswith("notrack")
