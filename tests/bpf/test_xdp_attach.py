"""The XDP attach layer against the kernel, in a throwaway namespace: our preamble goes on in driver
mode (veth has native XDP), is recognised by name and by code after a "restart", is replaced
atomically, is never confused with someone else's XDP program, and detach removes only ours."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import pytest

from felixpy.bpf import attach
from felixpy.bpf import syscall as sc
from felixpy.drivers.bpfendpoints.xdp import ForeignXdpProgram, KernelXdpAttacher
from felixpy.testing import netns as nsutil

pytestmark = [pytest.mark.bpf, pytest.mark.kernel]


def _xdp_prog(name: str, ret: int = 2) -> int:
    """r0 = ret (2: XDP_PASS); exit."""
    insns = struct.pack("<BBhi", 0xB7, 0, 0, ret) + struct.pack("<BBhi", 0x95, 0, 0, 0)
    return sc.prog_load(sc.PROG_TYPE_XDP, insns, name=name, license="GPL")


@pytest.fixture
def ns() -> Iterator[str]:
    with nsutil.netns("fpyx") as name:
        nsutil.run_in(name, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
        nsutil.run_in(name, "ip", "link", "add", "br0", "type", "bridge")
        for dev in ("eth0", "peer0", "br0"):
            nsutil.run_in(name, "ip", "link", "set", dev, "up")
        yield name


def _prog_id(fd: int) -> int:
    return sc.prog_info(fd).id


def test_attach_replace_recognise_and_detach(ns: str) -> None:
    ours = _xdp_prog(attach.XDP_PREAMBLE_NAME)
    ours2 = _xdp_prog(attach.XDP_PREAMBLE_NAME, ret=1)  # other code, same name (an upgrade)
    try:
        with nsutil.entered(ns):
            a = KernelXdpAttacher()
            idx = socket.if_nametoindex("eth0")
            assert not a.is_attached("eth0", idx) and attach.xdp_attached(idx, nl=a.nl) is None
            a.attach("eth0", idx, ours)
            assert attach.xdp_attached(idx, nl=a.nl) == (_prog_id(ours), attach.XDP_FLAGS_DRV_MODE)  # veth: native
            assert a.is_attached("eth0", idx) and a.is_current("eth0", idx, ours)
            assert not a.is_current("eth0", idx, ours2)
            # A fresh attacher (a restarted process) recognises it by name and code.
            b = KernelXdpAttacher()
            assert b.is_attached("eth0", idx) and b.is_current("eth0", idx, ours)
            b.attach("eth0", idx, ours2)  # atomic replace in the mode it runs in
            assert attach.xdp_attached(idx, nl=b.nl) == (_prog_id(ours2), attach.XDP_FLAGS_DRV_MODE)
            b.detach("eth0", idx)
            assert attach.xdp_attached(idx, nl=b.nl) is None
            b.detach("eth0", idx)  # absent: done
            a.nl.close()
            b.nl.close()
    finally:
        os.close(ours)
        os.close(ours2)


def test_generic_mode_where_the_driver_has_no_xdp(ns: str) -> None:
    prog = _xdp_prog(attach.XDP_PREAMBLE_NAME)
    try:
        with nsutil.entered(ns):
            a = KernelXdpAttacher()
            idx = socket.if_nametoindex("br0")  # a bridge has no native XDP
            a.attach("br0", idx, prog)
            assert attach.xdp_attached(idx, nl=a.nl) == (_prog_id(prog), attach.XDP_FLAGS_SKB_MODE)
            assert a.is_current("br0", idx, prog)
            a.detach("br0", idx)
            assert attach.xdp_attached(idx, nl=a.nl) is None
            a.nl.close()
    finally:
        os.close(prog)


def test_a_foreign_xdp_program_is_neither_replaced_nor_removed(ns: str) -> None:
    foreign = _xdp_prog("someone_else")
    ours = _xdp_prog(attach.XDP_PREAMBLE_NAME)
    try:
        with nsutil.entered(ns):
            idx = socket.if_nametoindex("eth0")
            attach.attach_xdp(idx, foreign)
            a = KernelXdpAttacher()
            assert not a.is_attached("eth0", idx)
            with pytest.raises(ForeignXdpProgram, match="someone_else"):
                a.attach("eth0", idx, ours)
            a.detach("eth0", idx)
            assert attach.xdp_attached(idx, nl=a.nl) == (_prog_id(foreign), attach.XDP_FLAGS_DRV_MODE)
            attach.detach_xdp(idx)
            a.nl.close()
    finally:
        os.close(foreign)
        os.close(ours)
