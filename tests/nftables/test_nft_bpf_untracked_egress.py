"""BPF mode over nftables: the raw cali-OUTPUT hook and chain for untracked egress policy, and the root
table as the filtered Linux IP-set dataplane (only the sets that policy uses; a restart sweeps every
other set an earlier run left).  Against the stateful fake nft, and (marked kernel) the real one in a
throwaway namespace, where packets show what the chains do."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import replace

import pytest

import nft_helpers as hp
from nft_helpers import Harness

from felixpy.config import Config
from felixpy.dataplane.wiring import install_kernel_hooks, renderer_options
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.ipsets_filter import FilteredIPSets
from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.nftables.shim import NftShim
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyID, RuleRenderer, TierPolicyGroups, group_policies
from felixpy.rules import bpfmode
from felixpy.rules.groups import OUTBOUND
from felixpy.rules.ipset_names import main_ipset_name

V46 = pytest.mark.parametrize("v", [4, 6])
CONFIG = replace(Config(), BPFEnabled=True, NFTablesMode="Enabled")


def program_bpf_raw(h: Harness, r: RuleRenderer, set_id: str) -> None:
    """What BPF mode records in raw: its static chains and hooks, and an untracked egress policy on eth0
    that matches *set_id* (the host-endpoint and raw-egress policy managers' chains)."""
    raw = h.layers["raw"]
    tables = {name: h.layers[name] for name in ("raw", "filter")}
    for name, layer in tables.items():
        layer.update_chains(bpfmode.static_chains(r.ctx, name))
    install_kernel_hooks(tables, [k for k in bpfmode.kernel_hooks(r.ctx) if k.table in tables])
    pid = PolicyID("ut", "", "GlobalNetworkPolicy")
    pol = pb.Policy(untracked=True, outbound_rules=[pb.Rule(action="allow", dst_ip_set_ids=[set_id])])
    raw.update_chains([c for c in r.policy_chains(pid, pol) if c.name.startswith("cali-po-")])
    tiers = (TierPolicyGroups("default", "", egress=group_policies([pid], {}, OUTBOUND)),)
    raw.update_chains([*r.to_host_dispatch_chains(["eth0"]), r.host_endpoint_raw_egress_chain("eth0", tiers)])


@V46
def test_bpf_mode_raw_output_and_only_the_filtered_sets(make: Callable[..., Harness], fake: FakeNft, v: int) -> None:
    earlier = make(fake, v)  # an earlier run (any mode) left sets in the calico table
    for sid in ("s:old", "s:y"):
        earlier.root.add_or_replace_ip_set(IPSetMetadata(sid, IPSetType.HASH_NET), [earlier.net(9)])
    earlier.root.apply()
    assert set(hp.sets(fake, v)) == {f"cali{v}0s-old", f"cali{v}0s-y"}

    h = make(fake, v)
    r = RuleRenderer(CONFIG, v, options=renderer_options(CONFIG))
    members = {"s:x": frozenset({h.net(1), h.addr(5)}), "s:y": frozenset({h.net(2)})}
    linux = FilteredIPSets(h.root, members.get)
    for sid in members:  # the IP-sets manager sends every set; the filter decides
        linux.add_or_replace_ip_set(IPSetMetadata(sid, IPSetType.HASH_NET), members[sid])
    linux.set_filter(frozenset({main_ipset_name("s:x", v)}))
    program_bpf_raw(h, r, "s:x")
    linux.apply_updates()
    h.root.apply()
    while linux.apply_deletions():
        h.root.apply()

    assert hp.sets(fake, v) == {f"cali{v}0s-x": {h.net(1), h.addr(5)}}
    ch = hp.chains(fake, v)
    assert len(ch["raw-OUTPUT"]["rules"]) == 1
    for name in ("raw-cali-OUTPUT", "raw-cali-to-host-endpoint", "raw-cali-th-eth0", "raw-cali-po-gnp/ut",
                 "raw-cali-failsafe-out"):
        assert name in ch, name
    assert len(ch["raw-cali-OUTPUT"]["rules"]) == 4
    assert not [n for n in ch if n.startswith(("raw-cali-fh-", "raw-cali-pi-"))]


def _sh(*args: str) -> str:
    """Forked from this thread: inside its namespace."""
    return subprocess.run(args, check=False, capture_output=True, text=True).stdout


@pytest.mark.kernel
@V46
def test_kernel_untracked_egress_leaves_untracked_with_bypass(kernel_nft: NftShim, make: Callable[..., Harness],
                                                             v: int) -> None:
    h = make(kernel_nft, v)
    fam = "-4" if v == 4 else "-6"
    in_set, other = h.addr(5), "10.200.0.5" if v == 4 else "fd00:200::5"
    _sh("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
    for iface in ("eth0", "eth0p"):
        _sh("ip", "link", "set", iface, "up")
    _sh("ip", fam, "addr", "add", "10.99.0.1/24" if v == 4 else "fd00:99::1/64", "dev", "eth0",
        *(["nodad"] if v == 6 else []))
    for addr in (in_set, other):
        _sh("ip", fam, "route", "add", addr, "dev", "eth0")
        _sh("ip", fam, "neigh", "add", addr, "lladdr", "02:00:00:00:00:01", "dev", "eth0", "nud", "permanent")
    r = RuleRenderer(CONFIG, v, options=renderer_options(CONFIG))
    linux = FilteredIPSets(h.root, {"s:x": frozenset({h.net(1), in_set})}.get)
    linux.add_or_replace_ip_set(IPSetMetadata("s:x", IPSetType.HASH_NET), [h.net(1), in_set])
    linux.set_filter(frozenset({main_ipset_name("s:x", v)}))
    program_bpf_raw(h, r, "s:x")
    linux.apply_updates()
    h.root.apply()

    for dst in (in_set, other):
        _sh("ping", fam, "-c", "2", "-i", "0.01", "-W", "1", dst)
    conntrack = _sh("conntrack", "-L", "-f", "ipv4" if v == 4 else "ipv6")
    assert in_set not in conntrack, "untracked egress policy accepted it: no conntrack entry"
    assert other in conntrack, "no untracked policy matched: tracked as usual"
    rules = hp.chains(kernel_nft, v)["raw-cali-OUTPUT"]["rules"]
    assert rules[-1][2] == 2  # the BYPASS-marked pings, only, accepted
