"""The ``/proc/sys`` shim (:class:`~felixpy.drivers.procsys.sysctls.ProcSys`): reads strip, a write
happens only when the value differs, a missing file is an interface that is gone; then the
interface-sysctls syncer over the real files of a veth in a throwaway namespace."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from felixpy.drivers.procsys.api import IfaceConfig
from felixpy.drivers.procsys.syncer import InterfaceSysctls
from felixpy.drivers.procsys.sysctls import ProcSys
from felixpy.testing import netns as nsutil


def test_write_only_what_differs_and_report_missing_files(tmp_path: Path) -> None:
    conf = tmp_path / "net" / "ipv4" / "conf" / "cali1"
    conf.mkdir(parents=True)
    (conf / "proxy_arp").write_text("0\n")
    (conf / "forwarding").write_text("1\n")
    os.chmod(conf / "forwarding", 0o444)  # equal: must not even be opened for writing
    p = ProcSys(str(tmp_path))
    assert p.read("net/ipv4/conf/cali1/proxy_arp") == "0"
    assert p.write("net/ipv4/conf/cali1/proxy_arp", "1") and (conf / "proxy_arp").read_text() == "1"
    before = (conf / "forwarding").stat().st_mtime_ns
    assert p.write("net/ipv4/conf/cali1/forwarding", "1")
    assert (conf / "forwarding").stat().st_mtime_ns == before
    assert p.read("net/ipv4/conf/gone/proxy_arp") is None
    assert not p.write("net/ipv4/conf/gone/proxy_arp", "1")


def test_a_write_replaces_the_whole_value_in_one_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    neigh = tmp_path / "net" / "ipv4" / "neigh" / "cali1"
    neigh.mkdir(parents=True)
    (neigh / "proxy_delay").write_text("80\n")
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, flags: int, *a: object) -> int:
        opened.append(path)
        return real_open(path, flags, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting_open)
    assert ProcSys(str(tmp_path)).write("net/ipv4/neigh/cali1/proxy_delay", "0")
    assert (neigh / "proxy_delay").read_text() == "0" and len(opened) == 1


def test_a_read_only_proc_sys_is_fine_while_it_holds_the_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "net" / "ipv4" / "conf" / "cali1"
    conf.mkdir(parents=True)
    (conf / "proxy_arp").write_text("1\n")
    (conf / "forwarding").write_text("0\n")
    real_open = os.open

    def read_only(path: str, flags: int, *a: object) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_open(path, flags, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", read_only)
    p = ProcSys(str(tmp_path))
    assert p.write("net/ipv4/conf/cali1/proxy_arp", "1")
    with pytest.raises(OSError) as err:
        p.write("net/ipv4/conf/cali1/forwarding", "1")
    assert err.value.errno == errno.EROFS and (conf / "forwarding").read_text() == "0\n"


@pytest.mark.kernel
def test_the_syncer_writes_a_veths_settings_and_a_vanished_one_stays_pending(netns: str) -> None:
    nsutil.run_in(netns, "ip", "link", "add", "cali1", "type", "veth", "peer", "name", "p1")
    with nsutil.entered(netns):
        v4, v6 = InterfaceSysctls(4, ProcSys()), InterfaceSysctls(6, ProcSys())
        for s in (v4, v6):
            s.configure("cali1")
            s.configure("cali9")  # no such interface
            s.apply()
            assert s.state("cali1") is IfaceConfig.DONE and s.state("cali9") is IfaceConfig.PENDING
        p = ProcSys()
        got = {k: p.read(f"net/{k}") for k in ("ipv4/conf/cali1/proxy_arp", "ipv4/conf/cali1/route_localnet",
                                               "ipv4/conf/cali1/forwarding", "ipv4/neigh/cali1/proxy_delay",
                                               "ipv6/conf/cali1/proxy_ndp", "ipv6/conf/cali1/forwarding",
                                               "ipv6/conf/cali1/accept_ra")}
        assert got == {"ipv4/conf/cali1/proxy_arp": "1", "ipv4/conf/cali1/route_localnet": "1",
                       "ipv4/conf/cali1/forwarding": "1", "ipv4/neigh/cali1/proxy_delay": "0",
                       "ipv6/conf/cali1/proxy_ndp": "1", "ipv6/conf/cali1/forwarding": "1",
                       "ipv6/conf/cali1/accept_ra": "0"}
