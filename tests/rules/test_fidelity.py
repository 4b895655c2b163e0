"""Fidelity: for a fixed node, the chain names, rule order and structure Felix produces.

Two kinds of evidence:

* structure: the expected chains below are written from Felix's source (``rules/endpoints.go``,
  ``dispatch.go``, ``policy.go``, ``static.go``) — names, order, marks, comments;
* ``cali:`` hashes: rendered through felixpy's iptables renderer, rules that also exist on real
  Felix nodes hash to the values seen in Felix-programmed tables (the same public values the
  iptables driver's golden test uses), so a Felix → felixpy upgrade leaves them untouched.
"""

from __future__ import annotations

from felixpy.drivers.generictables.model import (
    Chain,
    ClearMark,
    Drop,
    Goto,
    Jump,
    Match,
    Return,
    Rule,
    SetMark,
)
from felixpy.drivers.iptables import detect, render
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import RendererOptions, RuleRenderer, tiers_from_proto
from felixpy.rules.names import PolicyID

from .conftest import A, P, renderer, rule

GA = pb.PolicyID(name="allow-web", kind="GlobalNetworkPolicy")
GB = pb.PolicyID(name="allow-dns", kind="GlobalNetworkPolicy")
STAGED = pb.PolicyID(name="trial", namespace="prod", kind="StagedNetworkPolicy")
NP = pb.PolicyID(name="db", namespace="prod", kind="NetworkPolicy")
SELECTORS = {PolicyID.from_proto(GA): "role == 'web'", PolicyID.from_proto(GB): "role == 'web'",
             PolicyID.from_proto(STAGED): "role == 'web'", PolicyID.from_proto(NP): "app == 'db'"}
WEP = pb.WorkloadEndpoint(
    state="active", name="cali0123456789a", profile_ids=["kns.prod"],
    tiers=[pb.TierInfo(name="default", ingress_policies=[GA, GB, STAGED, NP], egress_policies=[NP])])


def node_chains(r: RuleRenderer) -> dict[str, Chain]:
    tiers = tiers_from_proto(WEP.tiers, SELECTORS)
    out: dict[str, Chain] = {}
    for c in r.workload_endpoint_chains(WEP, tiers):
        out[c.name] = c
    for t in tiers:
        for g in (*t.ingress, *t.egress):
            if not g.should_be_inlined():
                c = r.policy_group_chain(g)
                out[c.name] = c
    for c in r.workload_dispatch_chains([WEP.name, "cali0123456789b", "cali1"]):
        out[c.name] = c
    pol = pb.Policy(tier="default", inbound_rules=[rule(action="allow", protocol="tcp", dst_ports=[80, 443])])
    for pid in (GA, GB, STAGED, NP):
        for c in r.policy_chains(pid, pol):
            out[c.name] = c
    return out


def test_chain_names_and_structure() -> None:
    chains = node_chains(renderer(4))
    group = next(n for n in chains if n.startswith("cali-gi-"))
    assert sorted(chains) == sorted([
        "cali-tw-cali0123456789a", "cali-fw-cali0123456789a", group,
        "cali-from-wl-dispatch", "cali-from-wl-dispatch-0", "cali-to-wl-dispatch", "cali-to-wl-dispatch-0",
        "cali-pi-gnp/allow-web", "cali-po-gnp/allow-web", "cali-pi-gnp/allow-dns", "cali-po-gnp/allow-dns",
        "cali-pi-np/prod/db", "cali-po-np/prod/db",  # staged: no chains
    ])
    # The group holds the two consecutive same-selector policies; the staged one is skipped in it.
    assert chains[group].rules == (Rule(Match(), Jump("cali-pi-gnp/allow-web")),
                                   Rule(Match().mark_clear(A | P), Jump("cali-pi-gnp/allow-dns")))
    tw = chains["cali-tw-cali0123456789a"]
    assert [r.action for r in tw.rules] == [
        # conntrack (2), clear A|P, start of tier, group, return, np/db, return, end-of-tier, profile (2), drop
        tw.rules[0].action, Drop(), ClearMark(A | P), ClearMark(P), Jump(group), Return(),
        Jump("cali-pi-np/prod/db"), Return(), Drop(), Jump("cali-pri-kns.prod"), Return(), Drop()]
    assert chains["cali-from-wl-dispatch"].rules == (
        Rule(Match().in_interface("cali0+"), Goto("cali-from-wl-dispatch-0")),
        Rule(Match().in_interface("cali1"), Goto("cali-fw-cali1")),
        Rule(Match(), Drop(), ("Unknown interface",)),
    )
    assert chains["cali-pi-np/prod/db"].rules[0] == Rule(
        Match().protocol("tcp").dest_ports(80, 443), SetMark(A), ("NetworkPolicy prod/db ingress",))


# ---------------------------------------------------------------------------- cali: hashes
FEATURES = detect.Features(SNATFullyRandom=True, MASQFullyRandom=True, RestoreSupportsLock=True, NFLogSize=True)


def hashes(chain: str, rules: tuple[Rule, ...] | list[Rule]) -> list[str]:
    return render.rule_hashes(chain, list(rules), FEATURES)


def test_kernel_hook_hashes_match_felix_nodes() -> None:
    seen_on_felix_nodes = {
        ("filter", "FORWARD", False): ["wUHhoiAYhphO9Mso"],
        ("filter", "INPUT", False): ["Cz_u1IQiXIMmKD4c"],
        ("filter", "OUTPUT", False): ["tVnHkvAo15HuiPy0"],
        ("raw", "PREROUTING", False): ["6gwbT8clXdHdC1b1"],
        ("filter", "FORWARD", True): ["S93hcgKJrXEqnTfs", "mp77cMpurHhyjLrM"],
    }
    hooks = {(h.table, h.chain, h.always_append): h for h in renderer(4).kernel_hooks()}
    for key, expected in seen_on_felix_nodes.items():
        hook = hooks[key]
        name = hook.chain + ("*appends*" if hook.always_append else "")
        assert hashes(name, hook.rules) == expected, key
    # The public nat POSTROUTING value comes from Felix versions that still inserted this hook
    # (hashed under "POSTROUTING"); current Felix appends it, so it hashes under "*appends*".
    post = hooks[("nat", "POSTROUTING", True)]
    assert hashes("POSTROUTING", post.rules) == ["O3lYWMrLQYEMJtB5"]


def test_static_chain_hashes_match_felix_nodes() -> None:
    r = renderer(4, options=RendererOptions(ipip_enabled=True), IpInIpTunnelAddr="10.65.0.1")
    nat = {c.name: c for c in r.static_chains("nat")}
    assert hashes("cali-POSTROUTING", nat["cali-POSTROUTING"].rules) == [
        "Z-c7XtVd2Bq7s_hA", "nYKhEzDlr11Jccal", "SXWvdsbh4Mw7wOln"]
    assert hashes("cali-PREROUTING", nat["cali-PREROUTING"].rules) == ["r6XmIziWUJsdOK6Z"]
    assert hashes("cali-OUTPUT", nat["cali-OUTPUT"].rules) == ["GBTAv2p5CwevEyJm"]
    wl_to_host = {c.name: c for c in r.static_chains("filter")}["cali-wl-to-host"]
    assert hashes("cali-wl-to-host", wl_to_host.rules)[0] == "Ee9Sbo10IpVujdIY"


def test_every_rendered_rule_renders_for_iptables() -> None:
    """The whole node renders to iptables text (no criterion the backend can't express)."""
    r = renderer(4, options=RendererOptions(ipip_enabled=True, vxlan_enabled=True), FlowLogsLocalReporter="Enabled",
                 WireguardEnabled=True, WireguardHostEncryptionEnabled=True)
    all_chains = list(node_chains(r).values())
    for t in ("raw", "mangle", "filter", "nat"):
        all_chains += r.static_chains(t)
    for c in all_chains:
        assert len(hashes(c.name, c.rules)) == len(c.rules)
