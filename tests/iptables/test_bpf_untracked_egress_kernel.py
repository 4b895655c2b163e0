"""BPF mode's untracked egress policy against the real kernel, inside a throwaway network namespace.

The raw table BPF mode programs (its static chains and hooks, a host endpoint's ``cali-th-`` chain and
an untracked policy matching a Linux IP set) over real iptables (legacy and nft-backed, IPv4 and IPv6)
and the real ipset, behind the IP-set filter.  Packets leave through a host interface: one to the set
leaves untracked and marked BYPASS for the TC program (counted by cali-OUTPUT's accept rule), one
elsewhere is tracked as usual; only the filtered set is in the kernel.  Every command runs inside the
namespace, always with ``--wait``.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from felixpy.config import Config
from felixpy.dataplane.wiring import install_kernel_hooks, renderer_options
from felixpy.drivers.cmdshim import SubprocessRunner
from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.ipsets_filter import FilteredIPSets
from felixpy.drivers.iptables.detect import FeatureDetector
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyID, RuleRenderer, TierPolicyGroups, bpfmode, group_policies
from felixpy.rules.groups import OUTBOUND
from felixpy.rules.ipset_names import main_ipset_name
from felixpy.testing.netns import run_in

pytestmark = pytest.mark.kernel

if os.geteuid() != 0:  # pragma: no cover
    pytest.skip("kernel tests need root", allow_module_level=True)

ADDR = {4: ("10.99.0.1/24", "10.1.0.0/16", "10.1.0.5", "10.2.0.5"),
        6: ("fd00:99::1/64", "fd00:1::/64", "fd00:1::5", "fd00:2::5")}


@pytest.fixture(params=[("legacy", 4), ("legacy", 6), ("nft", 4), ("nft", 6)], ids=lambda p: f"{p[0]}-v{p[1]}")
def flavour(request: pytest.FixtureRequest) -> tuple[str, int]:
    return request.param  # type: ignore[no-any-return]


def _host_eth0(ns: str, v: int) -> None:
    """A host interface (a veth whose peer stays in the namespace), routes to both destinations and
    permanent neighbours for them, so the pings leave at once."""
    own, net, in_set, other = ADDR[v]
    fam = "-4" if v == 4 else "-6"
    run_in(ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
    for iface in ("eth0", "eth0p"):
        run_in(ns, "ip", "link", "set", iface, "up")
    run_in(ns, "ip", fam, "addr", "add", own, "dev", "eth0", *(["nodad"] if v == 6 else []))
    for dst, addr in ((net, in_set), (other, other)):
        run_in(ns, "ip", fam, "route", "add", dst, "dev", "eth0")
        run_in(ns, "ip", fam, "neigh", "add", addr, "lladdr", "02:00:00:00:00:01", "dev", "eth0", "nud", "permanent")


def _ping(ns: str, v: int, dst: str) -> None:
    run_in(ns, "ping", "-4" if v == 4 else "-6", "-c", "2", "-i", "0.01", "-W", "1", dst, check=False)


def _tracked(ns: str, v: int, dst: str) -> bool:
    out = run_in(ns, "conntrack", "-L", "-f", "ipv4" if v == 4 else "ipv6", "-d", dst, check=False)
    return dst in out.stdout


def test_untracked_egress_leaves_with_bypass_and_only_its_set_is_in_the_kernel(netns: str,
                                                                               flavour: tuple[str, int]) -> None:
    backend, v = flavour
    own, net, in_set, other = ADDR[v]
    _host_eth0(netns, v)
    family = "inet" if v == 4 else "inet6"
    run_in(netns, "ipset", "create", main_ipset_name("s:stale", v), "hash:net", "family", family)

    runner = SubprocessRunner(netns=netns)
    cfg = replace(Config(), BPFEnabled=True)
    r = RuleRenderer(cfg, v, options=renderer_options(cfg))
    features = FeatureDetector(runner)
    tables = {name: IptablesTable(name, v, runner=runner, backend=backend, features=features)
              for name in ("raw", "filter")}  # filter's static chains match conntrack state: it is on
    raw = tables["raw"]
    linux = FilteredIPSets(IPSets(v, runner), {"s:x": frozenset({net}), "s:y": frozenset({other})}.get)
    for sid, members in (("s:x", [net]), ("s:y", [other])):
        linux.add_or_replace_ip_set(IPSetMetadata(sid, IPSetType.HASH_NET), members)
    linux.set_filter(frozenset({main_ipset_name("s:x", v)}))

    for name, table in tables.items():
        table.update_chains(bpfmode.static_chains(r.ctx, name))
    install_kernel_hooks(tables, [h for h in bpfmode.kernel_hooks(r.ctx) if h.table in tables])
    pid = PolicyID("ut", "", "GlobalNetworkPolicy")
    pol = pb.Policy(untracked=True, outbound_rules=[pb.Rule(action="allow", dst_ip_set_ids=["s:x"])])
    raw.update_chains([c for c in r.policy_chains(pid, pol) if c.name.startswith("cali-po-")])
    tiers = (TierPolicyGroups("default", "", egress=group_policies([pid], {}, OUTBOUND)),)
    raw.update_chains([*r.to_host_dispatch_chains(["eth0"]), r.host_endpoint_raw_egress_chain("eth0", tiers)])

    linux.apply_updates()
    for table in tables.values():
        table.apply()
    while linux.apply_deletions():
        pass
    sets = run_in(netns, "ipset", "list", "-name").stdout.split()
    assert sorted(s for s in sets if s.startswith("cali")) == [main_ipset_name("s:x", v)]

    _ping(netns, v, in_set)
    _ping(netns, v, other)
    assert not _tracked(netns, v, in_set), "untracked egress policy accepted it: no conntrack entry"
    assert _tracked(netns, v, other), "no untracked policy matched: tracked as usual"
    six = "6" if v == 6 else ""
    listing = run_in(netns, f"ip{six}tables-{backend}", "-w", "5", "-t", "raw", "-L", "cali-OUTPUT", "-v", "-n",
                     "-x").stdout
    accept = [ln for ln in listing.splitlines() if "ACCEPT" in ln]
    assert len(accept) == 1 and int(accept[0].split()[0]) == 2, listing  # the BYPASS-marked pings, only
