"""The tracker's reporting rules, without netlink."""

from __future__ import annotations

from felixpy.ifacemonitor.events import AddrEvent, Link
from felixpy.ifacemonitor.excludes import exclusion_matcher
from felixpy.ifacemonitor.tracker import IfaceTracker
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate

UP, DOWN = IfaceState.UP, IfaceState.DOWN
Update = IfaceStateUpdate | IfaceAddrsUpdate


class FakeKernelAddrs:
    """Addresses the kernel would return for a per-interface lookup."""

    def __init__(self) -> None:
        self.addrs: dict[int, set[str]] = {}
        self.fail = False

    def lookup(self, index: int) -> frozenset[str] | None:
        if self.fail:
            return None
        return frozenset(self.addrs.get(index, ()))


def make(excludes: tuple[str, ...] = ("kube-ipvs0",)) -> tuple[IfaceTracker, FakeKernelAddrs, list[Update]]:
    kernel = FakeKernelAddrs()
    out: list[Update] = []
    tracker = IfaceTracker(
        is_excluded=exclusion_matcher(excludes),
        lookup_addrs=kernel.lookup,
        on_state=out.append,
        on_addrs=out.append,
    )
    return tracker, kernel, out


def S(name: str, state: IfaceState, index: int) -> IfaceStateUpdate:
    return IfaceStateUpdate(name, state, index)


def A(name: str, *addrs: str) -> IfaceAddrsUpdate:
    return IfaceAddrsUpdate(name, frozenset(addrs))


def GONE(name: str) -> IfaceAddrsUpdate:
    return IfaceAddrsUpdate(name, None)


def test_new_link_reports_state_and_addresses_read_from_the_kernel() -> None:
    t, k, out = make()
    k.addrs[5] = {"10.0.0.1"}
    t.on_link(Link(5, "eth0", False), True)
    assert out == [S("eth0", DOWN, 5), A("eth0", "10.0.0.1")]


def test_empty_address_set_is_reported_for_a_new_link() -> None:
    t, _, out = make()
    t.on_link(Link(5, "eth0", True), True)
    assert out == [S("eth0", UP, 5), A("eth0")]


def test_oper_state_changes_only_are_reported() -> None:
    t, _, out = make()
    t.on_link(Link(5, "eth0", False), True)
    out.clear()
    t.on_link(Link(5, "eth0", False), True)
    assert out == []
    t.on_link(Link(5, "eth0", True), True)
    assert out == [S("eth0", UP, 5)]
    t.on_link(Link(5, "eth0", True), True)
    t.on_link(Link(5, "eth0", False), True)
    assert out == [S("eth0", UP, 5), S("eth0", DOWN, 5)]


def test_address_events_change_the_set() -> None:
    t, _, out = make()
    t.on_link(Link(5, "eth0", True), True)
    out.clear()
    t.on_addr(AddrEvent(5, "10.0.0.1", True))
    t.on_addr(AddrEvent(5, "fd00::1", True))
    t.on_addr(AddrEvent(5, "10.0.0.1", True))  # duplicate: nothing
    t.on_addr(AddrEvent(5, "10.0.0.1", False))
    t.on_addr(AddrEvent(5, "10.0.0.1", False))  # already gone: nothing
    assert out == [A("eth0", "10.0.0.1"), A("eth0", "10.0.0.1", "fd00::1"), A("eth0", "fd00::1")]


def test_address_event_for_unknown_interface_is_ignored() -> None:
    t, k, out = make()
    t.on_addr(AddrEvent(9, "10.0.0.9", True))
    assert out == []
    k.addrs[9] = {"10.0.0.9"}
    t.on_link(Link(9, "eth9", True), True)  # the link event reads the address itself
    assert out == [S("eth9", UP, 9), A("eth9", "10.0.0.9")]


def test_deletion_reports_down_index_zero_and_no_addresses() -> None:
    t, k, out = make()
    k.addrs[5] = {"10.0.0.1"}
    t.on_link(Link(5, "eth0", True), True)
    out.clear()
    t.on_link(Link(5, "eth0", False), False)
    assert out == [S("eth0", DOWN, 0), GONE("eth0")]
    t.on_link(Link(5, "eth0", False), False)
    assert out == [S("eth0", DOWN, 0), GONE("eth0")]  # once only


def test_link_event_rereads_addresses() -> None:
    t, k, out = make()
    t.on_link(Link(5, "eth0", False), True)
    out.clear()
    k.addrs[5] = {"10.0.0.1"}  # address event lost or still in flight
    t.on_link(Link(5, "eth0", True), True)
    assert out == [S("eth0", UP, 5), A("eth0", "10.0.0.1")]


def test_failed_address_lookup_keeps_the_last_known_set() -> None:
    t, k, out = make()
    k.addrs[5] = {"10.0.0.1"}
    t.on_link(Link(5, "eth0", False), True)
    out.clear()
    k.fail = True
    t.on_link(Link(5, "eth0", True), True)
    assert out == [S("eth0", UP, 5)]


def test_rename_is_delete_then_add() -> None:
    t, k, out = make()
    k.addrs[5] = {"10.0.0.1"}
    t.on_link(Link(5, "eth0", False), True)
    out.clear()
    t.on_link(Link(5, "wan0", False), True)
    assert out == [S("eth0", DOWN, 0), GONE("eth0"), S("wan0", DOWN, 5), A("wan0", "10.0.0.1")]


def test_excluded_interface_gets_state_but_no_addresses() -> None:
    t, k, out = make(("kube-ipvs0", "/^skip/"))
    k.addrs[7] = {"10.96.0.1"}
    k.addrs[8] = {"10.0.8.1"}
    t.on_link(Link(7, "kube-ipvs0", False), True)
    t.on_link(Link(8, "skip-me", True), True)
    t.on_addr(AddrEvent(7, "10.96.0.10", True))
    t.on_link(Link(7, "kube-ipvs0", False), False)
    assert out == [S("kube-ipvs0", DOWN, 7), S("skip-me", UP, 8), S("kube-ipvs0", DOWN, 0)]


def test_renaming_into_an_excluded_name_stops_address_tracking() -> None:
    t, k, out = make()
    k.addrs[5] = {"10.0.0.1"}
    t.on_link(Link(5, "eth0", True), True)
    out.clear()
    t.on_link(Link(5, "kube-ipvs0", True), True)
    assert out == [S("eth0", DOWN, 0), GONE("eth0"), S("kube-ipvs0", UP, 5)]


def test_duplicate_name_is_deferred_until_the_old_holder_goes() -> None:
    t, k, out = make()
    k.addrs[5] = {"10.0.0.1"}
    k.addrs[6] = {"10.0.0.2"}
    t.on_link(Link(5, "cali1", True), True)
    out.clear()
    # A new cali1 (index 6) comes up while the old one's deletion is still damped.
    t.on_link(Link(6, "cali1", True), True)
    assert out == []
    t.on_link(Link(5, "cali1", False), True)  # the old copy's delayed "down"
    assert out == [S("cali1", DOWN, 5)]
    t.on_link(Link(5, "cali1", False), False)  # ... and its deletion
    assert out == [S("cali1", DOWN, 5), S("cali1", UP, 6), A("cali1", "10.0.0.2")]


def test_resync_reports_only_differences() -> None:
    t, _, out = make()
    links = [Link(1, "lo", True), Link(5, "eth0", True)]
    t.resync(links, {1: frozenset({"127.0.0.1", "::1"}), 5: frozenset({"10.0.0.1"})})
    assert out == [S("lo", UP, 1), A("lo", "127.0.0.1", "::1"), S("eth0", UP, 5), A("eth0", "10.0.0.1")]
    out.clear()
    t.resync(links, {1: frozenset({"127.0.0.1", "::1"}), 5: frozenset({"10.0.0.1"})})
    assert out == []
    t.resync([Link(1, "lo", True), Link(5, "eth0", False), Link(6, "eth1", True)],
             {1: frozenset({"127.0.0.1", "::1"}), 5: frozenset({"10.0.0.2"})})
    assert out == [S("eth0", DOWN, 5), A("eth0", "10.0.0.2"), S("eth1", UP, 6), A("eth1")]


def test_resync_spots_deletions_and_renames() -> None:
    t, _, out = make()
    t.resync([Link(1, "lo", True), Link(5, "eth0", True), Link(6, "eth1", True)], {})
    out.clear()
    t.resync([Link(1, "lo", True), Link(6, "wan1", True)], {})
    assert out == [S("eth1", DOWN, 0), GONE("eth1"), S("eth0", DOWN, 0), GONE("eth0"),
                   S("wan1", UP, 6), A("wan1")]
    assert sorted(t.reported_names()) == ["lo", "wan1"]


def test_resync_replaces_a_stale_duplicate() -> None:
    t, _, out = make()
    t.on_link(Link(5, "cali1", True), True)
    t.on_link(Link(6, "cali1", True), True)  # deferred
    out.clear()
    t.resync([Link(6, "cali1", True)], {6: frozenset({"10.0.0.6"})})
    assert out == [S("cali1", UP, 6), A("cali1", "10.0.0.6")]


def test_the_link_kind_travels_with_the_state_and_outlives_an_event_without_one() -> None:
    t, _, out = make()
    t.on_link(Link(5, "cali1", False, "netkit"), True)
    t.on_link(Link(5, "cali1", True), True)  # (an event whose kind was not decoded)
    t.on_link(Link(6, "eth0", True, ""), True)
    assert [u for u in out if isinstance(u, IfaceStateUpdate)] == [
        IfaceStateUpdate("cali1", DOWN, 5, "netkit"), IfaceStateUpdate("cali1", UP, 5, "netkit"),
        IfaceStateUpdate("eth0", UP, 6, "")]
