"""``felixpy_drift_repairs{kind}`` and the "drift repaired" log line, over the stateful fakes.

The counter moves exactly when a resync finds something changed behind the driver's back and the driver
rewrites it — never for ordinary desired-state changes, never at start of day (an earlier run's leftovers
are cleanup), and never for a refresh that found everything as it was left.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from felixpy.drivers import drift
from felixpy.drivers.generictables.model import Accept, Chain, Drop, Jump, Match, Rule
from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.iptables.detect import Features, StaticFeatures
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.iptables.metrics import get_metrics
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.drivers.netlink.fake import FakeNetlink
from felixpy.drivers.netlink.types import AF_INET, AF_INET6, Route
from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.routetable import Target
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.ifacemonitor.events import IfaceState
from felixpy.testing.clock import FakeClock

sys.path.insert(0, str(Path(__file__).parent / "nftables"))
import nft_helpers as hp  # noqa: E402
from nft_helpers import Harness, program_typical  # noqa: E402

from routing.helpers import main_table  # noqa: E402

V46 = pytest.mark.parametrize("v", [4, 6])


class Counts:
    """The counter's movement since the test began, per kind."""

    def __init__(self) -> None:
        self.start = {k: drift.count(k) for k in drift.KINDS}

    def moved(self) -> dict[str, int]:
        return {k: int(drift.count(k) - v) for k, v in self.start.items() if drift.count(k) != v}


@pytest.fixture
def counts() -> Counts:
    return Counts()


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    with capture_logs() as cap:
        yield cap


def drift_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "drift repaired"]


def test_rule_drift_counts_changed_rules_not_shifts() -> None:
    assert drift.rule_drift(["a", "b", "c"], ["a", "b", "c"]) == 0
    assert drift.rule_drift(["a", "b", "c"], ["a", "x", "c"]) == 1   # altered
    assert drift.rule_drift(["a", "b", "c"], ["b", "c"]) == 1        # deleted (the rest shifted)
    assert drift.rule_drift(["a", "b"], ["", "a", "b"]) == 1         # one added above
    assert drift.rule_drift(["a", "b"], ["b", "a"]) == 1             # only reordered
    assert drift.rule_drift(["a", "b", "c"], []) == 3                # flushed


def test_tally_rejects_unknown_kinds_and_logs_nothing_when_empty(logs: list[dict[str, Any]]) -> None:
    import structlog

    t = drift.DriftTally(structlog.get_logger("t"), table="x")
    with pytest.raises(ValueError):
        t.found("chainz")
    assert t.repaired() == {} and not drift_lines(logs)


# ---------------------------------------------------------------------------------------------- iptables
FEATURES = Features(MASQFullyRandom=True)


def ipt_table(fake: FakeIptables, clock: FakeClock, v: int, backend: str) -> IptablesTable:
    return IptablesTable("filter", v, runner=fake, backend=backend, features=StaticFeatures(FEATURES),
                         clock=clock.monotonic, sleep=clock.sleep, refresh_interval=10.0,
                         metrics=get_metrics(CollectorRegistry()))


def ipt_program(t: IptablesTable, v: int) -> None:
    net = "10.0.0.0/8" if v == 4 else "fd00::/8"
    t.update_chain(Chain("cali-FORWARD", (Rule(Match().source_net(net), Jump("cali-pol")),
                                          Rule(Match().protocol("udp"), Drop()))))
    t.update_chain(Chain("cali-pol", (Rule(Match().protocol("tcp").dest_ports(80), Accept()),
                                      Rule(Match().protocol("tcp").dest_ports(443), Accept()),
                                      Rule(action=Drop()))))
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
    t.append_rules("FORWARD", [Rule(Match().protocol("udp"), Accept()), Rule(Match().protocol("tcp"), Accept())])


def ext(fake: FakeIptables, v: int, backend: str, *lines: str) -> None:
    fake.external_restore("*filter\n" + "".join(ln + "\n" for ln in lines) + "COMMIT\n", ip_version=v,
                          backend=backend)


IPT_DRIFT: dict[str, tuple[list[str], dict[str, int]]] = {
    "chain deleted": (["-F cali-pol", "-D cali-FORWARD 1", "COMMIT", "*filter", "-X cali-pol"],
                      {"chain": 1, "rule": 1}),
    "rule altered": (["-R cali-pol 2 -p tcp --dport 444 -j ACCEPT"], {"rule": 1}),
    "rule deleted": (["-D cali-pol 1"], {"rule": 1}),
    "foreign rule above our jump": (["-I FORWARD 1 -s {net} -j ACCEPT"], {"rule": 1}),
    "our chain flushed": (["-F cali-pol"], {"rule": 3}),
    "stray chain of ours": ([":cali-stray - [0:0]"], {"chain": 1}),
    "foreign rule below our appends": (["-A FORWARD -s {net} -j ACCEPT"], {"rule": 2}),
}


@V46
@pytest.mark.parametrize("backend", ["legacy", "nft"])
@pytest.mark.parametrize("kind", sorted(IPT_DRIFT))
def test_iptables_counts_drift_once_when_repaired(counts: Counts, logs: list[dict[str, Any]], v: int,
                                                  backend: str, kind: str) -> None:
    fake, clock = FakeIptables(default_backend=backend), FakeClock()
    net = "192.0.2.1/32" if v == 4 else "2001:db8::1/128"
    ext(fake, v, backend, "-A FORWARD -s " + net + " -j DROP")  # foreign, before we start: not drift
    t = ipt_table(fake, clock, v, backend)
    ipt_program(t, v)
    t.apply()
    good = fake.save("filter", v, backend)
    clock.advance(11)
    t.apply()                                   # a refresh that finds everything as left
    assert counts.moved() == {} and not drift_lines(logs)
    lines, want = IPT_DRIFT[kind]
    ext(fake, v, backend, *(ln.format(net=net) for ln in lines))
    clock.advance(11)
    t.apply()
    assert counts.moved() == want
    (line,) = drift_lines(logs)
    assert line["table"] == "filter" and line["ip_version"] == v
    assert {drift._PLURAL[k]: n for k, n in want.items()} == {k: line[k] for k in drift._PLURAL.values() if k in line}
    repaired = fake.save("filter", v, backend)
    if kind.startswith("foreign rule"):
        assert f"-A FORWARD -s {net} -j ACCEPT" in repaired and repaired.index("cali-FORWARD") < repaired.index(
            f"-s {net} -j ACCEPT")
        if kind == "foreign rule below our appends":   # ours are last again
            assert repaired.index(f"-s {net} -j ACCEPT") < repaired.index("-p tcp")
        repaired = repaired.replace(f"-A FORWARD -s {net} -j ACCEPT\n", "")
    if kind == "stray chain of ours":
        assert "cali-stray" not in repaired
    assert repaired == good
    assert f"-A FORWARD -s {net} -j DROP" in repaired    # the foreign rule is untouched
    clock.advance(11)
    t.apply()
    assert counts.moved() == want and len(drift_lines(logs)) == 1   # repaired once, counted once


@V46
def test_iptables_desired_changes_and_start_of_day_leftovers_are_not_drift(counts: Counts,
                                                                           logs: list[dict[str, Any]],
                                                                           v: int) -> None:
    fake, clock = FakeIptables(default_backend="legacy"), FakeClock()
    ext(fake, v, "legacy", ":cali-left-over - [0:0]", "-A cali-left-over -j DROP")
    t = ipt_table(fake, clock, v, "legacy")
    ipt_program(t, v)
    t.apply()                                   # start of day sweeps the leftover: cleanup, not drift
    assert "cali-left-over" not in fake.save("filter", v, "legacy")
    t.update_chain(Chain("cali-pol", (Rule(action=Accept()),)))
    t.remove_chain_by_name("cali-FORWARD")
    t.insert_or_append_rules("FORWARD", [])
    clock.advance(11)                           # the change and a refresh in one apply
    t.apply()
    clock.advance(11)
    t.apply()
    assert counts.moved() == {} and not drift_lines(logs)


def test_iptables_failed_repair_is_counted_once_when_it_finally_succeeds(counts: Counts,
                                                                         logs: list[dict[str, Any]]) -> None:
    fake, clock = FakeIptables(default_backend="legacy"), FakeClock()
    t = ipt_table(fake, clock, 4, "legacy")
    ipt_program(t, 4)
    t.apply()
    ext(fake, 4, "legacy", "-D cali-pol 1")
    fake.fail_next_restores = 2
    clock.advance(11)
    t.apply()
    assert counts.moved() == {"rule": 1} and len(drift_lines(logs)) == 1


# ---------------------------------------------------------------------------------------------- nftables
def _nft(fake: FakeNft, *cmds: dict[str, Any]) -> None:
    fake.run(list(cmds))


def nft_drift(v: int) -> dict[str, tuple[Any, dict[str, int]]]:
    T = hp.tbl(v)
    p = f"cali{v}0"
    a1 = "10.0.0.1" if v == 4 else "fd00::1"
    a9 = "10.9.9.9" if v == 4 else "fd00::99"
    far = ["10.7.0.1", "10.7.0.9"] if v == 4 else ["fd07::1", "fd07::9"]
    return {
        "rule deleted": (lambda f: _nft(f, {"delete": {"rule": {
            **T, "chain": "filter-cali-INPUT", "handle": hp.rule_handle(f, v, "filter-cali-INPUT", 1)}}}),
                         {"rule": 1}),
        "chain flushed": (lambda f: _nft(f, {"flush": {"chain": {**T, "name": "filter-cali-INPUT"}}}), {"rule": 4}),
        "foreign rule in our chain": (lambda f: _nft(f, {"add": {"rule": {**T, "chain": "filter-cali-INPUT",
                                                                          "expr": [{"accept": None}]}}}), {"rule": 1}),
        "stray chain": (lambda f: _nft(f, {"add": {"chain": {**T, "name": "someone-else"}}}), {"chain": 1}),
        "base chain deleted": (lambda f: _nft(f, {"delete": {"chain": {**T, "name": "raw-OUTPUT"}}}), {"chain": 1}),
        "set member removed": (lambda f: _nft(f, {"delete": {"element": {**T, "name": f"{p}s-hosts",
                                                                         "elem": [a1]}}}), {"set_member": 1}),
        "set member added": (lambda f: _nft(f, {"add": {"element": {**T, "name": f"{p}s-hosts", "elem": [a9]}}}),
                             {"set_member": 1}),
        # A shape we never write: read back as strings, not packed, and still one member to delete.
        "foreign range in a net set": (lambda f: _nft(f, {"add": {"element": {**T, "name": f"{p}s-web",
                                                                              "elem": [{"range": far}]}}}),
                                       {"set_member": 1}),
    }


@V46
@pytest.mark.parametrize("kind", sorted(nft_drift(4)))
@pytest.mark.parametrize("background", [False, True], ids=["listed-on-apply", "listed-in-background"])
def test_nftables_counts_drift_once_when_repaired(counts: Counts, logs: list[dict[str, Any]], v: int,
                                                  kind: str, background: bool) -> None:
    """The refresh lists the kernel on the apply path, or (the daemon's default with the nft child process)
    on a background thread whose listing the next apply merges: drift is counted either way."""
    fake, clock = FakeNft(), FakeClock()
    jobs: list[Callable[[], None]] = []
    extra: dict[str, Any] = {"lister": fake, "start_background": jobs.append} if background else {}
    h = Harness(v, fake, clock, refresh_interval=10.0, **extra)

    def refresh() -> None:
        clock.advance(11)
        h.root.apply()  # in the background case this starts the listing ...
        while jobs:
            jobs.pop(0)()  # ... which runs here ...
            h.root.apply()  # ... and is merged (and the drift repaired) by the next apply

    program_typical(h)
    h.root.apply()
    good = (hp.chains(fake, v), hp.sets(fake, v))
    refresh()
    assert counts.moved() == {} and not drift_lines(logs)
    change, want = nft_drift(v)[kind]
    change(fake)
    refresh()
    assert counts.moved() == want
    (line,) = drift_lines(logs)
    assert line["ip_version"] == v and line["table"] == "calico"
    after = hp.chains(fake, v)
    assert {n: [c for _, c, _ in x["rules"]] for n, x in after.items()} == \
        {n: [c for _, c, _ in x["rules"]] for n, x in good[0].items()}
    assert hp.sets(fake, v) == good[1]
    refresh()
    assert counts.moved() == want and len(drift_lines(logs)) == 1


@V46
def test_nftables_desired_changes_are_not_drift(counts: Counts, logs: list[dict[str, Any]], v: int) -> None:
    fake, clock = FakeNft(), FakeClock()
    h = Harness(v, fake, clock, refresh_interval=10.0)
    program_typical(h)
    h.root.apply()
    h.root.add_members("s:hosts", [h.addr(7)])
    h.root.remove_members("s:hosts", [h.addr(1)])
    h.filter.update_chain(Chain("cali-INPUT", (Rule(action=Accept()),)))
    clock.advance(11)
    h.root.apply()
    h.root.queue_resync()
    h.root.apply()
    assert counts.moved() == {} and not drift_lines(logs)


def test_nftables_set_refresh_counts_member_drift(counts: Counts) -> None:
    fake, clock = FakeNft(), FakeClock()
    h = Harness(4, fake, clock)
    program_typical(h)
    h.root.apply()
    _nft(fake, {"delete": {"element": {**hp.tbl(4), "name": "cali40s-hosts", "elem": ["10.0.0.1", "10.0.0.2"]}}})
    h.root.queue_resync()  # IpsetsRefreshInterval: re-reads the sets only
    h.root.apply()
    assert counts.moved() == {"set_member": 2}
    assert hp.sets(fake, 4)["cali40s-hosts"] == {"10.0.0.1", "10.0.0.2"}


# ---------------------------------------------------------------------------------------------- ipsets
def ipsets_driver(fake: FakeIPSet, clock: FakeClock, v: int) -> IPSets:
    return IPSets(v, fake, clock=clock.monotonic, sleep=clock.sleep)  # type: ignore[arg-type]


def addr(v: int, n: int) -> str:
    return f"10.0.0.{n}" if v == 4 else f"fd00::{n:x}"


def resync(d: IPSets) -> None:
    d.queue_resync()
    d.apply_updates()
    while d.apply_deletions():
        d.apply_updates()


@V46
def test_ipsets_member_and_set_drift_counted_when_repaired(counts: Counts, logs: list[dict[str, Any]],
                                                           v: int) -> None:
    clock = FakeClock()
    fake = FakeIPSet(clock)
    d = ipsets_driver(fake, clock, v)
    d.add_or_replace_ip_set(IPSetMetadata("s:a", IPSetType.HASH_IP), [addr(v, 1), addr(v, 2), addr(v, 3)])
    d.add_or_replace_ip_set(IPSetMetadata("s:b", IPSetType.HASH_IP), [addr(v, 4)])
    resync(d)
    a, b = d.names.name_for_main("s:a"), d.names.name_for_main("s:b")
    resync(d)
    assert counts.moved() == {} and not drift_lines(logs)
    fake.run(["ipset", "del", a, addr(v, 2)])        # a member removed
    fake.run(["ipset", "add", a, addr(v, 9)])        # a member added
    fake.run(["ipset", "destroy", b])                # a set destroyed
    resync(d)
    assert counts.moved() == {"set_member": 2, "set": 1}
    (line,) = drift_lines(logs)
    assert line["ip_version"] == v and line["set_members"] == 2 and line["sets"] == 1
    assert fake.members(a) == {addr(v, 1), addr(v, 2), addr(v, 3)} and fake.members(b) == {addr(v, 4)}
    resync(d)
    assert counts.moved() == {"set_member": 2, "set": 1} and len(drift_lines(logs)) == 1


@V46
def test_ipsets_updates_and_start_of_day_are_not_drift(counts: Counts, logs: list[dict[str, Any]], v: int) -> None:
    clock = FakeClock()
    fake = FakeIPSet(clock)
    d = ipsets_driver(fake, clock, v)
    stale = d.names.name_for_main("s:old")
    fake.add_set(stale, family="inet" if v == 4 else "inet6")  # an earlier run's set: cleanup, not drift
    d.add_or_replace_ip_set(IPSetMetadata("s:a", IPSetType.HASH_IP), [addr(v, 1)])
    resync(d)
    assert stale not in fake.sets
    d.add_members("s:a", [addr(v, 5)])
    d.remove_members("s:a", [addr(v, 1)])
    d.add_or_replace_ip_set(IPSetMetadata("s:c", IPSetType.HASH_IP), [addr(v, 6)])
    resync(d)
    d.remove_ip_set("s:c")
    resync(d)
    resync(d)
    assert counts.moved() == {} and not drift_lines(logs)


# ---------------------------------------------------------------------------------------------- routes
@V46
def test_route_drift_counted_when_repaired_and_foreign_routes_untouched(counts: Counts,
                                                                        logs: list[dict[str, Any]],
                                                                        v: int) -> None:
    fam = AF_INET if v == 4 else AF_INET6
    fake = FakeNetlink()
    eth0, cali1 = fake.add_link("eth0"), fake.add_link("cali1")
    p = "10.0.0." if v == 4 else "fd00::"
    foreign = Route(fam, f"{p}99/{32 if v == 4 else 128}", protocol=4, oif=eth0.index)
    fake.add_route(foreign)
    clock = FakeClock()
    rt = main_table(fake, clock, ip_version=v)
    lw = RouteClass.LOCAL_WORKLOAD
    pl = 32 if v == 4 else 128
    rt.set_routes(lw, "cali1", [Target(f"{p}1/{pl}"), Target(f"{p}2/{pl}")])
    clock.advance(11)
    rt.apply()
    rt.queue_resync()
    rt.apply()
    assert counts.moved() == {}
    fake.routes = {k: r for k, r in fake.routes.items() if r.dst != f"{p}2/{pl}"}   # ours deleted
    rt.queue_resync()
    rt.apply()
    assert counts.moved() == {"route": 1}
    (line,) = drift_lines(logs)
    assert line["ip_version"] == v
    assert set(fake.routes_in(254, fam)) == {f"{p}1/{pl}", f"{p}2/{pl}", foreign.dst}
    rt.set_routes(lw, "cali1", [Target(f"{p}3/{pl}")])   # an ordinary change
    rt.queue_resync()
    rt.apply()
    assert counts.moved() == {"route": 1} and len(drift_lines(logs)) == 1
    assert set(fake.routes_in(254, fam)) == {f"{p}3/{pl}", foreign.dst}
    assert cali1.index in {r.oif for r in fake.routes.values()}


def _vxlan_route_programmed(v: int) -> tuple[int, str, FakeNetlink, FakeClock, Any, str]:
    """A main route table with one route via the family's VXLAN device, programmed:
    (family, device, fake, clock, table, the route's CIDR)."""
    fam = AF_INET if v == 4 else AF_INET6
    dev = "vxlan.calico" if v == 4 else "vxlan-v6.calico"  # each family's table owns its own device
    fake = FakeNetlink()
    fake.add_link(dev, kind="vxlan")
    clock = FakeClock()
    rt = main_table(fake, clock, ip_version=v)
    cidr = "10.0.1.0/26" if v == 4 else "fd00:1::/122"
    rt.set_routes(RouteClass.VXLAN_TUNNEL, dev, [Target(cidr)])
    clock.advance(11)
    rt.apply()
    return fam, dev, fake, clock, rt, cidr


@V46
def test_routes_lost_with_a_replaced_device_are_not_route_drift(counts: Counts, v: int) -> None:
    """The device was deleted and made again (a new ifindex) behind our back: its routes went with it.
    That is the device's repair (counted by the tunnel driver); the routes rewritten onto the new
    ifindex are its consequence, whichever comes first — the interface monitor or the refresh."""
    fam, dev, fake, clock, rt, cidr = _vxlan_route_programmed(v)
    assert set(fake.routes_in(254, fam)) == {cidr}
    fake.remove_link(dev)                       # routes via it go too
    new = fake.add_link(dev, kind="vxlan")
    rt.queue_resync()                           # the refresh sees the new ifindex before the monitor does
    rt.apply()
    assert {r.oif for r in fake.routes_in(254, fam).values()} == {new.index}
    assert counts.moved() == {}


@V46
def test_device_deleted_between_the_link_and_route_dumps_is_not_route_drift(counts: Counts, v: int) -> None:
    """A refresh dumps links (the device is there), then routes (the device, and its routes, are gone):
    the missing route is the device's, not drift (found as a CI flake: the FV drift test deletes the
    VXLAN device at an arbitrary moment)."""
    fam, dev, fake, clock, rt, cidr = _vxlan_route_programmed(v)
    rt.queue_resync()
    rt.apply()                                  # a quiet refresh: the route table has a belief to compare
    assert counts.moved() == {}
    dump_links = fake.link_list

    def links_then_delete() -> list[Any]:
        links = dump_links()
        fake.remove_link(dev)                   # routes via it go too
        return links

    fake.link_list = links_then_delete  # type: ignore[method-assign]
    rt.queue_resync()
    rt.apply()                                  # its route is missing: not counted
    fake.link_list = dump_links  # type: ignore[method-assign]
    new = fake.add_link(dev, kind="vxlan")
    rt.on_iface_state(dev, IfaceState.UP, new.index)
    clock.advance(11)
    rt.apply()
    assert {r.oif for r in fake.routes_in(254, fam).values()} == {new.index}
    assert counts.moved() == {}


def test_misplaced_counts_our_rules_with_the_wrong_foreign_rules_above() -> None:
    # (expected: as the table computes it, for the number of foreign rules found)
    assert drift.misplaced(["a", "", "", "b", "c"], ["", "a", "", "b", "c"]) == 1   # a foreign rule above our insert
    assert drift.misplaced(["a", "", "", "b", "c"], ["a", "", "b", "c", ""]) == 2   # one below our appends
    assert drift.misplaced(["a", "", "b"], ["a", "", "b"]) == 0


# ---------------------------------------------------------------------------------------------- FDB, devices, ip rules
def test_fdb_and_neighbour_drift_on_the_same_device(counts: Counts, logs: list[dict[str, Any]]) -> None:
    from felixpy.drivers.netlink.types import FDBEntry, Neigh
    from felixpy.drivers.vxlanfdb import VTEP, VXLANFDB

    fake = FakeNetlink()
    idx = fake.add_link("vxlan.calico", kind="vxlan").index
    fake.neighs[(AF_INET, idx, "10.9.9.9")] = Neigh(AF_INET, idx, "10.9.9.9", "66:00:00:00:00:99")  # stale
    fdb = VXLANFDB(ip_version=4, iface_name="vxlan.calico", new_handle=fake.factory)
    fdb.set_vteps([VTEP("192.168.0.2", "10.5.0.1", "66:00:00:00:00:02"),
                   VTEP("192.168.0.3", "10.5.0.2", "66:00:00:00:00:03")])
    fdb.apply()                                       # start of day sweeps the stale entry: not drift
    fdb.queue_resync()
    fdb.apply()
    assert counts.moved() == {}
    fdb.set_vteps([VTEP("192.168.0.3", "10.5.0.2", "66:00:00:00:00:03")])   # an ordinary change
    fdb.apply()
    assert counts.moved() == {}
    del fake.fdb[(idx, "66:00:00:00:00:03", "192.168.0.3")]                  # foreign hand
    fake.neighs[(AF_INET, idx, "10.5.0.2")] = Neigh(AF_INET, idx, "10.5.0.2", "66:00:00:00:00:77")
    fake.fdb[(idx, "66:00:00:00:00:55", "192.168.0.55")] = FDBEntry(idx, "66:00:00:00:00:55", "192.168.0.55")
    fdb.queue_resync()
    fdb.apply()
    # The neighbour now has another MAC: its old key is gone (missing) and the new one is extra.
    assert counts.moved() == {"fdb": 2, "neighbour": 2}
    (line,) = drift_lines(logs)
    assert line["iface"] == "vxlan.calico" and line["fdb_entries"] == 2
    assert {(e.mac, e.dst) for e in fake.fdb.values()} == {("66:00:00:00:00:03", "192.168.0.3")}
    assert {(n.dst, n.lladdr) for n in fake.neighs.values()} == {("10.5.0.2", "66:00:00:00:00:03")}


def test_tunnel_device_recreated_behind_our_back_is_device_drift(counts: Counts) -> None:
    from routing.test_managers_fake import LOCAL_VTEP, VTEP2, VXLAN, routing_node

    from felixpy.drivers.netlink.types import VXLANInfo
    from felixpy.ifacemonitor.events import IfaceState, IfaceStateUpdate
    from felixpy.proto import felixbackend_pb2 as pb

    node = routing_node(VXLAN)
    fake = node.netlink
    node.send(LOCAL_VTEP, VTEP2, pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN,
                                                dst="10.5.1.0/26", dst_node_name="node2"))
    node.apply()
    assert counts.moved().get("device", 0) == 0
    old = fake._by_name("vxlan.calico")
    fake.links[old.index] = old.__class__(**{**{f: getattr(old, f) for f in old.__slots__},
                                            "vxlan": VXLANInfo(vni=1, port=4789, local="192.168.0.1",
                                                               parent_index=2)})
    node.rt_clock.now += 11
    node.apply()
    assert fake._by_name("vxlan.calico").vxlan.vni == 4096
    assert counts.moved().get("device") == 1
    fake.remove_link("vxlan.calico")
    node.dp.on_iface_update(IfaceStateUpdate("vxlan.calico", IfaceState.DOWN, 0))
    node.apply()
    assert counts.moved().get("device") == 2


def test_ip_rule_drift(counts: Counts) -> None:
    from felixpy.drivers.netlink.types import Rule as IPRule
    from felixpy.drivers.routerule import RouteRules, make_rule

    fake = FakeNetlink()
    fake.rules.append(make_rule(4, 98, 1, mark=0x100000, invert=True))   # an earlier run's: cleanup
    foreign = IPRule(AF_INET, 100, 50, src="10.0.0.0/8")
    fake.rules.append(foreign)
    rr = RouteRules(ip_version=4, table_indices=[1, 2], new_handle=fake.factory)
    want = make_rule(4, 99, 1, mark=0x100000, invert=True)
    rr.set_rule(want)
    rr.apply()
    rr.set_rule(make_rule(4, 99, 2, mark=0x200000, invert=True))          # an ordinary change
    rr.apply()
    rr.queue_resync()
    rr.apply()
    assert counts.moved() == {}
    fake.rules.remove(want)                                               # foreign hand
    fake.rules.append(make_rule(4, 97, 2, mark=0x400000))
    rr.queue_resync()
    rr.apply()
    assert counts.moved() == {"ip_rule": 2}
    assert want in fake.rules and foreign in fake.rules


def test_counter_is_exposed_under_its_own_name_with_a_kind_label() -> None:
    import prometheus_client as prom

    from felixpy import metrics

    drift.DRIFT_REPAIRS.labels("route").inc(0)  # make sure the child exists
    text = metrics.exposition([prom.REGISTRY]).decode()
    assert "# TYPE felixpy_drift_repairs counter" in text
    samples = [ln for ln in text.splitlines() if ln.startswith("felixpy_drift_repairs")]
    assert samples and all(ln.startswith('felixpy_drift_repairs{kind="') for ln in samples), samples
    assert "felixpy_drift_repairs_total" not in text and "felixpy_drift_repairs_created" not in text
    assert metrics.get_or_create(prom.Counter, "felixpy_drift_repairs", "x", ("kind",)) is drift.DRIFT_REPAIRS


def test_fdb_drift_whose_repair_failed_once_is_counted_once(counts: Counts) -> None:
    from felixpy.drivers.netlink.fake import FailFlags
    from felixpy.drivers.vxlanfdb import VTEP, VXLANFDB
    from felixpy.errors import DataplaneError

    fake = FakeNetlink()
    idx = fake.add_link("vxlan.calico", kind="vxlan").index
    fdb = VXLANFDB(ip_version=4, iface_name="vxlan.calico", new_handle=fake.factory)
    fdb.set_vteps([VTEP("192.168.0.3", "10.5.0.2", "66:00:00:00:00:03")])
    fdb.apply()
    del fake.fdb[(idx, "66:00:00:00:00:03", "192.168.0.3")]
    fdb.queue_resync()
    fake.fail_next = FailFlags.FDB_REPLACE
    with pytest.raises(DataplaneError):
        fdb.apply()
    assert counts.moved() == {}
    fdb.apply()
    assert counts.moved() == {"fdb": 1}
    assert {(e.mac, e.dst) for e in fake.fdb.values()} == {("66:00:00:00:00:03", "192.168.0.3")}


@V46
def test_nftables_failed_repair_is_counted_once_when_it_finally_succeeds(counts: Counts, v: int) -> None:
    fake, clock = FakeNft(), FakeClock()
    h = Harness(v, fake, clock, refresh_interval=10.0)
    program_typical(h)
    h.root.apply()
    _nft(fake, {"flush": {"chain": {**hp.tbl(v), "name": "filter-cali-INPUT"}}})
    fake.fail_next_runs(2)
    clock.advance(11)
    h.root.apply()
    assert counts.moved() == {"rule": 4}
    assert len(hp.chains(fake, v)["filter-cali-INPUT"]["rules"]) == 4
