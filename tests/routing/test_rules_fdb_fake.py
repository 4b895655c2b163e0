"""Route rule and VXLAN FDB drivers against the fake kernel."""

from __future__ import annotations

import pytest

from felixpy.drivers.netlink.fake import FailFlags, FakeNetlink
from felixpy.drivers.netlink.types import AF_INET, AF_INET6, FDBEntry, Neigh, Rule
from felixpy.drivers.routerule import RouteRules, make_rule
from felixpy.drivers.vxlanfdb import VTEP, VXLANFDB
from felixpy.errors import DataplaneError
from felixpy.ifacemonitor.events import IfaceState


def ours(fake: FakeNetlink, family: int = AF_INET) -> set[Rule]:
    return {r for r in fake.rules if r.family == family and r.table in (1, 2)}


def test_rules_added_and_foreign_and_stale_swept() -> None:
    fake = FakeNetlink()
    foreign = Rule(AF_INET, 100, 50, src="10.0.0.0/8")
    stale = make_rule(4, 98, 1, mark=0x100000, invert=True)  # previous instance, other priority
    fake.rules += [foreign, stale]
    rr = RouteRules(ip_version=4, table_indices=[1, 2], new_handle=fake.factory)
    want = make_rule(4, 99, 1, mark=0x100000, invert=True)
    rr.set_rule(want)
    rr.apply()
    assert ours(fake) == {want}
    assert foreign in fake.rules
    rr.remove_rule(make_rule(4, 99, 2, mark=0x100000, invert=True))  # removal ignores the table
    rr.apply()
    assert ours(fake) == set()


def test_rules_refuse_unowned_tables() -> None:
    with pytest.raises(ValueError):
        RouteRules(ip_version=4, table_indices=[254], new_handle=FakeNetlink().factory)
    rr = RouteRules(ip_version=4, table_indices=[1], new_handle=FakeNetlink().factory)
    with pytest.raises(ValueError):
        rr.set_rule(make_rule(4, 99, 7))


@pytest.mark.parametrize("flag", [FailFlags.CONNECT, FailFlags.RULE_LIST, FailFlags.RULE_ADD, FailFlags.RULE_DEL])
def test_rule_failures_keep_it_out_of_sync(flag: FailFlags) -> None:
    fake = FakeNetlink()
    fake.rules.append(make_rule(6, 50, 2, src="fd00::/64"))
    rr = RouteRules(ip_version=6, table_indices=[2], new_handle=fake.factory)
    want = make_rule(6, 99, 2, mark=0x10, invert=True)
    rr.set_rule(want)
    fake.fail_next = flag
    with pytest.raises(DataplaneError):
        rr.apply()
    rr.apply()
    assert ours(fake, AF_INET6) == {want}
    rr.apply()  # in sync: no kernel access
    assert ours(fake, AF_INET6) == {want}


def vxlan_fake() -> tuple[FakeNetlink, int]:
    fake = FakeNetlink()
    return fake, fake.add_link("vxlan.calico", kind="vxlan").index


def fdb_state(fake: FakeNetlink) -> tuple[set[tuple[str, str | None]], set[tuple[str, str | None]]]:
    return ({(n.dst, n.lladdr) for n in fake.neighs.values()}, {(e.mac, e.dst) for e in fake.fdb.values()})


def test_fdb_programs_vteps_and_sweeps_stale_entries() -> None:
    fake, idx = vxlan_fake()
    fake.neighs[(AF_INET, idx, "10.9.9.9")] = Neigh(AF_INET, idx, "10.9.9.9", "66:00:00:00:00:99")
    fake.fdb[(idx, "66:00:00:00:00:99", "192.168.0.99")] = FDBEntry(idx, "66:00:00:00:00:99", "192.168.0.99")
    fake.neighs[(AF_INET, idx, "10.9.9.8")] = Neigh(AF_INET, idx, "10.9.9.8", "66:00:00:00:00:98", state=0x02)
    fdb = VXLANFDB(ip_version=4, iface_name="vxlan.calico", new_handle=fake.factory)
    fdb.set_vteps([VTEP("192.168.0.2", "10.5.0.1", "66:00:00:00:00:02"),
                   VTEP("192.168.0.3", "10.5.0.2", "66:00:00:00:00:03")])
    fdb.apply()
    arp, fdbs = fdb_state(fake)
    assert arp == {("10.5.0.1", "66:00:00:00:00:02"), ("10.5.0.2", "66:00:00:00:00:03"),
                   ("10.9.9.8", "66:00:00:00:00:98")}  # the learned (non-permanent) entry is not ours
    assert fdbs == {("66:00:00:00:00:02", "192.168.0.2"), ("66:00:00:00:00:03", "192.168.0.3")}
    fdb.set_vteps([VTEP("192.168.0.3", "10.5.0.2", "66:00:00:00:00:03")])
    fdb.apply()
    arp, fdbs = fdb_state(fake)
    assert fdbs == {("66:00:00:00:00:03", "192.168.0.3")}
    assert ("10.5.0.1", "66:00:00:00:00:02") not in arp


def test_fdb_waits_for_device_and_follows_recreation() -> None:
    fake = FakeNetlink()
    fdb = VXLANFDB(ip_version=6, iface_name="vxlan-v6.calico", new_handle=fake.factory)
    fdb.set_vteps([VTEP("fd00::2", "fd10::1", "66:00:00:00:00:02")])
    fdb.apply()  # waits quietly: the device is the tunnel syncer's to report
    assert fdb_state(fake)[1] == set() and not fdb.in_sync()
    link = fake.add_link("vxlan-v6.calico", kind="vxlan")
    fdb.apply()  # re-checked on the next apply without waiting for an interface event
    assert fdb_state(fake)[1] == {("66:00:00:00:00:02", "fd00::2")}
    fake.remove_link("vxlan-v6.calico")
    link = fake.add_link("vxlan-v6.calico", kind="vxlan")
    fdb.on_iface_state("vxlan-v6.calico", IfaceState.UP, link.index)
    fdb.apply()
    assert {(n.ifindex, n.dst) for n in fake.neighs.values()} == {(link.index, "fd10::1")}


@pytest.mark.parametrize("flag", [FailFlags.NEIGH_REPLACE, FailFlags.FDB_REPLACE, FailFlags.FDB_LIST,
                                  FailFlags.LINK_BY_NAME])
def test_fdb_failures_resync_and_recover(flag: FailFlags) -> None:
    fake, _ = vxlan_fake()
    fdb = VXLANFDB(ip_version=4, iface_name="vxlan.calico", new_handle=fake.factory)
    fdb.set_vteps([VTEP("192.168.0.2", "10.5.0.1", "66:00:00:00:00:02")])
    fake.fail_next = flag
    with pytest.raises(DataplaneError):
        fdb.apply()
    fdb.apply()
    assert fdb_state(fake) == ({("10.5.0.1", "66:00:00:00:00:02")}, {("66:00:00:00:00:02", "192.168.0.2")})
    assert fdb.in_sync()


def test_fake_keys_vxlan_vni_per_family_like_the_kernel() -> None:
    import errno

    import pytest

    from felixpy.drivers.netlink.errors import NetlinkCallError
    from felixpy.drivers.netlink.fake import FakeNetlink
    from felixpy.drivers.netlink.types import LinkSpec, VXLANInfo

    nl = FakeNetlink()
    nl.link_add(LinkSpec(name="vxlan.calico", kind="vxlan", vxlan=VXLANInfo(vni=4096, port=4789, local="198.18.0.1")))
    nl.link_add(LinkSpec(name="vxlan-v6.calico", kind="vxlan",
                         vxlan=VXLANInfo(vni=4096, port=4789, local="fd00:198::1")))
    with pytest.raises(NetlinkCallError) as exc:
        nl.link_add(LinkSpec(name="vxlan.other", kind="vxlan", vxlan=VXLANInfo(vni=4096, port=4789, local="198.18.0.9")))
    assert exc.value.errno == errno.EEXIST


def test_fdb_replaces_all_arp_entries_in_one_call_and_keeps_per_entry_results() -> None:
    """Issue #17: one neighbour-replace call per apply (one ``ip -batch``), not one per VTEP; an entry the
    kernel refused stays pending while the others are recorded as programmed."""
    fake, idx = vxlan_fake()
    calls: list[int] = []
    handle = fake.factory()
    real = handle.neighs_replace

    def counting(neighs: list[Neigh]) -> list[int]:
        calls.append(len(neighs))
        out = real(neighs)
        return [out[0], *out[1:-1], 22] if len(out) > 1 else out   # the last entry refused (EINVAL)

    handle.neighs_replace = counting  # type: ignore[method-assign]
    fdb = VXLANFDB(ip_version=4, iface_name="vxlan.calico", new_handle=lambda: handle)
    fdb.set_vteps([VTEP(f"192.168.0.{n}", f"10.5.0.{n}", f"66:00:00:00:00:{n:02x}") for n in range(2, 52)])
    with pytest.raises(DataplaneError):
        fdb.apply()
    assert calls == [50]
    assert not fdb.in_sync()


def test_vtep_mac_change_keeps_its_neighbour_entry() -> None:
    """Regression (issue 14 drift trials): the kernel keys neighbours by address, so deleting the old
    MAC's entry after writing the new one deleted the new one — the VTEP had no ARP entry until the
    next route refresh."""
    fake, idx = vxlan_fake()
    fdb = VXLANFDB(ip_version=4, iface_name="vxlan.calico", new_handle=fake.factory)
    fdb.set_vteps([VTEP("192.168.0.3", "10.5.0.2", "66:00:00:00:00:03")])
    fdb.apply()
    fdb.set_vteps([VTEP("192.168.0.3", "10.5.0.2", "66:00:00:00:00:04")])
    fdb.apply()
    arp, fdbs = fdb_state(fake)
    assert arp == {("10.5.0.2", "66:00:00:00:00:04")}
    assert fdbs == {("66:00:00:00:00:04", "192.168.0.3")}
    assert fdb.in_sync()
