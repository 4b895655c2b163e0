"""BPF mode's maps fed from the feed, over fakes: the daemon's own wiring (``build()`` with
``BPFEnabled``), the real route / failsafe / conntrack managers and drivers, in-memory maps.
Assertions are on the maps' contents (and on how many writes an apply made)."""

from __future__ import annotations

import ctypes
import errno
import ipaddress
from dataclasses import replace

import pytest

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.fake import FakeMap
from felixpy.bpf.maps import CT4, CT6, FSAFES4, ROUTES4, ROUTES6
from felixpy.config import Config, ProtoPort
from felixpy.drivers.bpfconntrack.api import ConntrackTimeouts, parse_go_duration, parse_timeouts_setting, \
    resolve_timeouts
from felixpy.drivers.bpfconntrack.scanner import ConntrackScanner
from felixpy.drivers.bpfendpoints.fake import FakeBPF, fake_kernel
from felixpy.drivers.bpffailsafe.api import FailsafePort
from felixpy.drivers.bpffailsafe.driver import BPFFailsafes, FailsafesNotProgrammed
from felixpy.drivers.bpfroutes.api import RouteValue
from felixpy.drivers.bpfroutes.driver import BPFRoutes, RoutesNotProgrammed
from felixpy.proto import felixbackend_pb2 as pb
from .harness import Node, wep, wep_remove

BPF_CONFIG = replace(Config(), BPFEnabled=True)
S = 1_000_000_000


def node(families: tuple[int, ...] = (4, 6), config: Config = BPF_CONFIG) -> tuple[Node, FakeBPF]:
    fb = fake_kernel()
    return Node(families=families, config=config, bpf=fb), fb


def routes(fb: FakeBPF, v6: bool = False) -> dict[str, tuple[int, int, str]]:
    """The routes map as {cidr: (flags, ifindex, next hop)}."""
    out = {}
    for k, v in fb.kernel.maps.routes(v6).items():
        cidr = str(ipaddress.ip_network((ipaddress.ip_address(bytes(k.addr)), k.prefixlen)))
        out[cidr] = (int(v.flags), int(v.if_index), str(ipaddress.ip_address(bytes(v.next_hop))))
    return out


def route_update(dst: str, types: int, **kw: object) -> pb.RouteUpdate:
    r = pb.RouteUpdate(dst=dst, **kw)  # type: ignore[arg-type]
    r.types = types  # type: ignore[assignment]
    return r


def test_memoised_cidr_parse_equals_ipaddress_and_long_strings_stay_out_of_the_cache() -> None:
    """The route and conntrack managers parse every endpoint update's addresses through a memo; it
    must agree with ``ipaddress`` on every spelling and never keep a string longer than a CIDR."""
    from felixpy.managers.bpf_maps import _cidr, _parse
    spellings = ["10.0.0.1", "10.0.0.1/32", "10.0.0.7/24", "10.0.0.0/8", "fd00::1", "FD00::1/128", "fd00::7/64",
                 "::ffff:10.0.0.1", "10.0.0.1/255.255.255.0", "bogus", "", "10.0.0.256", "10.0.0.1/33",
                 "fd00::1/129", "1" * 60, "10.0.0.1" + " " * 80]
    for text in spellings:
        try:
            iface = ipaddress.ip_interface(text)
            want = (str(ipaddress.ip_network(text, strict=False)), iface.version, str(iface.ip))
        except ValueError:
            want = None
        assert _parse(text) == want, text
        assert _cidr(text) == (want[0] if want else None)
    before = _parse.cache_info().currsize
    for i in range(100):
        _parse("10." + "1" * (60 + i))
    assert _parse.cache_info().currsize == before


def test_routes_driver_memo_equals_the_parse_and_long_strings_stay_out_of_it() -> None:
    from felixpy.drivers.bpfroutes.driver import _norm
    for text in ("10.65.0.1", "10.65.0.7/24", "fd00::1", "FD00::7/64", "10.0.0.1/255.255.255.0"):
        net = ipaddress.ip_network(text, strict=False)
        assert _norm(text) == (str(net), net.version, bytes(mt.route_key(str(net))))
    for bad in ("bogus", "10.0.0.1/33", "1" * 80):
        with pytest.raises(ValueError):
            _norm(bad)
    before = _norm.cache_info().currsize
    for i in range(50):
        with pytest.raises(ValueError):
            _norm("10." + "1" * (60 + i))
    assert _norm.cache_info().currsize == before


# ------------------------------------------------------------------------------------- routes
def test_routes_from_the_feed_carry_felixs_flags_and_next_hops() -> None:
    n, fb = node(families=(4,))
    n.send(route_update("10.65.1.0/26", pb.REMOTE_WORKLOAD, dst_node_ip="192.168.0.2", ip_pool_type=pb.IPPoolType.VXLAN,
                        nat_outgoing=True),
           route_update("192.168.0.2/32", pb.REMOTE_HOST, dst_node_ip="192.168.0.2", same_subnet=True),
           route_update("10.65.9.0/26", pb.REMOTE_WORKLOAD, ip_pool_type=pb.IPPoolType.NO_ENCAP),  # no node IP: none
           route_update("10.65.2.1/32", pb.REMOTE_TUNNEL, dst_node_ip="192.168.0.3"),
           route_update("10.65.0.0/26", pb.LOCAL_WORKLOAD, ip_pool_type=pb.IPPoolType.VXLAN),  # the local block
           route_update("10.65.0.5/32", pb.LOCAL_TUNNEL),  # Felix leaves these out
           route_update("10.96.0.0/12", pb.CIDR_INFO, ip_pool_type=pb.IPPoolType.NO_ENCAP, nat_outgoing=True))
    n.apply()
    got = routes(fb)
    assert got["10.65.1.0/26"] == (defs.RT_WORKLOAD | defs.RT_IN_POOL | defs.RT_NAT_OUT | defs.RT_TUNNELED
                                   | defs.RT_VXLAN, int.from_bytes(bytes([192, 168, 0, 2]), "little"), "192.168.0.2")
    assert got["192.168.0.2/32"][0] == defs.RT_HOST | defs.RT_SAME_SUBNET and got["192.168.0.2/32"][2] == "192.168.0.2"
    assert got["10.65.2.1/32"][0] == defs.RT_HOST | defs.RT_TUNNELED and got["10.65.2.1/32"][2] == "10.65.2.1"
    assert got["10.96.0.0/12"][0] == defs.RT_IN_POOL | defs.RT_NAT_OUT
    assert "10.65.9.0/26" not in got and "10.65.0.0/26" not in got and "10.65.0.5/32" not in got
    n.send(pb.RouteRemove(dst="10.65.1.0/26"))
    n.apply()
    assert "10.65.1.0/26" not in routes(fb) and "192.168.0.2/32" in routes(fb)


def test_local_workload_route_follows_the_interface_index_both_families() -> None:
    n, fb = node()
    n.send(wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00:65::2/128"]),
           route_update("10.65.0.2/32", pb.LOCAL_WORKLOAD, local_workload=True, ip_pool_type=pb.IPPoolType.VXLAN))
    n.apply()
    # Interface not up yet: local workload with ifindex 0 (the source check fails closed).
    assert routes(fb)["10.65.0.2/32"][:2] == (defs.RT_LOCAL | defs.RT_WORKLOAD | defs.RT_IN_POOL, 0)
    idx = n.link_up("cali1")
    n.apply()
    assert routes(fb)["10.65.0.2/32"][:2] == (defs.RT_LOCAL | defs.RT_WORKLOAD | defs.RT_IN_POOL, idx)
    # No RouteUpdate for the v6 address: felixpy still writes the local workload route.
    assert routes(fb, True)["fd00:65::2/128"][:2] == (defs.RT_LOCAL | defs.RT_WORKLOAD, idx)
    n.send(wep_remove("a"))
    n.apply()
    # The calc graph's route alone: in-pool, no longer a local workload (Felix's flags).
    assert routes(fb) == {"10.65.0.2/32": (defs.RT_IN_POOL, 0, "0.0.0.0")} and routes(fb, True) == {}
    n.send(pb.RouteRemove(dst="10.65.0.2/32"))
    n.apply()
    assert routes(fb) == {}


def test_local_workload_route_follows_the_interface_it_moved_to_not_the_old_one() -> None:
    """The routes manager finds an interface's endpoints through an index (a scan of every endpoint per
    interface event was quadratic at a start of day): after an endpoint moves from cali1 to cali2, cali1
    going down and up leaves its route alone and cali2's index is what the route carries."""
    n, fb = node(families=(4,))
    i1, i2 = n.link_up("cali1"), n.link_up("cali2")
    n.send(wep("a", "cali1", ipv4=["10.65.0.2/32"]))
    n.apply()
    assert routes(fb)["10.65.0.2/32"][1] == i1
    n.send(wep("a", "cali2", ipv4=["10.65.0.2/32"]))
    n.apply()
    assert routes(fb)["10.65.0.2/32"][1] == i2
    n.link_down("cali1")
    n.apply()
    assert routes(fb)["10.65.0.2/32"][1] == i2
    n.link_down("cali2")
    n.apply()
    assert routes(fb)["10.65.0.2/32"][1] == 0
    i2b = n.link_up("cali2")
    n.apply()
    assert routes(fb)["10.65.0.2/32"][1] == i2b


def test_host_addresses_are_global_unicast_only_and_external_nodes_are_hosts() -> None:
    cfg = replace(BPF_CONFIG, ExternalNodesCIDRList=("172.16.0.0/16", "fd00:ee::/64"))
    n, fb = node(config=cfg)
    n.addrs("eth0", "10.99.0.1", "169.254.3.3", "fd00:99::1", "fe80::1")
    n.addrs("eth1", "10.99.0.1")
    n.apply()
    assert routes(fb)["10.99.0.1/32"][0] == defs.RT_LOCAL | defs.RT_HOST
    assert routes(fb)["172.16.0.0/16"][0] == defs.RT_HOST
    assert set(routes(fb, True)) == {"fd00:99::1/128", "fd00:ee::/64"}
    n.addrs("eth0")
    n.apply()
    assert "10.99.0.1/32" in routes(fb)  # eth1 still holds it
    n.addrs("eth1")
    n.apply()
    assert "10.99.0.1/32" not in routes(fb) and "fd00:99::1/128" not in routes(fb, True)


@pytest.mark.parametrize("mode,flag", [("Drop", defs.RT_BLACKHOLE_DROP), ("Reject", defs.RT_BLACKHOLE_REJECT),
                                       ("Disabled", 0)])
def test_service_cidrs_are_blackhole_routes_per_service_loop_prevention(mode: str, flag: int) -> None:
    """Felix's bpfRouteManager.onBGPConfigUpdate: cluster, external and load-balancer CIDRs of the family
    get FlagBlackHoleDrop/Reject (nothing with Disabled); a CIDR that stops being one goes, a CIDR that
    also has a calc-graph route keeps that route's flags too, and a bad one is skipped."""
    n, fb = node(config=replace(BPF_CONFIG, ServiceLoopPrevention=mode))
    n.send(route_update("10.96.200.0/24", pb.REMOTE_WORKLOAD, dst_node_ip="192.168.0.2",
                        ip_pool_type=pb.IPPoolType.VXLAN))
    n.send(pb.GlobalBGPConfigUpdate(service_cluster_cidrs=["10.96.128.0/24", "fd00:96:128::/112", "bogus"],
                                    service_external_cidrs=["192.0.2.0/28"],
                                    service_loadbalancer_cidrs=["198.51.100.7/32", "10.96.200.0/24"]))
    n.apply()
    v4, v6 = routes(fb), routes(fb, True)
    if flag:
        assert {c: v4[c][0] for c in ("10.96.128.0/24", "192.0.2.0/28", "198.51.100.7/32")} == \
            dict.fromkeys(("10.96.128.0/24", "192.0.2.0/28", "198.51.100.7/32"), flag)
        assert v6["fd00:96:128::/112"][0] == flag
    else:
        assert not {"10.96.128.0/24", "192.0.2.0/28", "198.51.100.7/32"} & set(v4)
        assert "fd00:96:128::/112" not in v6
    assert v4["10.96.200.0/24"][0] == defs.RT_WORKLOAD | defs.RT_TUNNELED | defs.RT_VXLAN | defs.RT_IN_POOL | flag
    # Withdrawn: the entries go, the calc-graph route loses only the flag.
    n.send(pb.GlobalBGPConfigUpdate(service_cluster_cidrs=["10.96.128.0/24"]))
    n.apply()
    v4 = routes(fb)
    assert not {"192.0.2.0/28", "198.51.100.7/32"} & set(v4) and "fd00:96:128::/112" not in routes(fb, True)
    assert v4["10.96.200.0/24"][0] == defs.RT_WORKLOAD | defs.RT_TUNNELED | defs.RT_VXLAN | defs.RT_IN_POOL
    assert (v4.get("10.96.128.0/24", (0,))[0]) == flag
    n.send(pb.GlobalBGPConfigUpdate())
    n.apply()
    assert "10.96.128.0/24" not in routes(fb)


def test_an_unchanged_feed_rewrites_nothing_and_start_of_day_keeps_right_entries() -> None:
    n, fb = node(families=(4,))
    n.send(route_update("10.65.1.0/26", pb.REMOTE_WORKLOAD, dst_node_ip="192.168.0.2"))
    n.addrs("eth0", "10.99.0.1")
    n.apply()
    rdriver = n.f(4).parts.bpf.routes  # type: ignore[union-attr]
    writes = rdriver.writes
    n.send(route_update("10.65.1.0/26", pb.REMOTE_WORKLOAD, dst_node_ip="192.168.0.2"))
    n.apply()
    assert rdriver.writes == writes
    # A fresh process over the same maps: read back, keep what is right, fix wrong, sweep unwanted.
    m = fb.kernel.maps.routes(False)
    m.set(mt.route_key("10.1.1.0/24"), mt.route_value(defs.RT_HOST, next_hop="1.1.1.1"))  # stale
    m.set(mt.route_key("10.99.0.1/32"), mt.route_value(defs.RT_WORKLOAD))  # wrong
    n2 = Node(families=(4,), config=BPF_CONFIG, bpf=fb)
    n2.send(route_update("10.65.1.0/26", pb.REMOTE_WORKLOAD, dst_node_ip="192.168.0.2"))
    n2.addrs("eth0", "10.99.0.1")
    n2.apply()
    assert set(routes(fb)) == {"10.65.1.0/26", "10.99.0.1/32"}
    assert routes(fb)["10.99.0.1/32"][0] == defs.RT_LOCAL | defs.RT_HOST
    assert n2.f(4).parts.bpf.routes.writes == 2  # type: ignore[union-attr]


@pytest.mark.parametrize("err", [errno.E2BIG, errno.ENOMEM])
def test_routes_map_write_failure_is_retried_and_others_written(err: int) -> None:
    m = FakeMap(ROUTES4.sized(16))
    d = BPFRoutes(4, m)
    d.set_route("10.0.0.0/24", RouteValue(defs.RT_HOST, next_hop="1.1.1.1"))
    d.set_route("10.0.1.0/24", RouteValue(defs.RT_HOST, next_hop="1.1.1.2"))
    m.fail_next_update = err
    with pytest.raises(RoutesNotProgrammed):
        d.apply()
    assert len(m) == 1
    d.apply()
    assert len(m) == 2


def test_routes_driver_skips_a_route_of_the_other_family() -> None:
    m = FakeMap(ROUTES6.sized(16))
    d = BPFRoutes(6, m)
    d.set_route("10.0.0.0/24", RouteValue(defs.RT_HOST))
    d.set_route("fd00::/64", RouteValue(defs.RT_HOST))
    d.apply()
    assert len(m) == 1


# ---------------------------------------------------------------------------------- failsafes
def fsafe_keys(fb: FakeBPF, v6: bool) -> set[tuple[int, int, int, str]]:
    out = set()
    for k in fb.kernel.maps.failsafes(v6).keys():
        plen = int(k.prefixlen) - 32
        addr = ipaddress.ip_address(bytes(k.addr))
        out.add((int(k.ip_proto), int(k.port), int(k.flags), str(ipaddress.ip_network((addr, plen)))))
    return out


def test_failsafe_defaults_are_written_per_family_with_felixs_key_layout() -> None:
    n, fb = node()
    n.apply()
    v4 = fsafe_keys(fb, False)
    assert (6, 22, 0, "0.0.0.0/0") in v4 and (17, 68, 0, "0.0.0.0/0") in v4
    assert (17, 53, defs.FSAFE_OUT, "0.0.0.0/0") in v4 and (6, 6443, defs.FSAFE_OUT, "0.0.0.0/0") in v4
    assert len(v4) == len(Config().FailsafeInboundHostPorts) + len(Config().FailsafeOutboundHostPorts)
    assert (6, 22, 0, "::/0") in fsafe_keys(fb, True)


def test_failsafe_cidrs_go_to_their_family_and_start_of_day_sweeps() -> None:
    cfg = replace(BPF_CONFIG, FailsafeInboundHostPorts=(ProtoPort("tcp", 22, "10.0.0.0/8"),
                                                        ProtoPort("udp", 500, "fd00::/16")),
                  FailsafeOutboundHostPorts=())
    fb = fake_kernel()
    stale = mt.failsafe_key(6, 9999, "0.0.0.0/0")
    fb.kernel.maps.failsafes(False).set(stale, bytes(4))
    n = Node(families=(4, 6), config=cfg, bpf=fb)
    n.apply()
    assert fsafe_keys(fb, False) == {(6, 22, 0, "10.0.0.0/8")}
    assert fsafe_keys(fb, True) == {(17, 500, 0, "fd00::/16")}


def test_failsafe_write_failure_is_retried() -> None:
    m = FakeMap(FSAFES4.sized(8))
    d = BPFFailsafes(4, m)
    d.set_ports(frozenset({FailsafePort(6, 22, "0.0.0.0/0", False), FailsafePort(17, 53, "0.0.0.0/0", True)}))
    m.fail_next_update = errno.ENOMEM
    with pytest.raises(FailsafesNotProgrammed):
        d.apply()
    assert len(m) == 1
    d.apply()
    assert len(m) == 2


# --------------------------------------------------------------------------------- conntrack
def ct_entry(m: FakeMap, proto: int, src: str, sport: int, dst: str, dport: int, *, last_seen: int,
             legs: str = "") -> ctypes.Structure:
    v6 = ":" in src
    k = mt.ct_key(proto, src, sport, dst, dport, v6=v6)
    v = (mt.CtValue6 if v6 else mt.CtValue4)()
    v.last_seen = last_seen
    for leg in (v.a_to_b, v.b_to_a):
        leg.syn_seen = "syn" in legs
        leg.ack_seen = "ack" in legs
        leg.fin_seen = "fin" in legs
        leg.rst_seen = "rst" in legs
    m.set(k, v)
    return k


@pytest.mark.parametrize("v6", [False, True])
def test_scanner_expires_per_protocol_and_state_with_felixs_defaults(v6: bool) -> None:
    a, b = ("fd00::1", "fd00::2") if v6 else ("10.0.0.1", "10.0.0.2")
    icmp = 58 if v6 else 1
    m = FakeMap((CT6 if v6 else CT4).sized(64))
    now = 10_000 * S
    t = ConntrackTimeouts()
    keep = [ct_entry(m, 6, a, 1, b, 80, last_seen=now - 19 * S, legs="syn"),  # SYN sent < 20s
            ct_entry(m, 6, a, 2, b, 80, last_seen=now - 3599 * S, legs="syn ack"),  # established < 1h
            ct_entry(m, 6, a, 3, b, 80, last_seen=now - 29 * S, legs="syn ack fin"),
            ct_entry(m, 17, a, 4, b, 53, last_seen=now - 59 * S),
            ct_entry(m, icmp, a, 0, b, 0, last_seen=now - 4 * S),
            ct_entry(m, 47, a, 0, b, 0, last_seen=now - 599 * S)]
    gone = [ct_entry(m, 6, a, 11, b, 80, last_seen=now - 21 * S, legs="syn"),
            ct_entry(m, 6, a, 12, b, 80, last_seen=now - 3601 * S, legs="syn ack"),
            ct_entry(m, 6, a, 13, b, 80, last_seen=now - 31 * S, legs="syn ack fin"),
            ct_entry(m, 6, a, 14, b, 80, last_seen=now - 41 * S, legs="syn ack rst"),
            ct_entry(m, 17, a, 15, b, 53, last_seen=now - 61 * S),
            ct_entry(m, icmp, a, 1, b, 0, last_seen=now - 6 * S),
            ct_entry(m, 47, a, 1, b, 0, last_seen=now - 601 * S)]
    s = ConntrackScanner(6 if v6 else 4, m, t, now_ns=lambda: now, background=False)
    res = s.scan()
    assert res.used == len(keep) + len(gone) and res.cleaned == len(gone) == res.expired
    assert all(m.get(k) is not None for k in keep) and all(m.get(k) is None for k in gone)


def test_scanner_forgets_a_removed_workloads_flows_through_the_manager() -> None:
    n, fb = node(families=(4,))
    m = fb.map(CT4.name)
    now_like = 1 << 62  # far in the future of the fake's clock: nothing expires by age
    n.send(wep("a", "cali1", ipv4=["10.65.0.2/32"]), wep("b", "cali2", ipv4=["10.65.0.3/32"]))
    n.apply()
    ka = ct_entry(m, 6, "10.65.0.2", 40000, "8.8.8.8", 443, last_seen=now_like, legs="syn ack")
    kb = ct_entry(m, 6, "10.65.0.3", 40000, "8.8.8.8", 443, last_seen=now_like, legs="syn ack")
    n.send(wep_remove("a"))
    n.apply()
    assert m.get(ka) is None and m.get(kb) is not None
    # An address another workload still holds keeps its flows.
    n.send(wep("c", "cali3", ipv4=["10.65.0.3/32"]), wep_remove("b"))
    n.apply()
    assert m.get(kb) is not None


def test_endpoint_updates_between_applies_are_taken_as_their_latest_version() -> None:
    """The route and conntrack managers take the latest version of each endpoint at the apply (a flood
    updates one endpoint several times between applies): the routes map ends as applying each message
    in turn leaves it, and a workload re-addressed away and back keeps its flows while the addresses it
    really left lose theirs."""
    msgs = [wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00::2/128"]),
            wep("b", "cali2", ipv4=["10.65.0.3/32"]),
            wep("a", "cali1", ipv4=["10.65.0.9/32"], ipv6=["fd00::9/128"]),
            wep_remove("b"), wep("b", "cali2", ipv4=["10.65.0.4/32"]),
            wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00::2/128"])]
    one_by_one, fb1 = node()
    batched, fb2 = node()
    for n in (one_by_one, batched):
        n.link_up("cali1")
        n.link_up("cali2")
        n.send(wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00::2/128"]), wep("b", "cali2", ipv4=["10.65.0.3/32"]))
        n.apply()
    now_like = 1 << 62
    flows = {}
    for name, fb in (("one", fb1), ("batch", fb2)):
        m = fb.map(CT4.name)
        flows[name] = (m, ct_entry(m, 6, "10.65.0.2", 40000, "8.8.8.8", 443, last_seen=now_like, legs="syn ack"),
                       ct_entry(m, 6, "10.65.0.3", 40000, "8.8.8.8", 443, last_seen=now_like, legs="syn ack"))
    for msg in msgs:
        one_by_one.send(msg)
        one_by_one.apply()
    batched.send(*msgs)
    batched.apply()
    for v6 in (False, True):
        assert routes(fb2, v6) == routes(fb1, v6)
    assert "10.65.0.4/32" in routes(fb2) and "10.65.0.3/32" not in routes(fb2) and "10.65.0.9/32" not in routes(fb2)
    m, ka, kb = flows["batch"]
    assert m.get(ka) is not None  # a is back on 10.65.0.2 at the apply: its flow stays
    assert m.get(kb) is None  # b left 10.65.0.3


def test_scanner_keeps_an_entry_refreshed_during_the_walk() -> None:
    m = FakeMap(CT4.sized(8))
    now = 10_000 * S
    k = ct_entry(m, 17, "10.0.0.1", 1, "10.0.0.2", 53, last_seen=now - 61 * S)
    s = ConntrackScanner(4, m, now_ns=lambda: now, background=False)
    real_get = s._get

    def refreshed(raw: bytes) -> bytes | None:  # the programs saw a packet between judge and delete
        v = mt.CtValue4.from_buffer_copy(real_get(raw) or b"")
        v.last_seen = now
        m.set(raw, v)
        return bytes(v)

    s._get = refreshed  # type: ignore[method-assign]
    assert s.scan().cleaned == 0 and m.get(k) is not None


def test_nat_forward_entry_goes_with_its_reverse() -> None:
    m = FakeMap(CT4.sized(8))
    now = 10_000 * S
    rev = ct_entry(m, 17, "10.0.0.1", 1, "10.0.0.9", 53, last_seen=now - 61 * S)
    fwd = mt.ct_key(17, "10.0.0.1", 1, "10.96.0.10", 53)
    v = mt.CtValue4()
    v.type = 1
    v.last_seen = now
    ctypes.memmove(ctypes.addressof(v) + 24, bytes(rev), 16)
    m.set(fwd, v)
    orphan = mt.ct_key(17, "10.0.0.1", 2, "10.96.0.10", 53)
    v2 = mt.CtValue4.from_buffer_copy(bytes(v))
    ctypes.memmove(ctypes.addressof(v2) + 24, bytes(mt.ct_key(17, "1.1.1.1", 1, "2.2.2.2", 2)), 16)
    m.set(orphan, v2)
    res = ConntrackScanner(4, m, now_ns=lambda: now, background=False).scan()
    assert res.cleaned == 3 and len(m) == 0


def test_timeouts_setting_parses_felixs_syntax_and_auto_reads_the_sysctl() -> None:
    assert parse_go_duration("1h30m") == 5400 * S and parse_go_duration("500ms") == S // 2
    setting = parse_timeouts_setting("TCPEstablished=2h, TCPFinsSeen=Auto,ICMPTimeout=Auto")
    t = resolve_timeouts(setting, {"nf_conntrack_tcp_timeout_time_wait": "120\n"}.get)
    assert (t.TCPEstablished, t.TCPFinsSeen, t.ICMPTimeout, t.UDPTimeout) == (7200 * S, 120 * S, 5 * S, 60 * S)
    for bad in ("TCPEstablished=forever", "Bogus=1s", "TCPEstablished"):
        with pytest.raises(ValueError):
            parse_timeouts_setting(bad)


def test_background_scanner_runs_off_the_apply_path_and_wakes_for_forgotten_addresses() -> None:
    import gc
    import time

    m = FakeMap(CT4.sized(8))
    k = ct_entry(m, 6, "10.65.0.2", 1, "8.8.8.8", 443, last_seen=1 << 62, legs="syn ack")
    s = ConntrackScanner(4, m, period=3600.0)
    s.apply()  # returns at once: the scan runs in its own thread
    deadline = time.monotonic() + 30
    while s.scans < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.scans >= 1 and m.get(k) is not None
    s.forget_addresses(["10.65.0.2"])
    while m.get(k) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert m.get(k) is None
    thread = s._thread
    assert thread is not None and thread.is_alive() and thread.name == "bpf-ct-scan-v4"
    del s
    gc.collect()
    thread.join(timeout=15)  # only a weak reference: the thread ends with its scanner
    assert not thread.is_alive()


def test_conntrack_metrics_are_exposed_under_felixs_names_and_types() -> None:
    from prometheus_client import REGISTRY

    from felixpy.metrics import exposition

    m = FakeMap(CT4.sized(8))
    ct_entry(m, 17, "10.0.0.1", 1, "10.0.0.2", 53, last_seen=0)
    ct_entry(m, 17, "10.0.0.1", 2, "10.0.0.2", 53, last_seen=1 << 62)
    ConntrackScanner(4, m, now_ns=lambda: 1000 * S, background=False).scan()
    text = exposition([REGISTRY]).decode()
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE felix_bpf_conntrack"))
    assert types == {"felix_bpf_conntrack_sweeps": "counter", "felix_bpf_conntrack_used": "gauge",
                     "felix_bpf_conntrack_cleaned": "gauge", "felix_bpf_conntrack_cleaned_total": "gauge",
                     "felix_bpf_conntrack_sweep_duration": "gauge", "felix_bpf_conntrack_expired": "gauge"}
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith("felix_bpf_conntrack")}
    assert values["felix_bpf_conntrack_used"] == 2 and values["felix_bpf_conntrack_cleaned"] == 1
    assert values["felix_bpf_conntrack_expired"] == 1 and values["felix_bpf_conntrack_sweeps"] >= 1


def test_routes_rendered_ahead_of_insync_reach_the_map_only_at_the_apply_and_follow_later_interfaces() -> None:
    """The route manager renders ahead of InSync (managers/base.py): the routes map stays untouched
    until the apply; an interface that comes up after the render still gets its ifindex in the route,
    and one whose endpoint arrives after it too."""
    n, fb = node()
    n.send(wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00:65::2/128"]))
    n.dp.render_ahead()
    from felixpy.managers.bpf_maps import BPFRouteManager
    mgrs = [m for m in n.dp.managers if isinstance(m, BPFRouteManager)]
    assert len(mgrs) == 2 and all(m._programmed for m in mgrs)  # rendered (v4 and v6)
    assert routes(fb) == {} and routes(fb, True) == {}  # nothing written
    idx = n.link_up("cali1")  # after the render
    idx2 = n.link_up("cali2")
    n.send(wep("b", "cali2", ipv4=["10.65.0.3/32"]))  # after the interface
    n.dp.render_ahead()
    n.apply()
    assert routes(fb)["10.65.0.2/32"][:2] == (defs.RT_LOCAL | defs.RT_WORKLOAD, idx)
    assert routes(fb, True)["fd00:65::2/128"][:2] == (defs.RT_LOCAL | defs.RT_WORKLOAD, idx)
    assert routes(fb)["10.65.0.3/32"][:2] == (defs.RT_LOCAL | defs.RT_WORKLOAD, idx2)
