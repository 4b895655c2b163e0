"""The attach layer: putting the preamble on an interface's two TC hooks, and taking it off.

What it owns: per workload interface, the direct-action clsact filter ``cali_tc_preambl`` (TC
mode) or the TCX link pinned at ``<tcx pin dir>/<iface without dots>_<ingress|egress>`` (TCX
mode), on both kernel hooks.

How a fresh process recognises them: by the filter name on the clsact hooks and by the TCX
link pin path (Felix's naming, :mod:`felixpy.bpf.attach`); an attach over an existing one is an
atomic replace (TC ``replace``, ``BPF_LINK_UPDATE`` of the pinned link), so a restarted process
never leaves an interface unprogrammed while it re-attaches.  :meth:`KernelAttacher.is_current`
tells the driver whether the pinned TCX link already runs this process's preamble -- the same
code (program tag) over the same maps (map ids) -- so a restart with the same feed re-attaches
nothing; for a clsact filter the program is read with libbpf's ``bpf_tc_query``.
:meth:`KernelAttacher.sweep` detaches and unlinks TCX link pins whose interface is gone.

Apply contract: :meth:`KernelAttacher.attach` is idempotent and atomic per hook
(:meth:`KernelAttacher.attach_many` is the same for many interfaces at once: in TC mode their
clsact and filter requests go out in chunked netlink batches with every ack read back);
:meth:`KernelAttacher.detach` removes what is there and treats absence as done.  The mechanism
(TCX by default, clsact where the kernel lacks TCX or ``BPFAttachType=TC``) is chosen in one
place, :func:`felixpy.bpf.attach.resolve_attach_mode`; a netkit device raises
:class:`~felixpy.errors.UnsupportedFeature` ("BPF netkit attach"), which the loop reports once
by name.  Every call acts in the calling thread's network namespace; the netlink calls (link kind,
clsact, filters) share one socket per attacher (:class:`felixpy.bpf.attach.RouteSocket`), reopened
when the namespace changes or after an error that may have left it out of step.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from felixpy.bpf import attach as bpfattach
from felixpy.bpf import defs
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError, UnsupportedAttachType
from felixpy.errors import UnsupportedFeature

log = structlog.get_logger(__name__)

HOOKS = (defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS)
NETKIT_FEATURE = "BPF netkit attach"


@dataclass(frozen=True, slots=True)
class AttachRequest:
    iface: str
    ifindex: int
    hook: int
    prog_fd: int


class Attacher(Protocol):
    def attach(self, iface: str, ifindex: int, hook: int, prog_fd: int) -> None: ...

    def attach_many(self, requests: Sequence[AttachRequest]) -> dict[str, Exception]:
        """:meth:`attach` for each request (per interface, in order); returns the interfaces whose
        attach failed, with the error (an interface that failed is not attached further)."""
        ...

    def detach(self, iface: str, ifindex: int) -> None: ...

    def is_attached(self, iface: str, ifindex: int, hook: int) -> bool: ...

    def mode(self, iface: str) -> str: ...

    def is_current(self, iface: str, ifindex: int, hook: int, prog_fd: int) -> bool:
        """Whether *hook* already runs a program equivalent to *prog_fd* (no re-attach needed)."""
        ...

    def sweep(self, existing: dict[str, int]) -> None:
        """Remove what is recorded for interfaces not in *existing* (name -> ifindex): they are gone."""
        ...


class KernelAttacher:
    """clsact/TCX through :mod:`felixpy.bpf.attach` (pyroute2 for TC, libbpf for TCX links)."""

    def __init__(self, attach_type: str, tcx_pin_dir: str, *, nl: bpfattach.RouteSocket | None = None) -> None:
        self.attach_type = attach_type
        self.tcx_pin_dir = tcx_pin_dir
        self._modes: dict[str, bpfattach.AttachMode] = {}
        self.nl = nl or bpfattach.RouteSocket()
        self._clsact: set[int] = set()  # ifindexes this attacher gave a clsact qdisc (both hooks share it)

    def _mode(self, iface: str) -> bpfattach.AttachMode:
        got = self._modes.get(iface)
        if got is None:
            try:
                got = bpfattach.resolve_attach_mode(self.attach_type, bpfattach.iface_kind(iface, nl=self.nl))
            except UnsupportedAttachType as e:
                raise UnsupportedFeature(NETKIT_FEATURE, str(e)) from e
            self._modes[iface] = got
        return got

    def mode(self, iface: str) -> str:
        return self._mode(iface).value

    def _pin(self, iface: str, hook: int) -> str:
        return bpfattach.tcx_pin_path(self.tcx_pin_dir, iface, hook)

    def attach(self, iface: str, ifindex: int, hook: int, prog_fd: int) -> None:
        mode = self._mode(iface)
        if mode is bpfattach.AttachMode.TC:
            self._attach_tc(ifindex, hook, prog_fd)
            # A TCX link left by a previous mode would run first: remove it after the swap.
            bpfattach.detach_tcx(pin_path=self._pin(iface, hook))
            return
        link = bpfattach.attach(mode, ifindex, hook, prog_fd, link_pin=self._pin(iface, hook), nl=self.nl)
        if link is not None:
            os.close(link)  # the pin holds the link

    def attach_many(self, requests: Sequence[AttachRequest]) -> dict[str, Exception]:
        """TC-mode interfaces: every clsact and filter request of the batch goes through
        :meth:`~felixpy.bpf.attach.RouteSocket.tc_batch` (one send per chunk instead of a pyroute2
        round trip each), then exactly what :meth:`attach` does after its filter (the stale TCX
        link removed); a filter refused for a missing qdisc takes :meth:`attach`'s own path (qdisc
        added back, filter retried).  Every other interface: :meth:`attach` per request."""
        failed: dict[str, Exception] = {}
        tc: list[AttachRequest] = []
        for r in requests:
            if r.iface in failed:
                continue
            try:
                if self._mode(r.iface) is bpfattach.AttachMode.TC:
                    tc.append(r)
                else:
                    self.attach(r.iface, r.ifindex, r.hook, r.prog_fd)
            except Exception as e:
                failed[r.iface] = e
        if not tc:
            return failed
        batch: list[bpfattach.TcRequest] = []
        owner: list[AttachRequest | int] = []  # per batch entry: its filter's request, or a clsact's ifindex
        qdiscs: set[int] = set()
        for r in tc:
            if r.ifindex not in self._clsact and r.ifindex not in qdiscs:
                batch.append(bpfattach.clsact_request(r.ifindex))  # once per interface, as attach does
                owner.append(r.ifindex)
                qdiscs.add(r.ifindex)
            batch.append(bpfattach.filter_request(r.ifindex, r.hook, r.prog_fd))
            owner.append(r)
        try:
            results = self.nl.tc_batch(batch)
        except Exception as e:  # the socket failed: nothing is known about this batch
            for r in tc:
                failed.setdefault(r.iface, e)
            return failed
        for who, err in zip(owner, results):
            if isinstance(who, int):
                if err is None or getattr(err, "code", None) == errno.EEXIST:
                    self._clsact.add(who)
                continue
            if who.iface in failed:
                continue
            try:
                if err is not None:
                    self._attach_tc(who.ifindex, who.hook, who.prog_fd)  # its retry, or the error again
                # A TCX link left by a previous mode would run first: remove it after the swap.
                bpfattach.detach_tcx(pin_path=self._pin(who.iface, who.hook))
            except Exception as e:
                failed[who.iface] = e
        return failed

    def _attach_tc(self, ifindex: int, hook: int, prog_fd: int) -> None:
        """clsact once per interface (the second hook's add was a netlink round trip that only
        returned EEXIST), then the filter; a qdisc removed under us is added back and the filter
        retried once."""
        if ifindex not in self._clsact:
            bpfattach.ensure_clsact(ifindex, nl=self.nl)
            self._clsact.add(ifindex)
        try:
            bpfattach.replace_tc_filter(ifindex, hook, prog_fd, nl=self.nl)
        except bpfattach._netlink_error():
            bpfattach.ensure_clsact(ifindex, nl=self.nl)
            bpfattach.replace_tc_filter(ifindex, hook, prog_fd, nl=self.nl)

    def detach(self, iface: str, ifindex: int) -> None:
        self._clsact.discard(ifindex)
        for hook in HOOKS:
            bpfattach.detach_tcx(pin_path=self._pin(iface, hook))
        with contextlib.suppress(OSError):
            if any(f == bpfattach.PREAMBLE_NAME for hook in HOOKS
                   for f in bpfattach.tc_filters(ifindex, hook, nl=self.nl)):
                bpfattach.detach_tc(ifindex, nl=self.nl)
        self._modes.pop(iface, None)

    def is_current(self, iface: str, ifindex: int, hook: int, prog_fd: int) -> bool:
        pin = self._pin(iface, hook)
        try:
            if self._mode(iface) is bpfattach.AttachMode.TC:
                if os.path.exists(pin):
                    return False  # a TCX link of an earlier mode would run first: attach removes it
                got = sc.tc_query_prog_id(ifindex, sc.TC_INGRESS if hook == defs.HOOK_TC_INGRESS else sc.TC_EGRESS,
                                          bpfattach.TC_HANDLE, bpfattach.TC_PRIO)
                if got is None:
                    return False
                prog_id = got
            else:
                if not os.path.exists(pin):
                    return False
                link = sc.obj_get(pin)
                try:
                    _type, _id, prog_id = sc.link_info(link)
                finally:
                    os.close(link)
                if prog_id not in bpfattach.tcx_programs(ifindex, hook):
                    return False  # a defunct link (the interface was re-created)
            fd = sc.prog_get_fd_by_id(prog_id)
            try:
                have = sc.prog_info(fd)
            finally:
                os.close(fd)
            mine = sc.prog_info(prog_fd)
        except (OSError, BPFSyscallError):
            return False
        return (have.name, have.tag, sorted(have.map_ids)) == (mine.name, mine.tag, sorted(mine.map_ids))

    def sweep(self, existing: dict[str, int]) -> None:
        keep = {n.replace(".", "") for n in existing}
        try:
            pins = sorted(os.listdir(self.tcx_pin_dir))
        except FileNotFoundError:
            return
        for pin in pins:
            base, _, hook = pin.rpartition("_")
            if hook in ("ingress", "egress") and base not in keep:
                log.info("Removing the TCX link pin of an interface that no longer exists", pin=pin)
                bpfattach.detach_tcx(pin_path=os.path.join(self.tcx_pin_dir, pin))

    def is_attached(self, iface: str, ifindex: int, hook: int) -> bool:
        if iface not in self._modes:
            # The start-of-day sweep asks this of every interface of the namespace; the answer does
            # not need the link kind (it only singles out netkit, which never carries our preamble),
            # so no link query per interface: TC checks the filter, TCX first the link pin.
            if self.attach_type.lower() == "tc" or not bpfattach.tcx_supported():
                return bpfattach.PREAMBLE_NAME in bpfattach.tc_filters(ifindex, hook, nl=self.nl)
            if not os.path.exists(self._pin(iface, hook)):
                return False
        if self._mode(iface) is bpfattach.AttachMode.TC:
            return bpfattach.PREAMBLE_NAME in bpfattach.tc_filters(ifindex, hook, nl=self.nl)
        return os.path.exists(self._pin(iface, hook)) and bool(bpfattach.tcx_programs(ifindex, hook))
