"""BPF_PROG_TEST_RUN: run a loaded program on a crafted packet without any interface.

The kernel builds an skb on the loopback device of the calling thread's network namespace
(or on ``ifindex`` when given), runs the program -- tail calls included -- and reports the
return value, the mean duration per run, the possibly modified packet and the final
``__sk_buff`` (mark, cb[]).  Redirect verdicts are returned, not executed.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from felixpy.bpf import maptypes as mt
from felixpy.bpf import syscall as sc


@dataclass(frozen=True, slots=True)
class TcRun:
    retval: int
    duration_ns: int
    packet: bytes
    mark: int
    cb: tuple[int, ...]

    @property
    def verdict(self) -> int:
        """retval as a signed int (TC_ACT_UNSPEC = -1)."""
        return self.retval - (1 << 32) if self.retval & 0x80000000 else self.retval


def run_tc(prog_fd: int, packet: bytes, *, mark: int = 0, cb: tuple[int, ...] = (),
           ifindex: int = 0, ingress_ifindex: int = 0, repeat: int = 1) -> TcRun:
    skb = mt.SkBuff()
    skb.mark = mark
    skb.ifindex = ifindex
    skb.ingress_ifindex = ingress_ifindex  # what the kernel's skb_iif is (a received packet's device)
    for i, v in enumerate(cb[:5]):
        skb.cb[i] = v
    r = sc.prog_test_run(prog_fd, packet, ctx=bytes(skb), repeat=repeat)
    out = mt.SkBuff.from_buffer_copy(r.ctx_out.ljust(ctypes.sizeof(mt.SkBuff), b"\0"))
    return TcRun(r.retval, r.duration_ns, r.data_out, out.mark, tuple(out.cb))


@dataclass(frozen=True, slots=True)
class XdpRun:
    retval: int
    duration_ns: int
    packet: bytes


def run_xdp(prog_fd: int, packet: bytes, *, repeat: int = 1) -> XdpRun:
    r = sc.prog_test_run(prog_fd, packet, repeat=repeat)
    return XdpRun(r.retval, r.duration_ns, r.data_out)
