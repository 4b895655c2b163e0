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
