"""The *tables rules BPF mode keeps (felixpy/rules/bpfmode.py): what cali-INPUT lets workloads
send to the host for each DefaultEndpointToHostAction, evaluated over the rendered rules."""

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
