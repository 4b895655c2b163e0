"""The attach layer's netlink socket (:class:`felixpy.bpf.attach.RouteSocket`): one socket serves
every interface, the link kind (what decides netkit versus TCX/TC) is still read right, and a
socket that may be out of step is replaced.

The first tests run against a stateful fake rtnetlink socket that answers RTM_GETLINK from a table
of interfaces (with failure injection); the kernel tests run in throwaway namespaces and compare
with pyroute2's own decoding of the same links.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator

import pytest

from felixpy.bpf import attach, defs
from felixpy.bpf import syscall as sc
from felixpy.drivers.bpfendpoints.attacher import HOOKS, KernelAttacher
from felixpy.testing import netns as nsutil

RET0 = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])
HDR = struct.Struct("=IHHII")


def _reply_newlink(seq: int, kind: str | None) -> bytes:
    info = attach._rta(attach._IFLA_INFO_KIND, kind.encode() + b"\0") if kind else b""
    body = (attach._IFINFOMSG.pack(0, 1, 7, 0, 0) + attach._rta(attach._IFLA_IFNAME, b"x\0")
            + attach._rta(attach._IFLA_LINKINFO | 0x8000, info))
    return HDR.pack(HDR.size + len(body), attach._RTM_NEWLINK, 0, seq, 0) + body


def _reply_error(seq: int, err: int) -> bytes:
    body = struct.pack("=i", -err) + b"\0" * 16
    return HDR.pack(HDR.size + len(body), attach._NLMSG_ERROR, 0, seq, 0) + body


class FakeRtnl:
    """Answers RTM_GETLINK by name from ``links`` (name -> kind); ``fail_next_recv`` raises a
    timeout once, ``late`` prepends an answer to an older request to the next reply."""

    def __init__(self, links: dict[str, str | None]) -> None:
        self.links = links
        self.pending: list[bytes] = []
        self.fail_next_recv = False
        self.late = False
        self.closed = False

    def send(self, data: bytes) -> int:
        _len, mtype, _flags, seq, _pid = HDR.unpack_from(data)
        assert mtype == attach._RTM_GETLINK
        attrs = dict(attach._attrs(data[HDR.size + attach._IFINFOMSG.size:]))
        assert struct.unpack("=I", attrs[attach._IFLA_EXT_MASK]) == (attach._RTEXT_FILTER_SKIP_STATS,)
        name = attrs[attach._IFLA_IFNAME].rstrip(b"\0").decode()
        if name in self.links:
            self.pending.append(_reply_newlink(seq, self.links[name]))
        else:
            self.pending.append(_reply_error(seq, errno.ENODEV if name != "eperm" else errno.EPERM))
        return len(data)

    def recv(self, _n: int) -> bytes:
        if self.fail_next_recv:
            self.fail_next_recv = False
            self.pending.clear()  # the answer arrives too late for this socket's next request
            raise TimeoutError("timed out")
        out = self.pending.pop(0)
        if self.late:
            self.late = False
            out = _reply_newlink(0x7FFFFFF0, "bogus") + out
        return out

    def close(self) -> None:
        self.closed = True


class Opener:
    def __init__(self, links: dict[str, str | None]) -> None:
        self.links = links
        self.made: list[FakeRtnl] = []

    def __call__(self) -> socket.socket:
        s = FakeRtnl(self.links)
        self.made.append(s)
        return s  # type: ignore[return-value]


def _nl(links: dict[str, str | None], ns: list[tuple[int, int]] | None = None) -> tuple[attach.RouteSocket, Opener]:
    op = Opener(links)
    where = ns if ns is not None else [(1, 1)]
    return attach.RouteSocket(raw_opener=op, netns_id=lambda: where[0]), op


def test_one_socket_answers_the_kind_of_every_interface() -> None:
    links: dict[str, str | None] = {f"cali{i}": "veth" for i in range(100)}
    links["nk0"] = "netkit"
    links["lo"] = None
    nl, op = _nl(links)
    assert all(attach.iface_kind(f"cali{i}", nl=nl) == "veth" for i in range(100))
    assert attach.iface_kind("nk0", nl=nl) == "netkit"
    assert attach.iface_kind("lo", nl=nl) is None
    assert attach.iface_kind("gone", nl=nl) is None  # ENODEV: the monitor's view lags a deletion
    assert len(op.made) == 1 and nl.opened == 1


def test_a_kernel_error_keeps_the_socket_and_a_timeout_replaces_it() -> None:
    nl, op = _nl({"cali1": "veth"})
    with pytest.raises(attach.LinkQueryError) as exc:
        attach.iface_kind("eperm", nl=nl)
    assert exc.value.errno == errno.EPERM
    assert attach.iface_kind("cali1", nl=nl) == "veth" and len(op.made) == 1
    op.made[0].fail_next_recv = True
    with pytest.raises(TimeoutError):
        attach.iface_kind("cali1", nl=nl)
    assert op.made[0].closed
    assert attach.iface_kind("cali1", nl=nl) == "veth"
    assert len(op.made) == 2 and not op.made[1].closed


def test_a_late_reply_to_an_earlier_request_is_skipped() -> None:
    nl, op = _nl({"cali1": "veth"})
    attach.iface_kind("cali1", nl=nl)
    op.made[0].late = True
    assert attach.iface_kind("cali1", nl=nl) == "veth"
    assert len(op.made) == 1


def test_another_namespace_gets_another_socket() -> None:
    where = [(1, 1)]
    nl, op = _nl({"cali1": "veth"}, where)
    attach.iface_kind("cali1", nl=nl)
    where[0] = (1, 2)
    attach.iface_kind("cali1", nl=nl)
    assert len(op.made) == 2 and op.made[0].closed


def test_netkit_is_still_refused_through_the_shared_socket() -> None:
    from felixpy.errors import UnsupportedFeature

    nl, _op = _nl({"nk0": "netkit"})
    a = KernelAttacher("Netkit", "/nonexistent", nl=nl)
    with pytest.raises(UnsupportedFeature):
        a.mode("nk0")


# ------------------------------------------------------------------------------ kernel


@pytest.fixture
def ns() -> Iterator[str]:
    with nsutil.netns("fpyn") as name:
        for cmd in (["link", "add", "cali0", "type", "veth", "peer", "name", "p0"],
                    ["link", "add", "vx0", "type", "vxlan", "id", "5", "dstport", "4789"], ["link", "add", "br0", "type", "bridge"]):
            nsutil.run_in(name, "ip", *cmd)
        for i in range(1, 20):
            nsutil.run_in(name, "ip", "link", "add", f"cali{i}", "type", "veth", "peer", "name", f"p{i}")
        yield name


@pytest.mark.bpf
@pytest.mark.kernel
def test_kernel_kinds_match_pyroute2_over_one_socket(ns: str) -> None:
    with nsutil.entered(ns):
        with attach._ipr() as ipr:
            want = {}
            for link in ipr.get_links():
                info = link.get_attr("IFLA_LINKINFO")
                kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
                want[str(link.get_attr("IFLA_IFNAME"))] = kind or None
        nl = attach.RouteSocket()
        got = {n: attach.iface_kind(n, nl=nl) for n in want}
        assert got == want
        assert got["cali0"] == "veth" and got["vx0"] == "vxlan" and got["br0"] == "bridge" and got["lo"] is None
        assert attach.iface_kind("nosuch0", nl=nl) is None
        assert attach.iface_kind("cali3") == "veth"  # without a RouteSocket: a socket of the call alone
        assert nl.opened == 1
    nl.close()


@pytest.mark.bpf
@pytest.mark.kernel
@pytest.mark.parametrize("attach_type", ["TC", "TCX"])
def test_attacher_programs_twenty_interfaces_over_one_socket_per_kind(ns: str, attach_type: str) -> None:
    if attach_type == "TCX" and not attach.tcx_supported():
        pytest.skip("kernel without TCX")
    from felixpy.bpf import maps

    prog = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name=attach.PREAMBLE_NAME)
    try:
        with maps.private_bpffs() as root, nsutil.entered(ns):
            a = KernelAttacher(attach_type, os.path.join(root, "tcx"))
            names = [f"cali{i}" for i in range(20)]
            for n in names:
                nsutil.run_in(ns, "ip", "link", "set", n, "up")
                for hook in HOOKS:
                    a.attach(n, socket.if_nametoindex(n), hook, prog)
                    a.attach(n, socket.if_nametoindex(n), hook, prog)  # again: replace / link update
            for n in names:
                idx = socket.if_nametoindex(n)
                assert all(a.is_attached(n, idx, hook) for hook in HOOKS)
                assert all(a.is_current(n, idx, hook, prog) for hook in HOOKS)
            # The link kind and (TC) the clsact/filter calls: one socket each for all 20 interfaces,
            # EEXIST from the second clsact add included.
            assert a.nl.opened == (2 if attach_type == "TC" else 1)
            for n in names:
                a.detach(n, socket.if_nametoindex(n))
                idx = socket.if_nametoindex(n)
                assert not any(a.is_attached(n, idx, hook) for hook in HOOKS)
            if attach_type == "TC":
                assert attach.tc_filters(socket.if_nametoindex("cali0"), defs.HOOK_TC_INGRESS) == []
            a.nl.close()
    finally:
        os.close(prog)


@pytest.mark.bpf
@pytest.mark.kernel
def test_tc_attach_adds_clsact_back_when_it_was_removed_under_the_attacher(ns: str) -> None:
    prog = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name=attach.PREAMBLE_NAME)
    try:
        with nsutil.entered(ns):
            a = KernelAttacher("TC", "/nonexistent")
            nsutil.run_in(ns, "ip", "link", "set", "cali0", "up")
            idx = socket.if_nametoindex("cali0")
            for hook in HOOKS:
                a.attach("cali0", idx, hook, prog)
            nsutil.run_in(ns, "tc", "qdisc", "del", "dev", "cali0", "clsact")  # someone else's doing
            assert not any(a.is_attached("cali0", idx, hook) for hook in HOOKS)
            for hook in HOOKS:
                a.attach("cali0", idx, hook, prog)
            assert all(a.is_attached("cali0", idx, hook) for hook in HOOKS)
            assert all(a.is_current("cali0", idx, hook, prog) for hook in HOOKS)
            a.nl.close()
    finally:
        os.close(prog)
