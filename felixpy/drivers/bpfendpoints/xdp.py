"""The XDP attach layer: the XDP preamble on a host interface, for its untracked ingress policy.

In BPF mode, untracked (doNotTrack) host-endpoint policy in the ingress direction has one
implementation, an XDP program (Felix's ``bpf_ep_mgr.go``, ``bpf-gpl/xdp.c``): it runs before the
kernel allocates an skb, so a denied packet never reaches conntrack, and an allowed one carries
metadata that tells the TC program to let it through untouched (``tc.c``:
``CALI_META_ACCEPTED_BY_XDP`` → ``BYPASS_XDP`` mark → raw ``cali-PREROUTING`` NOTRACKs it).

What it owns: the XDP program on an interface whose program name is ``cali_xdp_preamb`` (the
kernel's cut of ``cali_xdp_preamble``, Felix's name), attached through netlink (``IFLA_XDP``: no
link, no pin, as Felix's libbpf ``bpf_xdp_attach``) in driver mode, or generic mode where the
driver has no XDP (Felix always allows generic in BPF mode: untracked ingress policy has no other
implementation there).

How a fresh process recognises it: by the name of the program the interface's ``IFLA_XDP_PROG_ID``
points at.  :meth:`KernelXdpAttacher.is_current` compares it with this process's preamble (name,
tag, map ids), so a restart with the same programs re-attaches nothing; otherwise the attach is an
atomic replace (``XDP_FLAGS_REPLACE`` with the expected old program, in the mode it runs in).  An
XDP program that is *not* ours is never replaced or removed: the interface's attach fails with
:class:`ForeignXdpProgram` (the driver retries it, the untracked ingress policy is not enforced
until the operator removes the other program) -- one interface has one XDP program.

Apply contract: :meth:`attach` is idempotent and atomic; :meth:`detach` removes only our program
and treats absence as done.  Every call acts in the calling thread's network namespace, over the
driver's one rtnetlink socket (:class:`felixpy.bpf.attach.RouteSocket`).
"""

from __future__ import annotations

import errno
from typing import Protocol

import structlog

from felixpy.bpf import attach as bpfattach
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError

log = structlog.get_logger(__name__)


class ForeignXdpProgram(OSError):
    """The interface runs an XDP program felixpy did not attach."""


class XdpAttacher(Protocol):
    def attach(self, iface: str, ifindex: int, prog_fd: int) -> None:
        """Put *prog_fd* on the interface's XDP hook (replacing our own program atomically)."""

    def detach(self, iface: str, ifindex: int) -> None:
        """Remove our XDP program from the interface, if it has one."""

    def is_attached(self, iface: str, ifindex: int) -> bool:
        """Whether the interface's XDP hook runs a program of ours."""

    def is_current(self, iface: str, ifindex: int, prog_fd: int) -> bool:
        """Whether the interface's XDP hook runs a program equivalent to *prog_fd*."""


class KernelXdpAttacher:
    """XDP through :mod:`felixpy.bpf.attach` (pyroute2 ``IFLA_XDP``)."""

    def __init__(self, nl: bpfattach.RouteSocket | None = None) -> None:
        self.nl = nl or bpfattach.RouteSocket()

    def _attached(self, ifindex: int) -> tuple[int, sc.ProgInfo | None] | None:
        have = bpfattach.xdp_attached(ifindex, nl=self.nl)
        if have is None:
            return None
        return have[0], (sc.prog_info_by_id(have[0]) if have[0] else None)

    @staticmethod
    def _ours(info: sc.ProgInfo | None) -> bool:
        return info is not None and info.name.startswith(bpfattach.XDP_PREAMBLE_NAME)

    def attach(self, iface: str, ifindex: int, prog_fd: int) -> None:
        have = self._attached(ifindex)
        if have is not None and not self._ours(have[1]):
            name = have[1].name if have[1] is not None else "?"
            raise ForeignXdpProgram(errno.EBUSY, f"{iface} runs an XDP program felixpy did not attach (id {have[0]}, "
                                                 f"name {name!r}); not replacing it, so its untracked ingress "
                                                 "policy is not enforced")
        mode = bpfattach.attach_xdp(ifindex, prog_fd, nl=self.nl)
        if have is None:
            log.info("XDP preamble attached", iface=iface, mode=bpfattach.XDP_MODE_NAMES.get(mode, mode))

    def detach(self, iface: str, ifindex: int) -> None:
        have = self._attached(ifindex)
        if have is not None and self._ours(have[1]):
            bpfattach.detach_xdp(ifindex, nl=self.nl)
            log.info("XDP preamble detached", iface=iface)

    def is_attached(self, iface: str, ifindex: int) -> bool:
        have = self._attached(ifindex)
        return have is not None and self._ours(have[1])

    def is_current(self, iface: str, ifindex: int, prog_fd: int) -> bool:
        try:
            have = self._attached(ifindex)
            if have is None or have[1] is None or not self._ours(have[1]):
                return False
            mine = sc.prog_info(prog_fd)
        except (OSError, BPFSyscallError):
            return False
        return sc.same_program(have[1], mine)
