"""EndpointManager (with the policy and other managers) over fake tables, ipsets, netlink and /proc/sys.

Every test runs on a dual-stack node and most are parametrised over the family
they look at; :meth:`Node.apply` checks after every apply that no programmed
rule jumps to an undefined chain or references a missing IP set.
"""

from __future__ import annotations

import pytest

from felixpy.config import Config
from felixpy.drivers.generictables.model import Accept, Chain, Drop, Goto, InInterface, SourceNet
from felixpy.ifacemonitor.events import IfaceState, IfaceStateUpdate
from felixpy.managers.endpoints import proto_id
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import trace_dispatch
from felixpy.rules.names import CHAIN_FROM_WORKLOAD_DISPATCH, CHAIN_TO_WORKLOAD_DISPATCH
from felixpy.drivers.generictables.fake import FakeTable

from .harness import (
    Node,
    ipset,
    policy,
    policy_remove,
    profile,
    rule,
    tier,
    wep,
    wep_remove,
    wid,
    wkey,
)

MAC = "02:00:00:00:00:0a"


def ip(v: int, i: int) -> str:
    return f"10.65.0.{i}/32" if v == 4 else f"fd00:65::{i}/128"


def addrs(i: int) -> dict[str, list[str]]:
    return {"ipv4": [ip(4, i)], "ipv6": [ip(6, i)]}


def pi(name: str) -> str:
    return f"cali-pi-gnp/{name}"


def po(name: str) -> str:
    return f"cali-po-gnp/{name}"


def dispatch_chains(t: FakeTable) -> list[Chain]:
    return [c for n, c in t.state.chains.items()
            if n.startswith((CHAIN_FROM_WORKLOAD_DISPATCH, CHAIN_TO_WORKLOAD_DISPATCH))]


def dispatched(t: FakeTable, iface: str) -> tuple[object, object]:
    """Where a packet from / to ``iface`` ends up after the programmed dispatch chains."""
    chains = dispatch_chains(t)
    return (trace_dispatch(chains, CHAIN_FROM_WORKLOAD_DISPATCH, iface)[1],
            trace_dispatch(chains, CHAIN_TO_WORKLOAD_DISPATCH, iface)[1])


def is_unknown_iface_drop(rule_: object) -> bool:
    return getattr(rule_, "action", None) == Drop() and getattr(rule_, "comments", ()) == ("Unknown interface",)


def base(node: Node, *, ep_policies: tuple[str, ...] = ("p1",)) -> None:
    """A profile, a policy and one endpoint on an existing, up interface."""
    node.send(profile("kns.default"), *(policy(p, inbound=[rule("allow", protocol="tcp", dst_ports=[80])])
                                        for p in ep_policies),
              wep("a", mac=MAC, profiles=["kns.default"], tiers=[tier(ingress=ep_policies)], **addrs(1)))
    node.link_up("calia")
    node.apply()


# ------------------------------------------------------------------------------- add / update / remove
def test_endpoint_add_programs_its_chains_and_their_policies(node: Node, v: int) -> None:
    base(node)
    f = node.f(v).filter
    assert f.is_programmed("cali-tw-calia") and f.is_programmed("cali-fw-calia")
    assert f.targets_of("cali-tw-calia") == [pi("p1"), "cali-pri-kns.default"]
    assert f.targets_of("cali-fw-calia") == ["cali-pro-kns.default"]
    assert f.is_programmed(pi("p1")) and f.is_programmed("cali-pri-kns.default")
    assert not f.is_programmed(po("p1"))  # recorded, but no endpoint has it as egress policy
    for other in ("raw", "mangle"):
        assert not node.f(v).tables[other].is_programmed(pi("p1"))
    assert dispatched(f, "calia") == (Goto("cali-fw-calia"), Goto("cali-tw-calia"))
    assert node.status == {wkey("a"): "up"}


def test_endpoint_update_moves_its_policy_references(node: Node, v: int) -> None:
    base(node)
    node.send(policy("p2", outbound=[rule("deny")]),
              wep("a", mac=MAC, profiles=["kns.default"], tiers=[tier(egress=["p2"])], **addrs(1)))
    node.apply()
    f = node.f(v).filter
    assert not f.is_programmed(pi("p1"))
    assert f.targets_of("cali-fw-calia") == [po("p2"), "cali-pro-kns.default"]
    assert f.targets_of("cali-tw-calia") == ["cali-pri-kns.default"]
    assert f.is_programmed(po("p2"))
    # The policy itself changes: the endpoint chain stays, the policy chain is rewritten.
    node.send(policy("p2", outbound=[rule("allow")]))
    node.apply()
    assert f.last_changed == {po("p2")}


def test_endpoint_remove_cleans_up_everything(node: Node, v: int) -> None:
    base(node)
    node.send(wep_remove("a"))
    node.apply()
    f = node.f(v).filter
    assert not f.programmed_names() & {"cali-tw-calia", "cali-fw-calia", pi("p1"), "cali-pri-kns.default"}
    assert not f.recorded_names() & {"cali-tw-calia", "cali-fw-calia"}
    assert dispatched(f, "calia") == (Drop(), Drop())
    assert node.routes(v) == {}
    assert node.status == {}
    assert node.status_updates[-1].status == ""


def test_policy_removed_after_its_endpoint_reference_is_gone(node: Node, v: int) -> None:
    base(node)
    node.send(wep("a", mac=MAC, profiles=["kns.default"], **addrs(1)), policy_remove("p1"))
    node.apply()
    assert pi("p1") not in node.f(v).filter.recorded_names()


# -------------------------------------------------------------------------------------- rename
def test_interface_rename_moves_chains_routes_and_dispatch(node: Node, v: int) -> None:
    base(node)
    node.link_up("calib")
    node.send(wep("a", "calib", mac=MAC, profiles=["kns.default"], tiers=[tier(ingress=["p1"])], **addrs(1)))
    node.apply()
    f = node.f(v).filter
    assert not f.recorded_names() & {"cali-tw-calia", "cali-fw-calia"}
    assert f.targets_of("cali-tw-calib") == [pi("p1"), "cali-pri-kns.default"]
    assert dispatched(f, "calia") == (Drop(), Drop())
    assert dispatched(f, "calib") == (Goto("cali-fw-calib"), Goto("cali-tw-calib"))
    assert node.routes(v)[ip(v, 1)].oif == node.ifindex("calib")
    assert node.status == {wkey("a"): "up"}


# ------------------------------------------------------------------------- shared interface names
def _shared(node: Node, first: str, second: str) -> None:
    node.send(profile("prof-a"), profile("prof-b"))
    for name in (first, second):
        node.send(wep(name, "calishared", mac=MAC, profiles=[f"prof-{name}"], **addrs(ord(name[0]) - 96)))
        node.apply()


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")], ids=["lower-first", "higher-first"])
def test_two_endpoints_on_one_interface_lower_id_wins_and_the_other_takes_over(node: Node, v: int,
                                                                               order: tuple[str, str]) -> None:
    node.link_up("calishared")
    _shared(node, *order)
    f = node.f(v).filter
    assert f.targets_of("cali-tw-calishared") == ["cali-pri-prof-a"]
    assert set(node.routes(v)) == {ip(v, 1)}
    assert node.status.get(wkey("a")) == "up"
    node.send(wep_remove("a"))
    node.apply()
    assert f.targets_of("cali-tw-calishared") == ["cali-pri-prof-b"]
    assert not f.is_programmed("cali-pri-prof-a")
    assert set(node.routes(v)) == {ip(v, 2)}
    assert node.status == {wkey("b"): "up"}
    node.send(wep_remove("b"))
    node.apply()
    assert not f.recorded_names() & {"cali-tw-calishared", "cali-fw-calishared"}
    assert node.routes(v) == {}
    assert node.status == {}


def test_active_endpoints_keep_their_name_state_and_wire_bytes_not_the_parsed_message(node: Node, v: int) -> None:
    """#17, memory: a parsed endpoint update stays resident at ~2.4 KiB (its id alone keeps all of it alive),
    so the manager keeps what it reads later; the loser of a shared interface is parsed again when it loses
    (the takeover tests above and below run through that)."""
    node.link_up("calishared")
    _shared(node, "a", "b")
    act = node.f(v).endpoints._active[wkey("a")]
    assert (act.name, act.active, type(act.wire)) == ("calishared", True, bytes)
    assert pb.WorkloadEndpoint.FromString(act.wire).profile_ids == ["prof-a"]
    # Nor a message for its id (built from the key when reported); the status combiner keeps none between reports.
    assert not hasattr(act, "proto_id")
    assert proto_id(wkey("a")) == wid("a")
    assert not node.combiner._ids


def test_shadowed_endpoint_takes_over_when_the_winner_is_renamed_away(node: Node, v: int) -> None:
    node.link_up("calishared")
    node.link_up("calielse")
    _shared(node, "a", "b")
    node.send(wep("a", "calielse", mac=MAC, profiles=["prof-a"], **addrs(1)))
    node.apply()
    f = node.f(v).filter
    assert f.targets_of("cali-tw-calielse") == ["cali-pri-prof-a"]
    assert f.targets_of("cali-tw-calishared") == ["cali-pri-prof-b"]
    assert node.routes(v)[ip(v, 2)].oif == node.ifindex("calishared")
    assert node.status == {wkey("a"): "up", wkey("b"): "up"}


def test_removing_a_shadowed_endpoint_leaves_the_winner_alone(node: Node, v: int) -> None:
    node.link_up("calishared")
    _shared(node, "a", "b")
    node.send(wep_remove("b"))
    node.apply()
    assert node.f(v).filter.targets_of("cali-tw-calishared") == ["cali-pri-prof-a"]
    assert set(node.routes(v)) == {ip(v, 1)}
    assert node.status == {wkey("a"): "up"}


def test_shadowed_endpoints_newer_update_in_the_winners_removal_batch_wins(node: Node, v: int) -> None:
    node.link_up("calishared")
    _shared(node, "a", "b")
    node.send(profile("prof-new"), wep("b", "calishared", mac=MAC, profiles=["prof-new"], **addrs(2)),
              wep_remove("a"))
    node.apply()
    assert node.f(v).filter.targets_of("cali-tw-calishared") == ["cali-pri-prof-new"]
    assert node.status == {wkey("b"): "up"}


def test_next_shadowed_candidate_takes_over_when_the_first_is_removed_too(node: Node, v: int) -> None:
    node.link_up("calishared")
    node.send(profile("prof-c"))
    _shared(node, "a", "b")
    node.send(wep("c", "calishared", mac=MAC, profiles=["prof-c"], **addrs(3)))
    node.apply()
    node.send(wep_remove("b"), wep_remove("a"))
    node.apply()
    assert node.f(v).filter.targets_of("cali-tw-calishared") == ["cali-pri-prof-c"]
    assert set(node.routes(v)) == {ip(v, 3)}


# ---------------------------------------------------------------------------------- policy groups
def test_policy_groups_are_shared_refcounted_and_released(node: Node, v: int) -> None:
    sel = "role == 'web'"
    node.send(profile("prof"),
              policy("g1", inbound=[rule("allow", protocol="tcp", dst_ports=[80])], selector=sel),
              policy("g2", inbound=[rule("allow", protocol="tcp", dst_ports=[443])], selector=sel),
              policy("solo", inbound=[rule("deny")], selector="role == 'db'"))
    tiers = [tier(ingress=["g1", "g2", "solo"])]
    for name in ("a", "b"):
        node.send(wep(name, mac=MAC, profiles=["prof"], tiers=tiers, **addrs(ord(name) - 96)))
    node.apply()
    f = node.f(v).filter
    groups = [t for t in f.targets_of("cali-tw-calia") if t.startswith("cali-gi-")]
    assert len(groups) == 1
    group = groups[0]
    assert f.targets_of("cali-tw-calia") == [group, pi("solo"), "cali-pri-prof"]  # solo is inlined
    assert f.targets_of("cali-tw-calib") == f.targets_of("cali-tw-calia")  # one chain, shared
    assert f.targets_of(group) == [pi("g1"), pi("g2")]
    node.send(wep_remove("a"))
    node.apply()
    assert f.is_programmed(group)
    node.send(wep_remove("b"))
    node.apply()
    assert group not in f.recorded_names()
    assert not f.programmed_names() & {pi("g1"), pi("g2"), pi("solo")}


def test_group_released_when_an_endpoint_stops_using_it(node: Node, v: int) -> None:
    sel = "all()"
    node.send(profile("prof"), policy("g1", inbound=[rule()], selector=sel),
              policy("g2", inbound=[rule()], selector=sel),
              wep("a", mac=MAC, profiles=["prof"], tiers=[tier(ingress=["g1", "g2"])], **addrs(1)))
    node.apply()
    f = node.f(v).filter
    (group,) = [t for t in f.targets_of("cali-tw-calia") if t.startswith("cali-gi-")]
    node.send(wep("a", mac=MAC, profiles=["prof"], tiers=[tier(ingress=["g1"])], **addrs(1)))
    node.apply()
    assert group not in f.recorded_names()
    assert f.targets_of("cali-tw-calia") == [pi("g1"), "cali-pri-prof"]


# ------------------------------------------------------------------------------------- dispatch
def test_dispatch_with_no_endpoints_drops_everything_from_and_to_workloads(node: Node, v: int) -> None:
    node.apply()
    f = node.f(v).filter
    for root in (CHAIN_FROM_WORKLOAD_DISPATCH, CHAIN_TO_WORKLOAD_DISPATCH):
        (only,) = f.programmed_chain(root).rules
        assert is_unknown_iface_drop(only)
    assert dispatched(f, "calinew") == (Drop(), Drop())


def test_dispatch_with_one_endpoint(node: Node, v: int) -> None:
    base(node)
    f = node.f(v).filter
    rules = f.programmed_chain(CHAIN_FROM_WORKLOAD_DISPATCH).rules
    assert [(r.match.criteria, r.action) for r in rules[:-1]] == [((InInterface("calia"),), Goto("cali-fw-calia"))]
    assert is_unknown_iface_drop(rules[-1])
    assert dispatched(f, "calib") == (Drop(), Drop())


def test_dispatch_is_rendered_again_only_when_the_interface_names_change(node: Node, v: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatch chains are a function of the set of interface names alone: an endpoint update that
    keeps its interface (churn: new policies, new addresses) must not re-render them, while one that adds,
    renames or removes an interface must — and what is programmed stays right either way."""
    from felixpy.rules.renderer import RuleRenderer
    calls: list[list[str]] = []
    real = RuleRenderer.workload_dispatch_chains

    def counting(self: RuleRenderer, names: list[str]) -> list[Chain]:
        calls.append(list(names))
        return real(self, names)

    monkeypatch.setattr(RuleRenderer, "workload_dispatch_chains", counting)
    base(node)
    f = node.f(v).filter
    calls.clear()
    # Same interface, different policies and addresses: no re-render, still dispatched.
    node.send(policy("p2", inbound=[rule("allow")]),
              wep("a", mac=MAC, profiles=["kns.default"], tiers=[tier(ingress=("p2",))], **addrs(7)))
    node.apply()
    assert calls == []
    assert dispatched(f, "calia") == (Goto("cali-fw-calia"), Goto("cali-tw-calia"))
    # A second interface: rendered again, both dispatched.
    node.send(wep("b", profiles=["kns.default"], **addrs(2)))
    node.apply()
    assert calls == [["calia", "calib"]] * len(node.fam)
    assert dispatched(f, "calib") == (Goto("cali-fw-calib"), Goto("cali-tw-calib"))
    # Renamed interface (same endpoint): rendered again, the old name falls through to the drop.
    calls.clear()
    node.send(wep("b", "calic", profiles=["kns.default"], **addrs(2)))
    node.apply()
    assert calls == [["calia", "calic"]] * len(node.fam)
    assert dispatched(f, "calib") == (Drop(), Drop())
    assert dispatched(f, "calic") == (Goto("cali-fw-calic"), Goto("cali-tw-calic"))
    # Removal: rendered again, fails closed.
    calls.clear()
    node.send(wep_remove("a"))
    node.apply()
    assert calls == [["calic"]] * len(node.fam)
    assert dispatched(f, "calia") == (Drop(), Drop())


def test_before_insync_the_endpoints_chains_are_rendered_and_dispatched_and_nothing_is_written(
        node: Node, v: int) -> None:
    """``render_ahead`` (the loop's, before InSync) renders the endpoints' chains and the dispatch chains
    that reach them into the tables' desired state, so a table sees which chains the first apply will
    program (and hashes those, and only those, ahead); a policy no endpoint uses stays unreachable.  The
    kernel is untouched until the apply, which then has no dispatch left to render."""
    node.link_up("calia")
    node.link_up("calib")
    before = node.kernel_snapshot()
    node.send(profile("kns.default"), policy("p1", inbound=[rule("allow")]), policy("unused", inbound=[rule("allow")]),
              wep("a", mac=MAC, profiles=["kns.default"], tiers=[tier(ingress=("p1",))], **addrs(1)))
    node.dp.render_ahead()
    f = node.f(v).filter
    wanted = f.desired_programmed_names()
    assert {"cali-fw-calia", "cali-tw-calia", pi("p1")} <= wanted
    assert pi("unused") in f.recorded_names() and pi("unused") not in wanted
    # More of the feed: the dispatch follows it before InSync too.
    node.send(wep("b", profiles=["kns.default"], **addrs(2)))
    node.dp.render_ahead()
    assert {"cali-fw-calib", "cali-tw-calib"} <= f.desired_programmed_names()
    assert node.kernel_snapshot() == before
    node.apply()
    assert dispatched(f, "calia") == (Goto("cali-fw-calia"), Goto("cali-tw-calia"))
    assert dispatched(f, "calib") == (Goto("cali-fw-calib"), Goto("cali-tw-calib"))
    assert dispatched(f, "calic") == (Drop(), Drop())
    assert not f.is_programmed(pi("unused"))


def test_a_dispatch_render_that_raised_is_tried_again_for_the_same_interfaces(
        node: Node, v: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatch chains are skipped when the interface names are those last rendered; a render that
    raised must not count as rendered, or the next one for the same names would leave the old chains
    (the new endpoint unreachable) until the names changed again."""
    from felixpy.rules.renderer import RuleRenderer
    base(node)
    real = RuleRenderer.workload_dispatch_chains
    fail = [True]

    def flaky(self: RuleRenderer, names: list[str]) -> list[Chain]:
        if fail[0]:
            raise RuntimeError("render failed")
        return real(self, names)

    monkeypatch.setattr(RuleRenderer, "workload_dispatch_chains", flaky)
    node.send(wep("b", profiles=["kns.default"], **addrs(2)))
    node.link_up("calib")
    assert not node.apply(expect_ok=False).ok
    fail[0] = False
    node.apply()
    f = node.f(v).filter
    assert dispatched(f, "calib") == (Goto("cali-fw-calib"), Goto("cali-tw-calib"))


@pytest.mark.parametrize("mode", ["Felix", "TwoLevel"])
def test_dispatch_with_many_endpoints_reaches_each_and_fails_closed(v: int, mode: str) -> None:
    node = Node(families=(4, 6), config=Config(Ipv6Support=True, DispatchChainMode=mode))
    names = [f"cali{i:02x}{j}" for i in range(12) for j in "abc"]  # 36 names, bins of 3
    names += [f"calizz{i:03d}" for i in range(40)]  # one bin big enough for TwoLevel to split
    node.send(profile("prof"), *(wep(n[4:], n, profiles=["prof"], ipv4=[f"10.66.{k // 200}.{k % 200 + 1}/32"],
                                     ipv6=[f"fd00:66::{k + 1:x}/128"]) for k, n in enumerate(names)))
    node.apply()
    f = node.f(v).filter
    chains = dispatch_chains(f)
    assert len(chains) > 2  # children were needed
    if mode == "TwoLevel":
        assert any(c.name.count("-") > 3 for c in chains)  # grandchildren
    for c in chains:
        assert is_unknown_iface_drop(c.rules[-1]), c.name
    for n in names:
        assert dispatched(f, n) == (Goto(f"cali-fw-{n}"), Goto(f"cali-tw-{n}"))
    for unknown in ("cali00x", "calizz999", "caliq", "eth0"):
        assert dispatched(f, unknown) == (Drop(), Drop())
    # Removing all but one collapses the tree back.
    node.send(*(wep_remove(n[4:]) for n in names[1:]))
    node.apply()
    assert {c.name for c in dispatch_chains(f)} == {CHAIN_FROM_WORKLOAD_DISPATCH, CHAIN_TO_WORKLOAD_DISPATCH}
    assert dispatched(f, names[0]) == (Goto(f"cali-fw-{names[0]}"), Goto(f"cali-tw-{names[0]}"))


# -------------------------------------------------------------------------------------- rpf skip
def test_allow_spoofed_source_prefixes_go_to_rpf_skip_and_relax_rp_filter(v: int) -> None:
    node = Node(families=(4, 6), config=Config(Ipv6Support=True, WorkloadSourceSpoofing="Any"))
    spoof = ["192.168.7.0/24", "fd00:7::/64"]
    node.send(profile("prof"), wep("a", mac=MAC, profiles=["prof"], spoof=spoof, **addrs(1)))
    node.link_up("calia")
    node.apply()
    raw = node.f(v).raw
    want = spoof[0] if v == 4 else spoof[1]
    assert [(r.match.criteria, r.action) for r in raw.rules("cali-rpf-skip")] == [
        ((InInterface("calia"), SourceNet(want)), Accept())]
    assert "cali-rpf-skip" in raw.targets_of("cali-PREROUTING")
    assert node.sysctls.values["net/ipv4/conf/calia/rp_filter"] == "0"
    node.send(wep("a", mac=MAC, profiles=["prof"], **addrs(1)))
    node.apply()
    assert raw.rules("cali-rpf-skip") == ()
    assert node.sysctls.values["net/ipv4/conf/calia/rp_filter"] == "1"


def test_spoofed_source_prefixes_are_ignored_unless_workload_source_spoofing_is_any(node: Node, v: int) -> None:
    """Felix's default ``WorkloadSourceSpoofing=Disabled``: the prefixes change nothing, RPF stays strict."""
    node.send(profile("prof"), wep("a", mac=MAC, profiles=["prof"], spoof=["192.168.7.0/24", "fd00:7::/64"],
                                   **addrs(1)))
    node.link_up("calia")
    node.apply()
    assert node.f(v).raw.rules("cali-rpf-skip") == ()
    assert node.sysctls.values["net/ipv4/conf/calia/rp_filter"] == "1"


# ------------------------------------------------------------------------------ routes and ARP
def test_local_workload_routes_only_while_admin_up_with_static_arp(node: Node, v: int) -> None:
    node.send(profile("prof"), wep("a", mac=MAC, profiles=["prof"], state="inactive", **addrs(1)))
    idx = node.link_up("calia")
    node.apply()
    assert node.routes(v) == {}
    assert node.neighs() == {}
    f = node.f(v).filter
    (only,) = f.programmed_chain("cali-tw-calia").rules
    assert only.comments == ("Endpoint admin disabled",) and only.action == Drop()
    assert node.status == {wkey("a"): "down"}

    node.send(wep("a", mac=MAC, profiles=["prof"], **addrs(1)))
    node.apply()
    route = node.routes(v)[ip(v, 1)]
    assert (route.oif, route.protocol) == (idx, node.config.DeviceRouteProtocol)
    if v == 4:
        neigh = node.neighs()["10.65.0.1"]
        assert (neigh.ifindex, neigh.lladdr) == (idx, MAC)
    else:
        assert "fd00:65::1" not in node.neighs()  # static ARP is IPv4 only
    assert node.status == {wkey("a"): "up"}

    node.send(wep("a", mac=MAC, profiles=["prof"], state="inactive", **addrs(1)))
    node.apply()
    assert node.routes(v) == {}
    assert node.status == {wkey("a"): "down"}


def test_route_for_an_interface_that_appears_later(node: Node, v: int) -> None:
    node.send(profile("prof"), wep("a", mac=MAC, profiles=["prof"], **addrs(1)))
    node.apply()
    assert node.routes(v) == {}
    idx = node.link_up("calia")
    node.apply()
    assert node.routes(v)[ip(v, 1)].oif == idx


def test_bad_addresses_are_skipped_and_other_endpoints_still_programmed(node: Node, v: int) -> None:
    node.send(profile("prof"),
              wep("bad", mac=MAC, profiles=["prof"], ipv4=["not-an-ip", "fd00:bad::1/128", ip(4, 9)],
                  ipv6=["10.9.9.9/32", ip(6, 9)]),
              wep("good", mac=MAC, profiles=["prof"], **addrs(2)))
    node.link_up("calibad")
    node.link_up("caligood")
    node.apply()
    assert set(node.routes(v)) == {ip(v, 9), ip(v, 2)}
    f = node.f(v).filter
    assert f.is_programmed("cali-tw-calibad") and f.is_programmed("cali-tw-caligood")
    assert node.status == {wkey("bad"): "up", wkey("good"): "up"}


# -------------------------------------------------------------------------------------- sysctls
def test_sysctls_written_only_once_the_interface_is_oper_up(node: Node) -> None:
    node.send(profile("prof"), wep("a", mac=MAC, profiles=["prof"], **addrs(1)))
    node.apply()
    assert node.sysctls.writes_to("calia") == 0
    assert node.status == {wkey("a"): "down"}
    # The interface appears, but oper-down: still nothing.
    node.netlink.add_link("calia", up=False)
    node.sysctls.add_iface("calia")
    node.dp.on_iface_update(IfaceStateUpdate("calia", IfaceState.DOWN, node.ifindex("calia")))
    node.apply()
    assert node.sysctls.writes_to("calia") == 0
    node.link_up("calia")
    node.apply()
    assert node.sysctls.iface_values("calia") == {
        "net/ipv4/conf/calia/rp_filter": "1", "net/ipv4/conf/calia/route_localnet": "1",
        "net/ipv4/conf/calia/proxy_arp": "1", "net/ipv4/conf/calia/forwarding": "1",
        "net/ipv4/neigh/calia/proxy_delay": "0", "net/ipv6/conf/calia/proxy_ndp": "1",
        "net/ipv6/conf/calia/forwarding": "1", "net/ipv6/conf/calia/accept_ra": "0"}
    assert node.status == {wkey("a"): "up"}


def test_ip_forwarding_is_switched_on_per_family_unless_disabled(v: int) -> None:
    node = Node(families=(4, 6))
    node.apply()
    assert node.sysctls.values["net/ipv4/ip_forward"] == "1"
    assert node.sysctls.values["net/ipv6/conf/all/forwarding"] == "1"
    off = Node(families=(4, 6), config=Config(IPForwarding="Disabled"))
    off.apply()
    assert off.sysctls.values["net/ipv4/ip_forward"] == "0"
    assert off.sysctls.values["net/ipv6/conf/all/forwarding"] == "0"


def test_interface_that_bounces_is_reconfigured(node: Node) -> None:
    base(node)
    node.link_down("calia")
    node.apply()
    assert node.status == {wkey("a"): "down"}
    node.sysctls.values["net/ipv4/conf/calia/proxy_arp"] = "0"  # e.g. recreated with defaults
    node.link_up("calia")
    node.apply()
    assert node.sysctls.values["net/ipv4/conf/calia/proxy_arp"] == "1"
    assert node.status == {wkey("a"): "up"}


def test_interface_that_vanishes_then_returns(node: Node, v: int) -> None:
    base(node)
    node.link_gone("calia")
    node.apply()
    assert node.status == {wkey("a"): "down"}
    assert node.routes(v) == {}
    idx = node.link_up("calia")
    node.apply()
    assert node.status == {wkey("a"): "up"}
    assert node.routes(v)[ip(v, 1)].oif == idx
    assert node.sysctls.values["net/ipv4/conf/calia/forwarding"] == "1"


# -------------------------------------------------------------------------------------- status
def test_status_is_combined_across_families_and_reported_once(node: Node) -> None:
    base(node)
    assert [u.status for u in node.status_updates] == ["up"]
    # IPv4 interface configuration fails: the combined status is error.
    node.sysctls.failing_ifaces.add("calia")
    node.sysctls.values["net/ipv4/conf/calia/forwarding"] = "0"
    node.link_up("calia")  # triggers reconfiguration
    report = node.apply(expect_ok=False)
    assert report.failed_steps == ["devices:InterfaceSysctls/v4", "devices:InterfaceSysctls/v6"]  # kept, retried
    assert node.status == {wkey("a"): "error"}
    # The failure clears: the manager retries on its own (no new event needed).
    node.sysctls.failing_ifaces.clear()
    assert node.f(4).endpoints.next_deadline() is not None  # asks the loop to come back
    report = node.dp.last_apply
    assert report is not None and report.reschedule_in is not None
    node.apply()
    assert node.status == {wkey("a"): "up"}
    assert node.f(4).endpoints.next_deadline() is None
    assert node.sysctls.values["net/ipv4/conf/calia/forwarding"] == "1"
    node.send(wep_remove("a"))
    node.apply()
    assert node.status == {}
    assert [u.status for u in node.status_updates] == ["up", "error", "up", ""]


def test_one_familys_error_is_the_combined_status(node: Node) -> None:
    base(node)
    node.sysctls.failing_paths.add("net/ipv6/conf/calia/forwarding")  # only the IPv6 manager writes this
    node.sysctls.values["net/ipv6/conf/calia/forwarding"] = "0"
    node.link_up("calia")
    assert node.apply(expect_ok=False).failed_steps == ["devices:InterfaceSysctls/v6"]
    assert node.status == {wkey("a"): "error"}
    assert node.f(6).endpoints.next_deadline() is not None
    assert node.f(4).endpoints.next_deadline() is None
    assert node.sysctls.values["net/ipv4/conf/calia/forwarding"] == "1"  # IPv4 went ahead
    node.sysctls.failing_paths.clear()
    node.apply()
    assert node.status == {wkey("a"): "up"}


def test_status_of_a_single_family_node(v: int) -> None:
    node = Node(families=(4,), config=Config(Ipv6Support=False))
    node.send(profile("prof"), wep("a", mac=MAC, profiles=["prof"], **addrs(1)))
    node.apply()
    assert node.status == {wkey("a"): "down"}
    node.link_up("calia")
    node.apply()
    assert node.status == {wkey("a"): "up"}
    # accept_ra is still turned off on a v4-only node.
    assert node.sysctls.values["net/ipv6/conf/calia/accept_ra"] == "0"


# ----------------------------------------------------------------------------- bad input, purity
def test_a_bad_rule_in_one_policy_does_not_stop_others(node: Node, v: int) -> None:
    bad = rule("allow", dst_ports=[80])  # ports but no protocol
    node.send(profile("prof"),
              policy("p-bad", inbound=[bad, rule("allow", protocol="udp", dst_ports=[53])]),
              policy("p-good", inbound=[rule("allow", protocol="tcp", dst_ports=[22])]),
              wep("a", mac=MAC, profiles=["prof"], tiers=[tier(ingress=["p-bad", "p-good"])], **addrs(1)))
    node.link_up("calia")
    node.apply()
    f = node.f(v).filter
    assert f.targets_of("cali-tw-calia") == [pi("p-bad"), pi("p-good"), "cali-pri-prof"]
    assert len(f.programmed_chain(pi("p-bad")).rules) == 1
    assert len(f.programmed_chain(pi("p-good")).rules) == 1
    assert node.status == {wkey("a"): "up"}


def test_policy_referencing_an_ip_set(node: Node, v: int) -> None:
    node.send(ipset("s:clients", ["10.65.0.2/32", "fd00:65::2/128"]), profile("prof"),
              policy("p1", inbound=[rule("allow", src_ip_set_ids=["s:clients"])]),
              wep("a", mac=MAC, profiles=["prof"], tiers=[tier(ingress=["p1"])], **addrs(1)))
    node.apply()
    name = node.f(v).set_name("s:clients")
    assert name in node.f(v).filter.referenced_ip_sets()
    assert node.ipset_kernel.members(name) == {"10.65.0.2" if v == 4 else "fd00:65::2"}


def test_on_update_never_touches_the_kernel(node: Node) -> None:
    base(node)
    node.link_up("calib")
    node.apply()
    before = node.kernel_snapshot()
    msgs = [
        ipset("s:x", ["10.1.1.1/32", "fd00::1/128"]),
        policy("p9", inbound=[rule("allow", src_ip_set_ids=["s:x"])], outbound=[rule("deny")]),
        profile("prof-9"),
        wep("b", mac=MAC, profiles=["prof-9"], tiers=[tier(ingress=["p9"])], spoof=["10.9.0.0/16"], **addrs(2)),
        wep("a", "calic", mac=MAC, profiles=["kns.default"], **addrs(1)),
        wep_remove("nobody"),
        pb.IPAMPoolUpdate(id="pool1", pool=pb.IPAMPool(cidr="10.65.0.0/16", masquerade=True)),
        wep("d", mac=MAC, profiles=["prof-9"], dscp=10, **addrs(4)),
        policy_remove("p1"),
    ]
    for msg in msgs:
        node.dp.on_datastore_message(msg)
    node.dp.on_iface_update(IfaceStateUpdate("calib", IfaceState.DOWN, node.ifindex("calib")))
    node.dp.on_iface_update(IfaceStateUpdate("calic", IfaceState.UP, 77))
    assert node.kernel_snapshot() == before
    node.link_up("calic")
    node.link_up("calid")
    node.apply()
    assert node.kernel_snapshot() != before
    f = node.f(4).filter
    assert f.is_programmed("cali-tw-calib") and f.is_programmed("cali-tw-calic")
    assert not f.recorded_names() & {"cali-tw-calia", pi("p1")}


# ------------------------------------------------------------------------------------- nftables
def test_nftables_mode_dispatches_through_verdict_maps(v: int) -> None:
    node = Node(families=(4, 6), config=Config(NFTablesMode="Enabled"))
    maps = node.f(v).filter
    node.send(profile("prof"), wep("a", profiles=["prof"], **addrs(1)))
    node.link_up("calia")
    node.apply()
    assert maps.programmed_map("cali-to-wl-dispatch") == {"calia": Goto("cali-tw-calia")}
    assert maps.programmed_map("cali-from-wl-dispatch") == {"calia": Goto("cali-fw-calia")}
    assert maps.is_programmed("cali-tw-calia")
    root = maps.programmed_chain(CHAIN_TO_WORKLOAD_DISPATCH)
    assert is_unknown_iface_drop(root.rules[-1])
    node.send(wep_remove("a"))
    node.apply()
    assert maps.programmed_map("cali-to-wl-dispatch") == {}
    assert not maps.is_programmed("cali-tw-calia")


def test_an_address_of_the_other_family_is_skipped_and_the_rest_routed(node: Node, v: int) -> None:
    """``ipv4_nets`` holding an IPv6 address (and the reverse) gets no route in either family;
    the endpoint's right addresses are routed as usual."""
    node.send(profile("prof"), wep("a", mac=MAC, profiles=["prof"], ipv4=[ip(4, 1), "fd00:65::9/128"],
                                   ipv6=[ip(6, 1), "10.65.0.9/32"]))
    node.link_up("calia")
    node.apply()
    assert set(node.routes(v)) == {ip(v, 1)}
