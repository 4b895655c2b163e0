"""Route table driver against the fake kernel: ownership, conflicts, grace, failures, conntrack, ARP."""

from __future__ import annotations

import errno

import pytest

from felixpy.drivers.cmdshim import EXIT_TIMED_OUT
from felixpy.drivers.netlink.fake import FailFlags, FakeNetlink
from felixpy.drivers.netlink.types import AF_INET, AF_INET6, RTN_BLACKHOLE, Neigh, Route
from felixpy.drivers.routetable import ExclusiveOwnershipPolicy, RouteTable, Target, TargetType
from felixpy.drivers.routetable.conntrack import ConntrackFlusher
from felixpy.errors import DataplaneError
from felixpy.ifacemonitor.events import IfaceState
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.testing.clock import FakeClock

from .helpers import ConntrackRecorder, main_table

LW = RouteClass.LOCAL_WORKLOAD


@pytest.fixture
def fake() -> FakeNetlink:
    f = FakeNetlink()
    f.add_link("eth0")
    f.add_link("cali1")
    f.add_link("cali2")
    return f


def dsts(fake: FakeNetlink, family: int = AF_INET, table: int = 254) -> set[str]:
    return set(fake.routes_in(table, family))


def test_first_apply_programs_routes_and_sweeps_only_ours(fake: FakeNetlink) -> None:
    clock = FakeClock()
    eth0 = fake._by_name("eth0").index
    cali1 = fake._by_name("cali1").index
    fake.add_route(Route(AF_INET, "192.168.0.0/24", protocol=2, oif=eth0, scope=253))  # kernel route: not ours
    fake.add_route(Route(AF_INET, "10.9.0.0/16", protocol=3, oif=eth0, gateway="192.168.0.1"))  # boot, not cali: not ours
    fake.add_route(Route(AF_INET, "10.1.1.1/32", protocol=3, oif=cali1, scope=253))  # stale workload route: ours
    fake.add_route(Route(AF_INET, "10.2.0.0/26", type=RTN_BLACKHOLE, protocol=80))  # stale blackhole: ours
    fake.add_route(Route(AF_INET, "10.3.0.0/26", type=RTN_BLACKHOLE, protocol=3))  # foreign blackhole: not ours
    rt = main_table(fake, clock)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
    clock.advance(11)  # let the grace period of the pre-existing interfaces pass
    rt.apply()
    assert dsts(fake) == {"192.168.0.0/24", "10.9.0.0/16", "10.0.0.1/32", "10.3.0.0/26"}
    r = fake.routes_in()["10.0.0.1/32"]
    assert (r.oif, r.protocol, r.scope) == (cali1, 3, 253)


def test_grace_period_spares_unknown_routes_on_new_workload_iface(fake: FakeNetlink) -> None:
    clock = FakeClock()
    rt = main_table(fake, clock)
    rt.apply()
    # The CNI plugin creates a veth and its route before we hear of the endpoint.
    new = fake.add_link("cali9")
    fake.add_route(Route(AF_INET, "10.0.0.9/32", protocol=3, oif=new.index, scope=253))
    rt.on_iface_state("cali9", IfaceState.UP, new.index)
    rt.queue_resync()
    rt.apply()
    assert "10.0.0.9/32" in dsts(fake)
    assert rt.next_deadline() == pytest.approx(10.0)
    clock.advance(5)
    rt.apply()
    assert "10.0.0.9/32" in dsts(fake)
    clock.advance(6)
    rt.apply()
    assert "10.0.0.9/32" not in dsts(fake)


def test_grace_period_ends_early_once_we_have_routes_for_the_iface(fake: FakeNetlink) -> None:
    clock = FakeClock()
    rt = main_table(fake, clock)
    rt.apply()
    new = fake.add_link("cali9")
    fake.add_route(Route(AF_INET, "10.0.0.99/32", protocol=3, oif=new.index, scope=253))
    rt.on_iface_state("cali9", IfaceState.UP, new.index)
    rt.set_routes(LW, "cali9", [Target("10.0.0.9/32")])
    rt.queue_resync()
    rt.apply()
    assert dsts(fake) == {"10.0.0.9/32"}


def test_conflicts_lowest_class_then_highest_ifindex(fake: FakeNetlink) -> None:
    clock = FakeClock()
    vx = fake.add_link("vxlan.calico", kind="vxlan")
    rt = main_table(fake, clock)
    cidr = "10.0.0.5/32"
    rt.set_routes(RouteClass.VXLAN_TUNNEL, "vxlan.calico", [Target(cidr, TargetType.VXLAN, gw="10.5.0.1")])
    rt.apply()
    assert fake.routes_in()[cidr].oif == vx.index
    rt.set_routes(LW, "cali1", [Target(cidr)])
    rt.apply()
    assert fake.routes_in()[cidr].oif == fake._by_name("cali1").index
    rt.set_routes(LW, "cali2", [Target(cidr)])  # same class: higher ifindex wins
    rt.apply()
    assert fake.routes_in()[cidr].oif == fake._by_name("cali2").index
    rt.set_routes(LW, "cali2", [])
    rt.set_routes(LW, "cali1", [])
    rt.apply()
    r = fake.routes_in()[cidr]
    assert (r.oif, r.gateway, r.onlink) == (vx.index, "10.5.0.1", True)


def test_set_routes_replaces_the_pair_only(fake: FakeNetlink) -> None:
    rt = main_table(fake, FakeClock())
    rt.set_routes(RouteClass.BLACKHOLE_VXLAN, None, [Target("10.1.0.0/26", TargetType.BLACKHOLE, protocol=80)])
    rt.set_routes(RouteClass.BLACKHOLE_IPIP, None, [Target("10.2.0.0/26", TargetType.BLACKHOLE, protocol=80)])
    rt.apply()
    assert dsts(fake) == {"10.1.0.0/26", "10.2.0.0/26"}
    rt.set_routes(RouteClass.BLACKHOLE_IPIP, None, [])
    rt.apply()
    assert dsts(fake) == {"10.1.0.0/26"}


def test_routes_on_down_iface_are_skipped_and_return_when_up(fake: FakeNetlink) -> None:
    rt = main_table(fake, FakeClock())
    rt.apply()
    down = fake.set_link_state("cali2", False)
    rt.on_iface_state("cali2", IfaceState.DOWN, down.index)
    rt.set_routes(LW, "cali2", [Target("10.0.0.2/32")])
    rt.apply()
    assert "10.0.0.2/32" not in dsts(fake)
    up = fake.set_link_state("cali2", True)
    rt.on_iface_state("cali2", IfaceState.UP, up.index)
    rt.apply()
    assert "10.0.0.2/32" in dsts(fake)


def test_route_for_unknown_iface_waits_for_it(fake: FakeNetlink) -> None:
    rt = main_table(fake, FakeClock())
    rt.set_routes(LW, "cali7", [Target("10.0.0.7/32")])
    rt.apply()
    assert "10.0.0.7/32" not in dsts(fake)
    link = fake.add_link("cali7")
    rt.on_iface_state("cali7", IfaceState.UP, link.index)
    rt.apply()
    assert fake.routes_in()["10.0.0.7/32"].oif == link.index


def test_one_failed_route_stays_dirty_and_does_not_block_others(fake: FakeNetlink) -> None:
    rt = main_table(fake, FakeClock())
    fake.fail_route_dsts["10.0.0.2/32"] = errno.EINVAL
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32"), Target("10.0.0.2/32"), Target("10.0.0.3/32")])
    with pytest.raises(DataplaneError):
        rt.apply()
    assert dsts(fake) == {"10.0.0.1/32", "10.0.0.3/32"}
    assert not rt.in_sync()
    del fake.fail_route_dsts["10.0.0.2/32"]
    rt.apply()
    assert dsts(fake) == {"10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32"}
    assert rt.in_sync()


@pytest.mark.parametrize("flag", [FailFlags.CONNECT, FailFlags.LINK_LIST, FailFlags.ROUTE_LIST,
                                  FailFlags.ROUTE_REPLACE])
def test_transient_failure_is_retried_inline(fake: FakeNetlink, flag: FailFlags) -> None:
    rt = main_table(fake, FakeClock())
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
    fake.fail_next = flag
    rt.apply()  # one inline retry with a fresh handle absorbs a one-off failure
    assert dsts(fake) == {"10.0.0.1/32"}


@pytest.mark.parametrize("flag", [FailFlags.CONNECT, FailFlags.LINK_LIST, FailFlags.ROUTE_LIST,
                                  FailFlags.ROUTE_REPLACE, FailFlags.ROUTE_DELETE])
def test_persistent_failure_raises_and_recovers(fake: FakeNetlink, flag: FailFlags) -> None:
    cali1 = fake._by_name("cali1").index
    fake.add_route(Route(AF_INET, "10.9.9.9/32", protocol=3, oif=cali1, scope=253))
    clock = FakeClock()
    rt = main_table(fake, clock)
    clock.advance(11)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
    fake.fail_always = flag
    with pytest.raises(DataplaneError):
        rt.apply()
    fake.fail_always = FailFlags.NONE
    rt.apply()
    assert dsts(fake) == {"10.0.0.1/32"}


def test_iface_vanishing_mid_apply_is_not_an_error(fake: FakeNetlink) -> None:
    rt = main_table(fake, FakeClock())
    rt.apply()
    rt.set_routes(LW, "cali2", [Target("10.0.0.2/32")])
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
    fake.remove_link("cali2")  # the CNI plugin deleted it; we have not heard yet
    rt.apply()
    assert dsts(fake) == {"10.0.0.1/32"}
    assert rt.in_sync()


def test_restart_sweeps_routes_of_previous_instance() -> None:
    fake = FakeNetlink()
    for n in ("cali1", "cali2", "eth0"):
        fake.add_link(n)
    clock = FakeClock()
    old = main_table(fake, clock)
    old.set_routes(LW, "cali1", [Target("10.0.0.1/32"), Target("10.0.0.11/32")])
    old.set_routes(LW, "cali2", [Target("10.0.0.2/32")])
    old.set_routes(RouteClass.BLACKHOLE_VXLAN, None, [Target("10.0.1.0/26", TargetType.BLACKHOLE, protocol=80)])
    old.apply()
    # A new process with a different datastore: cali2's workload is gone, another block.
    new = main_table(fake, clock)
    new.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
    new.set_routes(RouteClass.BLACKHOLE_VXLAN, None, [Target("10.0.2.0/26", TargetType.BLACKHOLE, protocol=80)])
    new.apply()
    # cali1 has routes from us, so its strays go at once; cali2's wait for the grace period.
    assert dsts(fake) == {"10.0.0.1/32", "10.0.0.2/32", "10.0.2.0/26"}
    clock.advance(10.5)
    new.apply()
    assert dsts(fake) == {"10.0.0.1/32", "10.0.2.0/26"}


def test_resync_repairs_drift_without_touching_correct_routes(fake: FakeNetlink) -> None:
    rt = main_table(fake, FakeClock())
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32"), Target("10.0.0.2/32")])
    rt.apply()
    fake.routes = {k: v for k, v in fake.routes.items() if v.dst != "10.0.0.2/32"}  # someone deleted one
    before = dict(fake.routes)
    rt.queue_resync()
    fake.fail_route_dsts["10.0.0.1/32"] = errno.EPERM  # would fail if (wrongly) rewritten
    rt.apply()
    assert dsts(fake) == {"10.0.0.1/32", "10.0.0.2/32"}
    assert all(fake.routes[k] == v for k, v in before.items())


def test_metric_and_tos_are_part_of_the_key(fake: FakeNetlink) -> None:
    cali1 = fake._by_name("cali1").index
    clock = FakeClock()
    fake.add_route(Route(AF_INET, "10.0.0.1/32", protocol=3, oif=cali1, scope=253, priority=0))
    rt = main_table(fake, clock)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32", priority=1024)])
    rt.apply()
    assert [(r.dst, r.priority) for r in fake.routes.values()] == [("10.0.0.1/32", 1024)]


def test_static_arp_entries(fake: FakeNetlink) -> None:
    rt = main_table(fake, FakeClock(), static_arp=True)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32", dest_mac="EE:EE:EE:EE:EE:01")])
    rt.set_routes(RouteClass.VXLAN_SAME_SUBNET, "eth0", [Target("10.0.9.0/26", TargetType.NOENCAP, gw="1.1.1.1",
                                                                dest_mac="ee:ee:ee:ee:ee:02")])
    fake.fail_always = FailFlags.NEIGH_REPLACE
    with pytest.raises(DataplaneError):
        rt.apply()
    assert "10.0.0.1/32" in dsts(fake)  # the route itself landed
    fake.fail_always = FailFlags.NONE
    rt.apply()
    neighs = {(n.dst, n.lladdr) for n in fake.neighs.values()}
    assert neighs == {("10.0.0.1", "ee:ee:ee:ee:ee:01")}  # only workload interfaces get ARP


def test_resync_skips_static_arp_entries_the_kernel_already_has(fake: FakeNetlink) -> None:
    cali1 = fake._by_name("cali1").index
    fake.neighs[(AF_INET, cali1, "10.0.0.1")] = Neigh(AF_INET, cali1, "10.0.0.1", "ee:ee:ee:ee:ee:01")
    fake.neighs[(AF_INET, cali1, "10.0.0.2")] = Neigh(AF_INET, cali1, "10.0.0.2", "ee:ee:ee:ee:ee:02", state=0x02)
    fake.neighs[(AF_INET, cali1, "10.0.0.3")] = Neigh(AF_INET, cali1, "10.0.0.3", "ee:ee:ee:ee:ee:99")
    rt = main_table(fake, FakeClock(), static_arp=True)
    targets = [Target(f"10.0.0.{i}/32", dest_mac=f"ee:ee:ee:ee:ee:0{i}") for i in (1, 2, 3)]
    rt.set_routes(LW, "cali1", targets[:1])
    fake.fail_always = FailFlags.NEIGH_REPLACE  # any neighbour write would now fail the apply
    rt.apply()  # 10.0.0.1 is already there, permanent, with this MAC: nothing to write
    assert rt.in_sync()
    rt.set_routes(LW, "cali1", targets)
    with pytest.raises(DataplaneError):
        rt.apply()  # outside a resync pending entries are written without a dump
    rt.queue_resync()
    with pytest.raises(DataplaneError):
        rt.apply()  # reachable (not permanent) and wrong-MAC entries still need writing
    fake.fail_always = FailFlags.NONE
    rt.apply()
    assert {(n.dst, n.lladdr, n.state) for n in fake.neighs.values()} == {
        ("10.0.0.1", "ee:ee:ee:ee:ee:01", 0x80), ("10.0.0.2", "ee:ee:ee:ee:ee:02", 0x80),
        ("10.0.0.3", "ee:ee:ee:ee:ee:03", 0x80)}


def test_the_resyncs_neighbour_dump_asks_only_about_interfaces_with_entries_pending(fake: FakeNetlink) -> None:
    """A large node's 5,000 VXLAN neighbours are not read into objects to check 250 workloads' entries."""
    asked: list[set[str] | None] = []
    neigh_list = fake.neigh_list
    fake.neigh_list = lambda *a, names=None, **k: (  # type: ignore[method-assign]
        asked.append(None if names is None else set(names.values())) or neigh_list(*a, names=names, **k))
    cali2 = fake._by_name("cali2").index
    fake.neighs[(AF_INET, cali2, "10.0.0.9")] = Neigh(AF_INET, cali2, "10.0.0.9", "ee:ee:ee:ee:ee:09")
    rt = main_table(fake, FakeClock(), static_arp=True)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32", dest_mac="ee:ee:ee:ee:ee:01")])
    rt.set_routes(LW, "cali9", [Target("10.0.0.5/32", dest_mac="ee:ee:ee:ee:ee:05")])  # no such interface
    rt.apply()
    assert asked == [{"cali1"}]
    assert {(n.dst, n.lladdr) for n in fake.neighs.values()} == {("10.0.0.1", "ee:ee:ee:ee:ee:01"),
                                                                 ("10.0.0.9", "ee:ee:ee:ee:ee:09")}
    rt.set_routes(LW, "cali1", [])
    rt.queue_resync()
    rt.apply()  # nothing pending on an interface that exists: no dump
    assert asked == [{"cali1"}]


def test_static_arp_written_when_the_neighbour_dump_fails(fake: FakeNetlink) -> None:
    rt = main_table(fake, FakeClock(), static_arp=True)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32", dest_mac="ee:ee:ee:ee:ee:01")])
    fake.fail_always = FailFlags.NEIGH_LIST
    rt.apply()
    assert {(n.dst, n.lladdr) for n in fake.neighs.values()} == {("10.0.0.1", "ee:ee:ee:ee:ee:01")}


def test_exclusive_table_owns_everything_via_its_iface() -> None:
    fake = FakeNetlink()
    wg = fake.add_link("wireguard.cali", kind="wireguard")
    fake.add_route(Route(AF_INET, "10.7.0.0/26", table=1, oif=wg.index, protocol=2))
    fake.add_route(Route(AF_INET, "10.8.0.0/26", table=1, type=9, protocol=2))  # throw
    fake.add_route(Route(AF_INET, "10.6.0.0/26", table=254, oif=wg.index, protocol=2))  # other table
    rt = RouteTable(ip_version=4, new_handle=fake.factory, table_index=1,
                    ownership=ExclusiveOwnershipPolicy(["wireguard.cali"]))
    rt.set_routes(RouteClass.WIREGUARD, "wireguard.cali", [Target("10.5.0.0/26")])
    rt.apply()
    assert dsts(fake, table=1) == {"10.5.0.0/26"}
    assert dsts(fake, table=254) == {"10.6.0.0/26"}


def test_ipv6_table() -> None:
    fake = FakeNetlink()
    cali1 = fake.add_link("cali1")
    fake.add_route(Route(AF_INET6, "fe80::/64", oif=cali1.index, protocol=2, priority=256))
    fake.add_route(Route(AF_INET6, "fd00::99/128", oif=cali1.index, protocol=3))
    clock = FakeClock()
    rt = main_table(fake, clock, ip_version=6)
    rt.set_routes(LW, "cali1", [Target("fd00::1/128")])
    rt.set_routes(RouteClass.BLACKHOLE_VXLAN, None, [Target("fd00:1::/122", TargetType.BLACKHOLE, protocol=80)])
    rt.apply()
    assert dsts(fake, AF_INET6) == {"fe80::/64", "fd00::1/128", "fd00:1::/122"}
    r = fake.routes_in(254, AF_INET6)["fd00:1::/122"]
    assert (r.oif, r.priority) == (1, 1024)
    rt.queue_resync()
    rt.apply()
    assert rt.in_sync()  # the v6 read-back matches what we want (scope, metric, oif 1)


def test_conntrack_cleanup_when_address_moves(fake: FakeNetlink) -> None:
    runner = ConntrackRecorder()
    rt = main_table(fake, FakeClock(), runner=runner)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
    rt.apply()
    assert runner.calls == []
    rt.set_routes(LW, "cali1", [])
    rt.set_routes(LW, "cali2", [Target("10.0.0.1/32")])
    rt.apply()
    rt.conntrack.wait_all()
    assert runner.calls == [
        ["conntrack", "--family", "ipv4", "--delete", "--orig-src", "10.0.0.1"],
        ["conntrack", "--family", "ipv4", "--delete", "--reply-src", "10.0.0.1"],
    ]
    assert fake.routes_in()["10.0.0.1/32"].oif == fake._by_name("cali2").index


def test_conntrack_not_cleaned_for_remote_to_remote_moves(fake: FakeNetlink) -> None:
    runner = ConntrackRecorder()
    fake.add_link("vxlan.calico", kind="vxlan")
    rt = main_table(fake, FakeClock(), runner=runner)
    rt.set_routes(RouteClass.VXLAN_TUNNEL, "vxlan.calico", [Target("10.0.0.1/32", TargetType.VXLAN, gw="10.5.0.1")])
    rt.apply()
    rt.set_routes(RouteClass.VXLAN_TUNNEL, "vxlan.calico", [])
    rt.set_routes(RouteClass.VXLAN_SAME_SUBNET, "eth0", [Target("10.0.0.1/32", TargetType.NOENCAP, gw="1.1.1.1")])
    rt.apply()
    rt.conntrack.wait_all()
    assert runner.calls == []
    # Remote -> local is a move.
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
    rt.apply()
    rt.conntrack.wait_all()
    assert runner.flushed() == {"10.0.0.1"}


def test_conntrack_retries_and_treats_no_entries_as_success(fake: FakeNetlink) -> None:
    runner = ConntrackRecorder(output="some transient error", rc=1)
    rt = main_table(fake, FakeClock(), runner=runner)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
    rt.apply()
    rt.set_routes(LW, "cali1", [])
    rt.apply()
    rt.conntrack.wait_all()
    assert len(runner.calls) == 8  # 4 tries per direction
    assert "10.0.0.1/32" not in dsts(fake)


def test_conntrack_timeout_gives_up_at_once() -> None:
    runner = ConntrackRecorder(output="conntrack: timed out after 60.0s", rc=EXIT_TIMED_OUT)
    assert ConntrackFlusher(runner, sleep=lambda s: None).remove_flows(4, "10.0.0.1") is False
    assert runner.calls == [["conntrack", "--family", "ipv4", "--delete", "--orig-src", "10.0.0.1"]]


def test_other_routes_are_not_held_up_by_conntrack(fake: FakeNetlink) -> None:
    import threading

    gate = threading.Event()
    runner = ConntrackRecorder(block=gate)
    rt = main_table(fake, FakeClock(), runner=runner)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
    rt.apply()
    rt.set_routes(LW, "cali1", [Target("10.0.0.2/32")])
    rt.set_routes(LW, "cali2", [Target("10.0.0.1/32")])
    observed: list[set[str]] = []
    real = fake.routes_replace

    def spy(routes):  # type: ignore[no-untyped-def]
        out = real(routes)
        observed.append(dsts(fake))
        if len(observed) == 1:
            gate.set()  # the flush may finish only after the first batch landed
        return out

    fake.routes_replace = spy  # type: ignore[method-assign]
    rt.apply()
    assert "10.0.0.2/32" in observed[0] and "10.0.0.1/32" not in observed[0]
    assert fake.routes_in()["10.0.0.1/32"].oif == fake._by_name("cali2").index


def test_a_route_the_policy_would_not_call_ours_is_programmed_and_named_once(fake: FakeNetlink) -> None:
    """The main table programs what it is given, but a route its ownership policy does not claim (here via a
    non-workload device with the shared boot protocol, and a blackhole without Calico's protocol) cannot be
    recognised after a restart: that is logged as an error, once per interface and protocol; routes it does
    claim (a workload route, a blackhole with protocol 80) are not."""
    from structlog.testing import capture_logs
    clock = FakeClock()
    rt = main_table(fake, clock)
    with capture_logs() as logs:
        rt.set_routes(LW, "cali1", [Target("10.0.0.1/32")])
        rt.set_routes(LW, "eth0", [Target("10.9.0.0/16", gw="192.168.0.1")])
        rt.route_update(LW, "eth0", Target("10.9.1.0/24", gw="192.168.0.1"))
        rt.set_routes(RouteClass.BLACKHOLE_NO_ENCAP, None, [Target("10.2.0.0/26", TargetType.BLACKHOLE, protocol=80),
                                                            Target("10.3.0.0/26", TargetType.BLACKHOLE)])
    unclaimed = [(e["iface"], e["protocol"]) for e in logs if e["log_level"] == "error"]
    assert unclaimed == [("eth0", 3), (None, 3)]
    clock.advance(11)
    rt.apply()
    assert {"10.0.0.1/32", "10.9.0.0/16", "10.9.1.0/24", "10.3.0.0/26", "10.2.0.0/26"} <= dsts(fake)


def test_a_full_resync_dumps_through_its_own_link_listing(fake: FakeNetlink) -> None:
    # The route and neighbour dumps trust the names the listing just before them found (the fake, like
    # ``ip``, leaves out what an interface made or renamed since then has): an interface made between
    # the listing and the dumps is not taken for one the table knows.
    made_late: list[int] = []
    listing = fake.link_list

    def list_then_make() -> list:  # type: ignore[type-arg]
        links = listing()
        if not made_late:
            late = fake.add_link("cali9")
            fake.add_route(Route(AF_INET, "10.9.9.9/32", protocol=3, oif=late.index, scope=253))
            made_late.append(late.index)
        return links

    fake.link_list = list_then_make  # type: ignore[method-assign]
    seen: list[dict[int, str] | None] = []
    route_list = fake.route_list
    fake.route_list = lambda *a, names=None, **k: seen.append(names) or route_list(*a, names=names, **k)  # type: ignore
    rt = main_table(fake, FakeClock(), static_arp=True)
    rt.set_routes(LW, "cali1", [Target("10.0.0.1/32", dest_mac="ee:ee:ee:ee:ee:01")])
    rt.apply()
    assert seen == [{link.index: link.name for link in fake.links.values() if link.index not in made_late}]
    assert rt.in_sync() and "10.0.0.1/32" in dsts(fake)
    assert "10.9.9.9/32" in dsts(fake)  # not seen, so neither swept nor counted as ours
