"""build_dataplane over fake kernels: per-family managers and drivers, and the fail-closed invariant.

The real daemon fails closed when a programmed rule jumps to an undefined
chain or matches an IP set that does not exist (``iptables-restore`` refuses
the transaction; after its retries the table raises FatalDataplaneError and the
daemon exits).  Here the whole wired graph — real iptables tables over
:class:`~felixpy.drivers.iptables.fake.FakeIptables`, the real ipset driver over
:class:`~felixpy.drivers.ipsets.fake.FakeIPSet`, route tables over
:class:`~felixpy.drivers.netlink.fake.FakeNetlink` — applies a start of day and
a realistic batch, and the resulting fake kernel is checked for both.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from felixpy.config import Config
from felixpy.dataplane.core import InternalDataplane
from felixpy.dataplane.wiring import build_dataplane
from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.managers.dscp import DSCPManager
from felixpy.managers.endpoints import EndpointManager
from felixpy.managers.hostips import HostIPManager
from felixpy.managers.masq import MasqManager
from felixpy.managers.policy import PolicyManager
from felixpy.managers.status import EndpointStatusCombiner
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock
from felixpy.testing.kernel import TABLES, FakeKernel

from .harness import ipset, policy, profile, rule, tier, wep

_MATCH_SET = re.compile(r"--match-set (\S+)")
_TARGET = re.compile(r"(?:^|\s)(?:-j|-g) (\S+)")


def build(config: Config, kernel: FakeKernel) -> InternalDataplane:
    return build_dataplane(config, clock=FakeClock(), deps=kernel.deps())


def by_family(dp: InternalDataplane, cls: type) -> Counter[int]:
    return Counter(m.ip_version for m in dp.managers if isinstance(m, cls))


@pytest.mark.parametrize("ipv6", [False, True], ids=["v4-only", "dual-stack"])
def test_one_set_of_managers_and_drivers_per_family(ipv6: bool) -> None:
    dp = build(Config(Ipv6Support=ipv6), FakeKernel())
    fams = [4, 6] if ipv6 else [4]
    want = Counter(fams)
    for cls in (PolicyManager, EndpointManager, HostIPManager, MasqManager, DSCPManager):
        assert by_family(dp, cls) == want, cls.__name__
    assert Counter(d.ip_version for d in dp.ipsets if isinstance(d, IPSets)) == want
    tables = Counter((t.ip_version, t.name) for t in dp.tables if isinstance(t, IptablesTable))
    assert tables == Counter((v, n) for v in fams for n in TABLES)
    assert sorted(s.ip_version for s in dp.route_syncers()) == fams
    (combiner,) = [m for m in dp.managers if isinstance(m, EndpointStatusCombiner)]
    assert combiner.families == set(fams)


def _workload_batch(v6: bool) -> list[Any]:
    nets = {"ipv4": ["10.65.0.1/32"], "ipv6": ["fd00:65::1/128"] if v6 else []}
    return [
        pb.ConfigUpdate(config={}),
        ipset("s:clients", ["10.65.0.2/32", "fd00:65::2/128"]),
        pb.IPAMPoolUpdate(id="p4", pool=pb.IPAMPool(cidr="10.65.0.0/16", masquerade=True)),
        pb.IPAMPoolUpdate(id="p6", pool=pb.IPAMPool(cidr="fd00:65::/64", masquerade=True)),
        profile("kns.default"),
        policy("allow-clients", inbound=[rule("allow", protocol="tcp", dst_ports=[8080],
                                               src_ip_set_ids=["s:clients"])]),
        policy("g1", inbound=[rule("allow")], selector="all()"),
        policy("g2", outbound=[rule("deny")], selector="all()"),
        wep("a", mac="02:00:00:00:00:0a", profiles=["kns.default"], spoof=["10.66.0.0/16", "fd00:66::/64"],
            tiers=[tier(ingress=["allow-clients", "g1", "g2"], egress=["g1", "g2"])], dscp=12, **nets),
        wep("b", profiles=["kns.default"], ipv4=["10.65.0.3/32"], ipv6=["fd00:65::3/128"] if v6 else []),
        pb.InSync(),
    ]


CONFIGS = [
    pytest.param(Config(Ipv6Support=False), id="v4-only"),
    pytest.param(Config(Ipv6Support=True), id="dual-stack"),
    pytest.param(Config(Ipv6Support=True, ChainInsertMode="append", DispatchChainMode="TwoLevel",
                        DefaultEndpointToHostAction="ACCEPT"), id="dual-stack-append-twolevel"),
    # Encapsulation makes the static chains match all-vxlan-net / all-hosts-net, which only the
    # VXLAN / IPIP managers create: wiring must register them whenever the rules reference the sets.
    pytest.param(Config(Ipv6Support=True, VXLANEnabled=True), id="vxlan"),
    pytest.param(Config(IpInIpEnabled=True), id="ipip"),
    # Felix registers a hosts-IP-set manager (all-hosts-net) for IPIP *or* this setting.
    pytest.param(Config(NATOutgoingExclusions="IPPoolsAndHostIPs"), id="nat-exclude-host-ips"),
]
# Steps that may fail in this fake world for reasons outside this test (no VXLAN device without this
# host's VTEP; IPIP/WireGuard unsupported kernels report once and carry on).
_ROUTING_STEPS = ("fdb:", "routes:", "complete:VXLANManager", "complete:IPIPManager", "complete:WireguardManager")


def _apply_batch(config: Config) -> tuple[FakeKernel, InternalDataplane]:
    kernel = FakeKernel()
    # The batch's workload asks for spoofed source prefixes; honoured only with this setting.
    dp = build(config.replace(WorkloadSourceSpoofing="Any"), kernel)
    for name in ("calia", "calib"):
        dp.on_iface_update(kernel.workload_iface(name))
    for msg in _workload_batch(config.Ipv6Support):
        dp.on_datastore_message(msg)
    dp.set_iface_in_sync()
    return kernel, dp


def _check_fail_closed_invariant(kernel: FakeKernel, families: Sequence[int]) -> None:
    sets = kernel.ipset_names()
    for v in families:
        for table in TABLES:
            chains = kernel.chains(v, table)
            for chain, specs in chains.items():
                for spec in specs:
                    for target in _TARGET.findall(spec):
                        assert target.isupper() or target in chains, (v, table, chain, spec)
                    for name in _MATCH_SET.findall(spec):
                        assert name in sets, (v, table, chain, spec)


@pytest.mark.parametrize("config", CONFIGS)
def test_every_programmed_reference_resolves(config: Config) -> None:
    kernel, dp = _apply_batch(config)
    report = dp.apply()
    assert not [st for st in report.failed_steps if not st.startswith(_ROUTING_STEPS)], report.failed_steps
    assert not report.held_back
    fams = [4, 6] if config.Ipv6Support else [4]
    _check_fail_closed_invariant(kernel, fams)
    for v in fams:
        filt = kernel.chains(v, "filter")
        assert any("cali-FORWARD" in s for s in filt["FORWARD"])
        assert "cali-tw-calia" in filt and "cali-fw-calib" in filt
        for root in ("cali-from-wl-dispatch", "cali-to-wl-dispatch"):
            assert '"Unknown interface" -j DROP' in filt[root][-1]
        assert any(c.startswith("cali-gi-") for c in filt)  # the g1+g2 policy group
        assert any("calia" in s for s in kernel.chains(v, "raw")["cali-rpf-skip"])
        assert kernel.chains(v, "mangle")["cali-egress-dscp"]
        assert kernel.chains(v, "nat")["cali-nat-outgoing"]
    assert {kernel.sysctls.values[f"net/ipv4/conf/calia/{k}"] for k in ("forwarding", "proxy_arp")} == {"1"}
    dp.close()
