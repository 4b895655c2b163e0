"""Dispatch chains (reference §2.3): Felix's prefix tree, the TwoLevel design, nft maps, fail-closed."""

from __future__ import annotations

import hashlib
import statistics

import pytest
from structlog.testing import capture_logs

from felixpy.drivers.generictables.model import Chain, Drop, Goto, Match, Reject, Return, Rule, SetMaskedMark
from felixpy.rules import ALL_INTERFACES
from felixpy.rules.dispatch import TWO_LEVEL_SPLIT_THRESHOLD, count_dispatch_evaluations, trace_dispatch

from .conftest import renderer

UNKNOWN = Rule(Match(), Drop(), ("Unknown interface",))
FROM, TO = "cali-from-wl-dispatch", "cali-to-wl-dispatch"


def calico_iface(i: int) -> str:
    """Names like Calico's CNI makes: "cali" + 11 hex chars of a hash."""
    return "cali" + hashlib.sha1(f"ns/pod-{i}".encode()).hexdigest()[:11]


def by_name(chains: list[Chain]) -> dict[str, Chain]:
    return {c.name: c for c in chains}


def check_tree(chains: list[Chain], names: list[str], root: str, prefix: str) -> list[int]:
    """Every name reaches its endpoint chain; unknown names hit the deny; every chain ends fail-closed."""
    for c in chains:
        if c.name.startswith(root):
            assert c.rules[-1] == UNKNOWN, c.name
    costs = []
    for n in names:
        cost, action = trace_dispatch(chains, root, n)
        assert action == Goto(prefix + n), n
        costs.append(cost)
    for unknown in ("califfffffffffff", names[0] + "x", "cali", "eth0", names[-1][:-1] + "!"):
        if unknown in names:
            continue
        assert trace_dispatch(chains, root, unknown)[1] == Drop(), unknown
    return costs


def test_one_interface() -> None:
    chains = renderer(4).workload_dispatch_chains(["cali1234"])
    assert chains == [
        Chain(FROM, (Rule(Match().in_interface("cali1234"), Goto("cali-fw-cali1234")), UNKNOWN)),
        Chain(TO, (Rule(Match().out_interface("cali1234"), Goto("cali-tw-cali1234")), UNKNOWN)),
    ]


def test_no_interfaces_is_still_fail_closed() -> None:
    assert renderer(4).workload_dispatch_chains([]) == [Chain(FROM, (UNKNOWN,)), Chain(TO, (UNKNOWN,))]


def test_two_interfaces() -> None:
    chains = renderer(4).workload_dispatch_chains(["calib", "calia"])
    assert chains[0] == Chain(FROM, (
        Rule(Match().in_interface("calia"), Goto("cali-fw-calia")),
        Rule(Match().in_interface("calib"), Goto("cali-fw-calib")),
        UNKNOWN,
    ))


def test_prefix_tree_shape() -> None:
    names = ["cali12", "cali13", "cali2", "cali34", "tap0"]
    chains = by_name(renderer(4, IptablesFilterDenyAction="REJECT").workload_dispatch_chains(names))
    unknown = Rule(Match(), Reject(), ("Unknown interface",))
    # Common prefix "" → bins "c" (4 names, child chain) and "t" (1 name, direct).
    assert chains[FROM] == Chain(FROM, (
        Rule(Match().in_interface("c+"), Goto("cali-from-wl-dispatch-c")),
        Rule(Match().in_interface("tap0"), Goto("cali-fw-tap0")),
        unknown,
    ))
    assert chains["cali-from-wl-dispatch-c"] == Chain("cali-from-wl-dispatch-c", tuple(
        Rule(Match().in_interface(n), Goto(f"cali-fw-{n}")) for n in names[:4]) + (unknown,))
    assert chains["cali-to-wl-dispatch-c"].rules[0] == Rule(Match().out_interface("cali12"), Goto("cali-tw-cali12"))


def test_forty_interfaces() -> None:
    names = sorted(calico_iface(i) for i in range(40))
    chains = renderer(4).workload_dispatch_chains(names)
    costs = check_tree(chains, names, FROM, "cali-fw-")
    root = by_name(chains)[FROM]
    next_chars = sorted({n[4] for n in names})
    assert len(root.rules) == len(next_chars) + 1
    assert max(costs) <= len(next_chars) + 1 + 40 // len(next_chars) + 8
    check_tree(chains, names, TO, "cali-tw-")


@pytest.mark.parametrize("mode", ["Felix", "TwoLevel"])
def test_thousand_interfaces_both_modes(mode: str) -> None:
    names = sorted(calico_iface(i) for i in range(1000))
    chains = renderer(4, DispatchChainMode=mode).workload_dispatch_chains(names)
    check_tree(chains, names, FROM, "cali-fw-")
    check_tree(chains, names, TO, "cali-tw-")
    assert all(len(c.name) <= 28 for c in chains)
    assert len({c.name for c in chains}) == len(chains)


def test_two_level_evaluates_fewer_rules_at_scale() -> None:
    names = sorted(calico_iface(i) for i in range(1000))
    felix = renderer(4).workload_dispatch_chains(names)
    two = renderer(4, DispatchChainMode="TwoLevel").workload_dispatch_chains(names)
    f = [count_dispatch_evaluations(felix, FROM, n) for n in names]
    t = [count_dispatch_evaluations(two, FROM, n) for n in names]
    assert max(t) < max(f) and statistics.mean(t) < statistics.mean(f) / 1.5
    assert max(f) >= 70 and max(t) <= 45       # ~16 + 64 vs ~16 + 16 + ~8
    # Unknown interfaces (the fail-closed path) are cheaper too.
    assert count_dispatch_evaluations(two, FROM, "cali0zzzzzzzzzz") <= count_dispatch_evaluations(
        felix, FROM, "cali0zzzzzzzzzz")


def test_two_level_is_felix_for_small_bins() -> None:
    names = sorted(calico_iface(i) for i in range(40))
    assert all(n for n in names)
    assert renderer(4, DispatchChainMode="TwoLevel").workload_dispatch_chains(names) == \
        renderer(4).workload_dispatch_chains(names)
    big = [f"cali0{i:03d}" for i in range(TWO_LEVEL_SPLIT_THRESHOLD + 1)]
    chains = by_name(renderer(4, DispatchChainMode="TwoLevel").workload_dispatch_chains(big + ["cali1"]))
    assert "cali-from-wl-dispatch-0" in chains
    assert {"cali-from-wl-dispatch-0-0", "cali-from-wl-dispatch-0-1"} <= set(chains)
    assert chains["cali-from-wl-dispatch-0"].rules[0] == Rule(Match().in_interface("cali000+"),
                                                              Goto("cali-from-wl-dispatch-0-0"))


def test_duplicate_and_empty_names_are_logged_and_skipped() -> None:
    with capture_logs() as logs:
        chains = renderer(4).workload_dispatch_chains(["cali1", "cali1", ""])
    assert chains[0] == Chain(FROM, (Rule(Match().in_interface("cali1"), Goto("cali-fw-cali1")), UNKNOWN))
    assert sum(e["log_level"] == "error" for e in logs) >= 2


def test_nftables_uses_verdict_maps() -> None:
    r = renderer(4, NFTablesMode="Enabled")
    names = [calico_iface(i) for i in range(1000)]
    chains = r.workload_dispatch_chains(names)
    assert chains == [
        Chain(FROM, (Rule(Match().in_interface_vmap("cali-from-wl-dispatch")), UNKNOWN)),
        Chain(TO, (Rule(Match().out_interface_vmap("cali-to-wl-dispatch")), UNKNOWN)),
    ]
    (from_meta, from_map), (to_meta, to_map) = r.workload_dispatch_maps(names)
    assert from_meta.name == "cali-from-wl-dispatch" and from_meta.key_type == "ifname"
    assert to_meta.name == "cali-to-wl-dispatch"
    assert from_map[names[0]] == Goto("cali-fw-" + names[0]) and to_map[names[0]] == Goto("cali-tw-" + names[0])
    maps = {from_meta.name: from_map, to_meta.name: to_map}
    assert trace_dispatch(chains, FROM, names[7], maps) == (1, Goto("cali-fw-" + names[7]))
    assert trace_dispatch(chains, TO, "calinew", maps) == (2, Drop())  # fail closed


def test_host_dispatch_without_wildcard_endpoint_falls_through() -> None:
    chains = by_name(renderer(4).host_dispatch_chains(["eth0", "eth1"], apply_on_forward=True))
    assert set(chains) == {"cali-from-host-endpoint", "cali-to-host-endpoint", "cali-from-hep-forward",
                           "cali-to-hep-forward"}
    assert chains["cali-from-host-endpoint"] == Chain("cali-from-host-endpoint", (
        Rule(Match().in_interface("eth0"), Goto("cali-fh-eth0")),
        Rule(Match().in_interface("eth1"), Goto("cali-fh-eth1")),
    ))
    assert chains["cali-to-hep-forward"].rules[1] == Rule(Match().out_interface("eth1"), Goto("cali-thfw-eth1"))
    assert trace_dispatch(list(chains.values()), "cali-from-host-endpoint", "eth9") == (2, None)


def test_host_dispatch_with_wildcard_endpoint() -> None:
    r = renderer(4)
    chains = by_name(r.host_dispatch_chains(["eth0"], ALL_INTERFACES, apply_on_forward=False))
    assert chains["cali-from-host-endpoint"].rules[-1] == Rule(Match(), Goto("cali-fh-any-interface-at-all"))
    assert chains["cali-to-host-endpoint"].rules[-2:] == (
        Rule(Match().out_interface("cali+"), Return(), ("Skip egress WHEP policy for traffic to local workload",)),
        Rule(Match(), Goto("cali-th-any-interface-at-all")),
    )
    fwd = by_name(r.host_dispatch_chains(["eth0"], ALL_INTERFACES, apply_on_forward=True))
    assert fwd["cali-to-host-endpoint"].rules[-1] == Rule(Match(), Goto("cali-th-any-interface-at-all"))
    assert fwd["cali-to-hep-forward"].rules[-1] == Rule(Match(), Goto("cali-thfw-_Nqh4HyA73udmyanQI"))
    assert [c.name for c in r.from_host_dispatch_chains(["eth0"])] == ["cali-from-host-endpoint"]
    assert [c.name for c in r.to_host_dispatch_chains(["eth0"], ALL_INTERFACES)] == ["cali-to-host-endpoint"]


def test_endpoint_mark_dispatch_for_ipvs() -> None:
    from felixpy.rules import RendererOptions

    r = renderer(4, options=RendererOptions(kube_ipvs_support=True))
    mapper = r.new_endpoint_mark_mapper()
    chains = by_name(r.endpoint_mark_dispatch_chains(mapper, ["cali1", "cali2"], ["eth0"]))
    set_mark = chains["cali-set-endpoint-mark"]
    assert set_mark.rules[-2:] == (
        Rule(Match().in_interface("cali+"), Drop(), ("Unknown endpoint",)),
        Rule(Match(), SetMaskedMark(r.marks.non_calico_endpoint, r.marks.endpoint), ("Non-Cali endpoint mark",)),
    )
    from_mark = chains["cali-from-endpoint-mark"]
    m1 = mapper.get_endpoint_mark("cali1")
    assert m1 is not None and m1 & ~r.marks.endpoint == 0 and m1 != r.marks.non_calico_endpoint
    assert from_mark.rules[0] == Rule(Match().mark_matches_with_mask(m1, r.marks.endpoint), Goto("cali-fw-cali1"))
    assert from_mark.rules[2].action == Goto("cali-fhfw-eth0")
    assert from_mark.rules[-1] == UNKNOWN
    assert trace_dispatch(list(chains.values()), "cali-from-endpoint-mark", "", mark=m1)[1] == Goto("cali-fw-cali1")
