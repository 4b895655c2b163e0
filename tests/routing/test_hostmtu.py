"""Host MTU detection and Felix's MTU file, over the fake netlink and a temporary file."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from felixpy.config import Config
from felixpy.dataplane.wiring import pod_mtu
from felixpy.drivers.hostmtu import HostMTU
from felixpy.drivers.netlink.fake import FakeNetlink
from felixpy.proto import felixbackend_pb2 as pb
from managers.harness import Node

PATTERN = Config().MTUIfacePattern


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def syncer(fake: FakeNetlink, path: Path, cfg: Config, clock: Clock) -> HostMTU:
    return HostMTU(new_handle=fake.factory, pattern=cfg.MTUIfacePattern, pod_mtu=lambda h: pod_mtu(cfg, h),
                   path=str(path), clock=clock)


def test_pod_mtu_is_the_smallest_enabled_encapsulation_or_the_host() -> None:
    v4 = Config(Ipv6Support=False)
    assert pod_mtu(v4, 1500) == 1500
    assert pod_mtu(replace(v4, VXLANEnabled=True), 1500) == 1450
    assert pod_mtu(Config(VXLANEnabled=True, Ipv6Support=True), 1500) == 1430  # IPv6 VXLAN has more overhead
    assert pod_mtu(replace(v4, VXLANEnabled=True, WireguardEnabled=True), 1500) == 1440
    assert pod_mtu(replace(v4, IpInIpEnabled=True, IpInIpMtu=1400), 1500) == 1400
    assert pod_mtu(replace(v4, VXLANMTU=9000, VXLANEnabled=True), 1500) == 9000  # configured wins, with a warning


def test_detects_the_smallest_matching_up_interface_and_writes_the_file_once(tmp_path: Path) -> None:
    fake = FakeNetlink()
    fake.add_link("eth0", mtu=1500)
    fake.add_link("ens3", mtu=1400, up=False)  # down: ignored
    fake.add_link("cali1234", mtu=1200)  # not matched by the pattern
    fake.add_link("eth1", mtu=9000)
    path = tmp_path / "calico" / "mtu"
    clock = Clock()
    cfg = Config(VXLANEnabled=True, Ipv6Support=False)
    s = syncer(fake, path, cfg, clock)
    s.apply()
    assert path.read_text() == "1450" and (s.host_mtu, s.pod_mtu) == (1500, 1450)
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    stamp = path.stat().st_mtime_ns
    # A fresh process on an unchanged host reads the file back and writes nothing.
    again = syncer(fake, path, cfg, clock)
    os.utime(path, ns=(stamp, stamp))
    again.apply()
    assert path.stat().st_mtime_ns == stamp
    # The host MTU changes: rewritten at the next 30 s check, not before.
    fake.link_set_mtu(fake._by_name("eth0").index, 1300)
    clock.now += 10
    again.apply()
    assert path.read_text() == "1450"
    assert again.next_deadline() == 20.0
    clock.now += 21
    again.apply()
    assert path.read_text() == "1250" and again.host_mtu == 1300


def test_no_matching_interface_means_felixs_1460(tmp_path: Path) -> None:
    fake = FakeNetlink()
    fake.add_link("weird0", mtu=1500)
    s = syncer(fake, tmp_path / "mtu", Config(), Clock())
    s.apply()
    assert (tmp_path / "mtu").read_text() == "1460"


def test_the_wiring_manages_the_file_only_when_asked(tmp_path: Path) -> None:
    node = Node()  # the test harness passes no MTU file: nothing is written anywhere
    node.apply()
    assert not any(isinstance(s, HostMTU) for s in node.dp.devices)
    from felixpy.dataplane.wiring import KernelDeps, build
    from felixpy.dataplane.clock import FakeClock
    from felixpy.drivers.procsys import FakeSysctls
    from managers.harness import NoConntrack

    fake = FakeNetlink()
    fake.add_link("eth0", mtu=1500)
    base = Node()
    deps = KernelDeps(tables=base._tables, netlink_factory=fake.factory, sysctls=FakeSysctls(),
                      conntrack_runner=NoConntrack(), mtu_file=str(tmp_path / "mtu"))
    built = build(Config(WireguardEnabled=True, Ipv6Support=False), clock=FakeClock(), deps=deps)
    built.dataplane.on_datastore_message(pb.InSync())
    built.dataplane.set_iface_in_sync()
    built.dataplane.apply()
    assert (tmp_path / "mtu").read_text() == "1440"
