"""The attach layer: putting the preamble on an interface's two TC hooks, and taking it off.

What it owns: per workload interface, the direct-action clsact filter of the preamble (TC mode;
named ``cali_tc_preambl:[*fsobj]`` by ``tc``, which takes the program from its pin) at priority 1,
handle 1, or the TCX link pinned at ``<tcx pin dir>/<iface without dots>_<ingress|egress>`` (TCX
mode), on both kernel hooks; in TC mode also the two preamble pins
``<preamble pin dir>/<ingress|egress>/cali_tc_preambl``, re-pinned by each process.

How a fresh process recognises them: by the filter name on the clsact hooks
(:func:`felixpy.bpf.attach.is_preamble_filter`: ``tc``'s name, the bare ``cali_tc_preambl`` that
earlier versions set through pyroute2, and libbpf's ``cali_tc_preambl:[<id>]``) and by the TCX
link pin path (Felix's naming, :mod:`felixpy.bpf.attach`); an attach over an existing one is an
atomic replace (TC ``filter replace`` at the same priority and handle, ``BPF_LINK_UPDATE`` of the
pinned link), so a restarted process never leaves an interface unprogrammed while it re-attaches.
:meth:`KernelAttacher.is_current` tells the driver whether the pinned TCX link already runs this
process's preamble -- the same code (program tag) over the same maps (map ids) -- so a restart with
the same feed re-attaches nothing; for a clsact filter the program is read with libbpf's
``bpf_tc_query``.  :meth:`KernelAttacher.sweep` detaches and unlinks TCX link pins whose
interface is gone.

Apply contract: :meth:`KernelAttacher.attach` is idempotent and atomic per hook
(:meth:`KernelAttacher.attach_many` is the same for many interfaces at once: in TC mode every
interface's ``qdisc replace ... clsact`` and ``filter replace ... bpf da pinned`` lines go to one
``tc -force -batch -`` child, as routes go to ``ip -force -batch``, and each failed line names its
interface); :meth:`KernelAttacher.detach` removes what is there and treats absence as done.  The
mechanism (TCX by default, clsact where the kernel lacks TCX or ``BPFAttachType=TC``) is chosen in
one place, :func:`felixpy.bpf.attach.resolve_attach_mode`; a netkit device raises
:class:`~felixpy.errors.UnsupportedFeature` ("BPF netkit attach"), which the loop reports once by
name.  Every call acts in the calling thread's network namespace; the netlink calls (link kind,
clsact removal, filter dumps) share one socket per attacher (:class:`felixpy.bpf.attach.RouteSocket`),
reopened when the namespace changes or after an error that may have left it out of step.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from felixpy.bpf import attach as bpfattach
from felixpy.bpf import defs
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError, UnsupportedAttachType
from felixpy.bpf.maps import on_bpffs
from felixpy.drivers.cmdshim import CommandRunner, SubprocessRunner
from felixpy.drivers.netlink.iproute2 import IpTool
from felixpy.drivers.netlink import ifnames
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

    def attach_many(self, requests: Sequence[AttachRequest], *,
                    while_running: Callable[[], None] | None = None) -> dict[str, Exception]:
        """:meth:`attach` for each request (per interface, in order); returns the interfaces whose
        attach failed, with the error (an interface that failed is not attached further).
        *while_running*, if given, may be called once while a child process does the attaching."""
        ...

    def detach(self, iface: str, ifindex: int) -> None: ...

    def is_attached(self, iface: str, ifindex: int, hook: int) -> bool: ...

    def mode(self, iface: str) -> str: ...

    def learn_kind(self, iface: str, kind: str | None) -> None:
        """*iface*'s link kind as the interface monitor decoded it ("" for none), so the mode is
        chosen without asking the kernel; None forgets it (the interface is gone)."""
        ...

    def is_current(self, iface: str, ifindex: int, hook: int, prog_fd: int) -> bool:
        """Whether *hook* already runs a program equivalent to *prog_fd* (no re-attach needed)."""
        ...

    def sweep(self, existing: dict[str, int]) -> None:
        """Remove what is recorded for interfaces not in *existing* (name -> ifindex): they are gone."""
        ...

    def sweep_candidates(self, existing: dict[str, int]) -> set[str]:
        """The interfaces of *existing* that may carry a preamble of ours: the start-of-day sweep
        asks :meth:`is_attached` only of these (every one, when that cannot be narrowed down)."""
        ...


TC_TIMEOUT = 60.0  # seconds for one tc -batch run (3,000 lines take well under one)


class KernelAttacher:
    """clsact/TCX through :mod:`felixpy.bpf.attach`: ``tc -batch`` for TC, libbpf for TCX links.

    TC mode pins each hook's preamble at :func:`~felixpy.bpf.attach.preamble_pin_path` under
    *preamble_pin_dir* (default: ``felixpy-preamble`` beside the TCX pin directory; the daemon
    passes one under its pin root, where the *tables-mode cleanup finds it) and hands every
    interface's ``qdisc replace ... clsact`` and ``filter replace ... bpf da pinned`` lines of an
    :meth:`attach_many` to one ``tc -force -batch -`` child (*runner*, in the calling thread's
    namespace); each failed line is attributed to its interface.
    """

    def __init__(self, attach_type: str, tcx_pin_dir: str, *, nl: bpfattach.RouteSocket | None = None,
                 preamble_pin_dir: str | None = None, runner: CommandRunner | None = None,
                 tc: str = "tc") -> None:
        self.attach_type = attach_type
        self.tcx_pin_dir = tcx_pin_dir
        self.preamble_pin_dir = preamble_pin_dir or os.path.join(os.path.dirname(tcx_pin_dir.rstrip("/")),
                                                                 bpfattach.PREAMBLE_PIN_DIR)
        self._modes: dict[str, bpfattach.AttachMode] = {}
        self._kinds: dict[str, str] = {}  # link kinds the monitor reported (learn_kind)
        self.nl = nl or bpfattach.RouteSocket()
        self._tc = IpTool(runner or SubprocessRunner(timeout=TC_TIMEOUT), _names, tc=tc, names_of=ifnames.indextonames)
        self._pinned: dict[int, int] = {}  # hook -> the program fd this attacher pinned for it

    def _mode(self, iface: str) -> bpfattach.AttachMode:
        got = self._modes.get(iface)
        if got is None:
            kind = self._kinds[iface] if iface in self._kinds else bpfattach.iface_kind(iface, nl=self.nl)
            try:
                got = bpfattach.resolve_attach_mode(self.attach_type, kind or None)
            except UnsupportedAttachType as e:
                raise UnsupportedFeature(NETKIT_FEATURE, str(e)) from e
            self._modes[iface] = got
        return got

    def mode(self, iface: str) -> str:
        return self._mode(iface).value

    def learn_kind(self, iface: str, kind: str | None) -> None:
        if kind is None:
            self._kinds.pop(iface, None)
            self._modes.pop(iface, None)
        elif self._kinds.get(iface) != kind:
            self._kinds[iface] = kind
            self._modes.pop(iface, None)  # (chosen for another device of that name, or by asking)

    def _pin(self, iface: str, hook: int) -> str:
        return bpfattach.tcx_pin_path(self.tcx_pin_dir, iface, hook)

    def attach(self, iface: str, ifindex: int, hook: int, prog_fd: int) -> None:
        mode = self._mode(iface)
        if mode is bpfattach.AttachMode.TC:
            err = self._attach_tc([AttachRequest(iface, ifindex, hook, prog_fd)]).get(iface)
            if err is not None:
                raise err
            return
        link = bpfattach.attach(mode, ifindex, hook, prog_fd, link_pin=self._pin(iface, hook), nl=self.nl)
        if link is not None:
            os.close(link)  # the pin holds the link

    def attach_many(self, requests: Sequence[AttachRequest], *,
                    while_running: Callable[[], None] | None = None) -> dict[str, Exception]:
        """TC-mode interfaces: all of their lines in one ``tc -batch`` run (:meth:`_attach_tc`), with
        *while_running* called while the child runs; every other interface: :meth:`attach` per request."""
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
        if tc:
            failed.update(self._attach_tc([r for r in tc if r.iface not in failed], while_running))
        return failed

    def _attach_tc(self, requests: Sequence[AttachRequest],
                   while_running: Callable[[], None] | None = None) -> dict[str, Exception]:
        """One ``tc -force -batch`` run: per interface a clsact line, then its filter lines (an
        atomic replace of the preamble at our priority and handle); then what :meth:`attach` does
        after the filter (a TCX link left by a previous mode would run first: removed after the
        swap).  A request with another program than the one already chosen for its hook in this
        run waits for a second run (one pin per hook)."""
        failed: dict[str, Exception] = {}
        chosen: dict[int, int] = {}
        now: list[AttachRequest] = []
        later: list[AttachRequest] = []
        for r in requests:
            (now if chosen.setdefault(r.hook, r.prog_fd) == r.prog_fd else later).append(r)
        try:
            pins = {hook: self._pin_preamble(hook, fd) for hook, fd in chosen.items()}
        except OSError as e:  # nothing was sent
            return dict.fromkeys((r.iface for r in requests), e)
        lines: list[_TcLine] = []
        seen: set[int] = set()
        for r in now:
            if r.ifindex not in seen:
                seen.add(r.ifindex)
                lines.append(_TcLine(r.ifindex, None, ""))
            lines.append(_TcLine(r.ifindex, r.hook, pins[r.hook]))
        try:
            results = self._tc.tc_batch(lines, _tc_line, while_running=while_running)
        except Exception as e:  # the child could not run: nothing is known about this batch
            return dict.fromkeys((r.iface for r in now), e)
        by_line = dict(zip(((ln.ifindex, ln.hook) for ln in lines), results))
        for r in now:
            if r.iface in failed:
                continue
            err = by_line[(r.ifindex, r.hook)]
            try:
                if err:
                    why = by_line[(r.ifindex, None)] or err  # a clsact that could not be made says more
                    raise OSError(err, f"tc filter replace on {r.iface} {bpfattach.HOOK_NAMES[r.hook]} failed "
                                       f"({os.strerror(err)}; clsact: {os.strerror(why) if why != err else 'ok'})")
                bpfattach.detach_tcx(pin_path=self._pin(r.iface, r.hook))
            except Exception as e:
                failed[r.iface] = e
        if later:
            failed.update(self._attach_tc([r for r in later if r.iface not in failed]))
        return failed

    def _pin_preamble(self, hook: int, prog_fd: int) -> str:
        """The hook's preamble pin, holding *prog_fd*: pinned beside and renamed over the old one,
        so the path never names another run's program once this returns."""
        path = bpfattach.preamble_pin_path(self.preamble_pin_dir, hook)
        if self._pinned.get(hook) == prog_fd and os.path.exists(path):
            return path
        if not on_bpffs(path):  # never make directories outside a bpffs
            raise OSError(errno.ENOTSUP, f"no bpffs at {self.preamble_pin_dir} to pin the TC preamble in")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + "_new"  # (bpffs refuses names with a dot)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        try:
            sc.obj_pin(prog_fd, tmp)
        except BPFSyscallError as e:
            raise OSError(e.errno, f"pinning the TC preamble at {tmp}: {e}") from e
        os.replace(tmp, path)
        self._pinned[hook] = prog_fd
        return path

    def detach(self, iface: str, ifindex: int) -> None:
        for hook in HOOKS:
            bpfattach.detach_tcx(pin_path=self._pin(iface, hook))
        with contextlib.suppress(OSError):
            if any(bpfattach.is_preamble_filter(f) for hook in HOOKS
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
            have = sc.prog_info_by_id(prog_id)
            mine = sc.prog_info(prog_fd)
        except (OSError, BPFSyscallError):
            return False
        return have is not None and sc.same_program(have, mine)

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

    def sweep_candidates(self, existing: dict[str, int]) -> set[str]:
        """TC mode: only interfaces with a clsact (or ingress) qdisc can carry a filter, and one
        ``tc -j qdisc show`` lists them (a filter dump per hook of each of 1,000 interfaces cost
        ~1 s); TCX mode: every interface (its check starts with a link-pin ``stat``)."""
        if self.attach_type.lower() != "tc" and bpfattach.tcx_supported():
            return set(existing)
        res = self._tc.runner.run([self._tc.tc, "-j", "qdisc", "show"])
        try:
            if res.returncode != 0:
                raise ValueError(res.stderr.strip() or f"exit status {res.returncode}")
            hooked = bpfattach.parse_qdisc_dump(res.stdout)
        except ValueError as e:
            log.warning("Could not list the clsact qdiscs; checking every interface", error=str(e))
            return set(existing)
        return {n for n in existing if n in hooked}

    def is_attached(self, iface: str, ifindex: int, hook: int) -> bool:
        if iface not in self._modes:
            # The start-of-day sweep asks this of every interface of the namespace; the answer does
            # not need the link kind (it only singles out netkit, which never carries our preamble),
            # so no link query per interface: TC checks the filter, TCX first the link pin.
            if self.attach_type.lower() == "tc" or not bpfattach.tcx_supported():
                return self._tc_attached(ifindex, hook)
            if not os.path.exists(self._pin(iface, hook)):
                return False
        if self._mode(iface) is bpfattach.AttachMode.TC:
            return self._tc_attached(ifindex, hook)
        return os.path.exists(self._pin(iface, hook)) and bool(bpfattach.tcx_programs(ifindex, hook))

    def _tc_attached(self, ifindex: int, hook: int) -> bool:
        return any(bpfattach.is_preamble_filter(f) for f in bpfattach.tc_filters(ifindex, hook, nl=self.nl))


@dataclass(frozen=True, slots=True)
class _TcLine:
    """One ``tc -batch`` line: the clsact of *ifindex* (hook None) or its filter on *hook*."""

    ifindex: int
    hook: int | None
    pin: str


def _tc_line(line: _TcLine, dev: str) -> str:
    return bpfattach.clsact_line(dev) if line.hook is None else bpfattach.filter_line(dev, line.hook, line.pin)


def _names() -> dict[int, str]:
    """index -> name of every interface of the calling thread's namespace (``if_nameindex``)."""
    return dict(ifnames.if_nameindex())
