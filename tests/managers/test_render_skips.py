"""What the policy and endpoint managers do not re-render: unchanged content, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from felixpy.managers.endpoints import EndpointManager

from .harness import (
    Node,
    pid,
    policy,
    policy_remove,
    profile,
    rule,
    tier,
    wep,
    wep_remove,
)


def started(node: Node) -> Node:
    node.send(profile("prof"), policy("p1", inbound=[rule(protocol="tcp", dst_ports=[80])]),
              policy("p2", inbound=[rule("deny")]),
              wep("w1", ipv4=["10.0.0.1/32"], ipv6=["fd00::1/128"], profiles=["prof"],
                  tiers=[tier(ingress=["p1"])]))
    node.apply()
    return node


def test_resending_a_policy_unchanged_keeps_its_rendered_chain(node: Node) -> None:
    started(node)
    before = node.f(4).filter.recorded_chain("cali-pi-gnp/p1")
    assert before is not None
    node.send(policy("p1", inbound=[rule(protocol="tcp", dst_ports=[80])]))  # an equal, new message
    node.apply()
    assert node.f(4).filter.recorded_chain("cali-pi-gnp/p1") is before


def test_a_changed_policy_is_rendered_again(node: Node, v: int) -> None:
    started(node)
    before = node.f(v).filter.rules("cali-pi-gnp/p1")
    node.send(policy("p1", inbound=[rule(protocol="tcp", dst_ports=[443])]))
    node.apply()
    after = node.f(v).filter.rules("cali-pi-gnp/p1")
    assert after != before
    assert "443" in repr(after) and "80)" not in repr(after)


def test_a_policy_removed_and_sent_again_is_programmed_again(node: Node, v: int) -> None:
    started(node)
    msg = policy("p1", inbound=[rule(protocol="tcp", dst_ports=[80])])
    want = node.f(v).filter.rules("cali-pi-gnp/p1")
    node.send(policy_remove("p1"), wep("w1", ipv4=["10.0.0.1/32"], ipv6=["fd00::1/128"], profiles=["prof"]))
    node.apply()
    assert node.f(v).filter.recorded_chain("cali-pi-gnp/p1") is None
    node.send(msg, wep("w1", ipv4=["10.0.0.1/32"], ipv6=["fd00::1/128"], profiles=["prof"],
                       tiers=[tier(ingress=["p1"])]))
    node.apply()
    assert node.f(v).filter.rules("cali-pi-gnp/p1") == want


def test_a_changed_profile_is_rendered_again_and_an_equal_one_is_not(node: Node, v: int) -> None:
    started(node)
    filt = node.f(v).filter
    before = filt.recorded_chain("cali-pri-prof")
    node.send(profile("prof"))
    node.apply()
    assert filt.recorded_chain("cali-pri-prof") is before
    node.send(profile("prof", inbound=[rule("deny")]))
    node.apply()
    after = filt.recorded_chain("cali-pri-prof")
    assert after is not None and before is not None and after.rules != before.rules


def test_new_addresses_alone_keep_the_endpoint_chains_and_move_the_routes(node: Node, v: int) -> None:
    node.link_up("caliw1")
    started(node)
    filt = node.f(v).filter
    tw, fw = filt.recorded_chain("cali-tw-caliw1"), filt.recorded_chain("cali-fw-caliw1")
    assert set(node.routes(v)) == {"10.0.0.1/32" if v == 4 else "fd00::1/128"}
    node.send(wep("w1", ipv4=["10.0.0.2/32"], ipv6=["fd00::2/128"], mac="ee:ee:ee:ee:ee:01", profiles=["prof"],
                  tiers=[tier(ingress=["p1"])]))
    node.apply()
    assert filt.recorded_chain("cali-tw-caliw1") is tw and filt.recorded_chain("cali-fw-caliw1") is fw
    assert set(node.routes(v)) == {"10.0.0.2/32" if v == 4 else "fd00::2/128"}


def test_any_chain_input_that_changes_re_renders_the_endpoint(node: Node, v: int) -> None:
    started(node)
    filt = node.f(v).filter
    a4, a6 = ["10.0.0.1/32"], ["fd00::1/128"]
    variants = [
        wep("w1", ipv4=a4, ipv6=a6, profiles=["prof"], tiers=[tier(ingress=["p2"])]),  # other policy
        wep("w1", ipv4=a4, ipv6=a6, profiles=["prof"], tiers=[tier(ingress=["p1", "p2"])]),  # one more
        wep("w1", ipv4=a4, ipv6=a6, profiles=[], tiers=[tier(ingress=["p1", "p2"])]),  # profiles
        wep("w1", ipv4=a4, ipv6=a6, profiles=[], tiers=[tier(ingress=["p1", "p2"])], state="down"),  # admin state
    ]
    for msg in variants:
        before = filt.rules("cali-tw-caliw1")
        node.send(msg)
        node.apply()
        assert filt.rules("cali-tw-caliw1") != before, msg


def test_a_policy_selector_change_regroups_an_unchanged_endpoint(node: Node, v: int) -> None:
    """Groups come from the policies' selectors: the same endpoint message after a selector change
    must not reuse the chains rendered for the old grouping."""
    node.send(profile("prof"), policy("p1", selector="app == 'x'"), policy("p2", selector="app == 'x'"))
    ep = wep("w1", ipv4=["10.0.0.1/32"], ipv6=["fd00::1/128"], profiles=["prof"],
             tiers=[tier(ingress=["p1", "p2"])])
    node.send(ep)
    node.apply()
    filt = node.f(v).filter
    grouped = filt.targets_of("cali-tw-caliw1")
    node.send(policy("p2", selector="app == 'y'"), ep)
    node.apply()
    regrouped = filt.targets_of("cali-tw-caliw1")
    assert regrouped != grouped
    assert all(filt.recorded_chain(t) is not None for t in regrouped)
    assert isinstance(node.f(v).endpoints, EndpointManager)


def test_a_policy_only_update_keeps_the_routes_through_an_interface_takeover(node: Node, v: int) -> None:
    """Routes are skipped for an update with the same addresses: they must still be the endpoint's own
    after another endpoint took its interface and gave it back."""
    node.link_up("calishared")
    addr = {"wb": ("10.0.0.2/32", "fd00::2/128"), "wa": ("10.0.0.1/32", "fd00::1/128")}

    def ep(name: str, ingress: list[str]) -> object:
        a4, a6 = addr[name]
        return wep(name, iface="calishared", ipv4=[a4], ipv6=[a6], profiles=["prof"], tiers=[tier(ingress=ingress)])

    mine = {addr["wb"][0 if v == 4 else 1]}
    started(node)
    node.send(ep("wb", ["p1"]))
    node.apply()
    assert set(node.routes(v)) == mine
    node.send(ep("wa", ["p1"]))  # lower ID: takes the interface, wb is shadowed
    node.apply()
    assert set(node.routes(v)) == {addr["wa"][0 if v == 4 else 1]}
    node.send(wep_remove("wa"))  # wb gets it back
    node.apply()
    assert set(node.routes(v)) == mine
    node.send(ep("wb", ["p2"]))  # same addresses, other policy: routes skipped
    node.apply()
    assert set(node.routes(v)) == mine
    assert "cali-pi-gnp/p2" in node.f(v).filter.targets_of("cali-tw-calishared")


def _count_renders(node: Node, v: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each policy/profile render of family ``v`` (by ID) from now on."""
    rendered: list[str] = []
    r = node.f(v).renderer
    real_policy, real_profile = r.policy_chains, r.profile_chains

    def policy_chains(p: Any, pol: Any) -> Any:
        rendered.append(p.describe())
        return real_policy(p, pol)

    def profile_chains(p: Any, prof: Any) -> Any:
        rendered.append(f"profile {p}")
        return real_profile(p, prof)

    monkeypatch.setattr(r, "policy_chains", policy_chains)
    monkeypatch.setattr(r, "profile_chains", profile_chains)
    return rendered


def test_a_batch_updating_a_policy_many_times_renders_it_once_in_its_final_form(
        node: Node, v: int, monkeypatch: pytest.MonkeyPatch) -> None:
    started(node)
    rendered = _count_renders(node, v, monkeypatch)
    node.send(*[policy("p1", inbound=[rule(protocol="tcp", dst_ports=[port])]) for port in range(1000, 1050)],
              *[profile("prof", inbound=[rule("deny")]) for _ in range(5)], profile("prof", inbound=[rule()]),
              profile("prof", inbound=[rule(protocol="udp")]))
    assert rendered == []          # on_update renders nothing
    node.apply()
    assert len([x for x in rendered if "p1" in x]) == 1
    assert len([x for x in rendered if x.startswith("profile")]) == 1
    rules = repr(node.f(v).filter.rules("cali-pi-gnp/p1"))
    assert "1049" in rules and "1048" not in rules and "1000" not in rules
    assert "17" in repr(node.f(v).filter.rules("cali-pri-prof")) or "udp" in repr(node.f(v).filter.rules("cali-pri-prof"))


def test_an_update_then_a_remove_in_one_batch_leaves_no_chain_and_the_reverse_leaves_the_update(
        node: Node, v: int) -> None:
    started(node)
    # Nothing references p2: make an endpoint use it, so its chain would be programmed if it existed.
    w = dict(ipv4=["10.0.0.1/32"], ipv6=["fd00::1/128"], profiles=["prof"])
    node.send(wep("w1", **w, tiers=[tier(ingress=["p1", "p2"])]))   # type: ignore[arg-type]
    node.apply()
    assert node.f(v).filter.recorded_chain("cali-pi-gnp/p2") is not None
    node.send(policy("p2", inbound=[rule(protocol="tcp", dst_ports=[22])]), policy_remove("p2"))
    node.apply()
    assert node.f(v).filter.recorded_chain("cali-pi-gnp/p2") is None
    node.send(wep("w1", **w, tiers=[tier(ingress=["p1"])]))   # type: ignore[arg-type]
    node.apply()
    node.send(policy_remove("p1"), policy("p1", inbound=[rule(protocol="tcp", dst_ports=[8443])]))
    node.apply()
    assert "8443" in repr(node.f(v).filter.rules("cali-pi-gnp/p1"))
