"""Cleanup-only driver: removes what BPF mode left, in the *tables modes (``BPFEnabled=false``).

Felix's ``tc.CleanUpProgramsAndPins``: when BPF mode is off, every program, attachment and pin an
earlier BPF-mode run made is removed, so switching a node back to iptables or nftables leaves
nothing of BPF mode behind.  :class:`BPFCleanup` is that driver; it is node-level (one for both
IP families; wiring registers it with the first family's cleanups).

What it owns
    Nothing that should exist in a *tables mode:

    * on every interface of this network namespace, the preamble on the clsact hooks (a BPF
      filter whose program name is ours, :func:`felixpy.bpf.owned.is_owned_prog_name`, read
      through :func:`felixpy.bpf.attach.filter_prog_name` since ``tc`` and libbpf add a
      ``:[...]`` suffix): the clsact qdisc carrying it is deleted, as Felix does;
    * on every interface, an XDP program named ``cali_xdp_preamb`` (a host endpoint's untracked
      ingress policy): detached, in the mode it runs in;
    * TCX links pinned in the TCX pin directory (``<iface without dots>_<ingress|egress>``):
      detached, then unlinked;
    * every pin under the pin root (and its subdirectories) whose name has one of our map
      prefixes (``cali_``, ``calico_``, ``xdp_cali_``) -- the TC preambles' pins in
      ``<pin root>/felixpy-preamble/<hook>/`` among them -- and the policy programs' sources in
      ``<pin root>/felixpy-policy`` (:mod:`felixpy.bpf.policyload`); programs held only by the prog arrays go
      with the last reference to those arrays.

    Foreign filters, links, pins and programs are never touched (a TCX program of ours attached
    by a link nobody pinned cannot be reached and is reported, never guessed at; another XDP
    program stays).

How a fresh process recognises them
    With no memory of the earlier run: filter and program names on each interface's hooks (XDP's
    included), the
    TCX pin directory's file names, and the pin root's file names.  No bpffs is mounted for the
    look-up: where none is mounted there can be no pins (clsact filters are still looked for).

Apply contract
    Runs in the loop's cleanup step, only after the active backend's tables were written in the
    same apply, so the *tables policy already fails closed before the BPF programs go (while both
    exist a packet must pass both).  One pass removes everything found; then the namespace is read
    again and the driver is done once nothing of ours is found.  A failure raises
    :class:`~felixpy.errors.DataplaneError` (retried on the next apply, never fatal);
    :meth:`queue_resync` re-arms it.  Acts in the calling thread's network namespace.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from felixpy.bpf import attach as bpfattach
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError
from felixpy.bpf.maps import OWNED_PREFIXES, is_bpffs
from felixpy.bpf.owned import is_owned_prog_name, list_owned_programs
from felixpy.bpf.polsource import SOURCE_DIR
from felixpy.drivers.bpfendpoints.attacher import HOOKS
from felixpy.errors import DataplaneError

log = structlog.get_logger(__name__)


@dataclass
class Leftovers:
    """What of BPF mode one look at the namespace found."""

    tc: list[tuple[str, int]] = field(default_factory=list)  # (iface, ifindex) with our clsact filter
    xdp: list[tuple[str, int]] = field(default_factory=list)  # (iface, ifindex) running our XDP preamble
    tcx_pins: list[str] = field(default_factory=list)
    tcx_unpinned: list[str] = field(default_factory=list)  # "iface/hook": our program, no pin we know
    pins: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tc or self.xdp or self.tcx_pins or self.tcx_unpinned or self.pins)

    def summary(self) -> dict[str, int]:
        return {"tc_ifaces": len(self.tc), "xdp_ifaces": len(self.xdp), "tcx_links": len(self.tcx_pins),
                "pins": len(self.pins),
                "unreachable_tcx": len(self.tcx_unpinned)}


def _links() -> list[tuple[str, int]]:
    ipr = bpfattach._ipr()
    with ipr:
        return [(str(m.get_attr("IFLA_IFNAME")), int(m["index"])) for m in ipr.get_links()]


def _prog_name(prog_id: int) -> str:
    info = sc.prog_info_by_id(prog_id)
    return info.name if info is not None else ""


def _owned_programs_loaded() -> bool:
    """Whether the kernel holds any program with one of our names (:func:`list_owned_programs`).

    Programs belong to the kernel, not to a namespace, and every attachment this driver looks for
    holds its program: with none of ours loaded anywhere, no interface can carry one.  Asking each
    interface instead was ~3.5 ms an interface (3.5 s at 1,000 workloads, on every start of day in
    the *tables modes, before ``DataplaneInSync``); the program list is one id walk.  A walk the
    kernel refuses (no ``CAP_SYS_ADMIN``, no ``bpf()``) cannot tell: then the interfaces are asked."""
    try:
        return bool(list_owned_programs())
    except (BPFSyscallError, OSError) as exc:
        log.debug("BPF program list unreadable; looking at every interface", error=str(exc))
        return True


class BPFCleanup:
    """Removes every BPF-mode attachment and pin (see the module doc)."""

    name = "bpf"

    def __init__(self, pin_root: str, tcx_pin_dir: str, *, ip_version: int = 4,
                 links: Callable[[], list[tuple[str, int]]] = _links,
                 owned_programs_loaded: Callable[[], bool] = _owned_programs_loaded) -> None:
        self.ip_version = ip_version  # node-level: registered with one family only
        self.pin_root = pin_root
        self.tcx_pin_dir = tcx_pin_dir
        self._links = links
        self._owned_programs_loaded = owned_programs_loaded
        self.done = False
        self.removed = 0  # objects removed (the other cleanup drivers' counter)
        self.removed_by_kind: dict[str, int] = {}

    def queue_resync(self) -> None:
        self.done = False

    # ---------------------------------------------------------------------------- reading
    def find(self) -> Leftovers:
        out = Leftovers()
        pinned_tcx: set[str] = set()
        if is_bpffs(self.tcx_pin_dir):
            for pin in sorted(os.listdir(self.tcx_pin_dir)):
                if pin.rpartition("_")[2] in ("ingress", "egress"):
                    out.tcx_pins.append(os.path.join(self.tcx_pin_dir, pin))
                    pinned_tcx.add(pin)
        if self._owned_programs_loaded():
            self._find_attached(out, pinned_tcx)
        if is_bpffs(self.pin_root):
            for d, _dirs, files in os.walk(self.pin_root):
                if os.path.abspath(d) == os.path.abspath(self.tcx_pin_dir):
                    continue
                sources = os.path.basename(d) == SOURCE_DIR  # the policy programs' sources (felixpy explain's)
                out.pins += [os.path.join(d, f) for f in sorted(files) if sources or f.startswith(OWNED_PREFIXES)]
        return out

    def _find_attached(self, out: Leftovers, pinned_tcx: set[str]) -> None:
        """Each interface's hooks: our clsact filters, XDP preamble and TCX programs (one netlink
        socket for all of them, not one per question)."""
        nl = bpfattach.RouteSocket()
        try:
            for name, ifindex in self._links():
                if any(is_owned_prog_name(bpfattach.filter_prog_name(f))
                       for hook in HOOKS for f in bpfattach.tc_filters(ifindex, hook, nl=nl)):
                    out.tc.append((name, ifindex))
                xdp = bpfattach.xdp_attached(ifindex, nl=nl)
                if xdp is not None and xdp[0] and _prog_name(xdp[0]).startswith(bpfattach.XDP_PREAMBLE_NAME):
                    out.xdp.append((name, ifindex))
                for hook in HOOKS:
                    mine = [p for p in bpfattach.tcx_programs(ifindex, hook) if is_owned_prog_name(_prog_name(p))]
                    pin = os.path.basename(bpfattach.tcx_pin_path(self.tcx_pin_dir, name, hook))
                    if mine and pin not in pinned_tcx:
                        out.tcx_unpinned.append(f"{name}/{pin.rpartition('_')[2]}")
        finally:
            nl.close()

    # ---------------------------------------------------------------------------- apply
    def apply(self) -> None:
        if self.done:
            return
        try:
            found = self.find()
            if not found:
                self.done = True
                return
            log.info("Removing what BPF mode left (BPFEnabled is off)", **found.summary())
            self._remove(found)
            left = self.find()
        except DataplaneError:
            raise
        except Exception as exc:
            raise DataplaneError(f"BPF cleanup failed: {type(exc).__name__}: {exc}") from exc
        if left:
            raise DataplaneError(f"BPF cleanup: still present after removing: {left.summary()} "
                                 f"(unreachable TCX attachments: {left.tcx_unpinned[:5]})")
        self.done = True

    def _remove(self, found: Leftovers) -> None:
        # Links first (they hold the preambles), then the qdiscs, then the map pins.
        for pin in found.tcx_pins:
            bpfattach.detach_tcx(pin_path=pin)
        for _name, ifindex in found.tc:
            bpfattach.detach_tc(ifindex)
        for _name, ifindex in found.xdp:
            bpfattach.detach_xdp(ifindex)
        for pin in found.pins:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pin)
        preambles = os.path.join(self.pin_root, bpfattach.PREAMBLE_PIN_DIR)
        for d in (self.tcx_pin_dir, os.path.join(self.pin_root, "old_jumps"), os.path.join(self.pin_root, SOURCE_DIR),
                  *(os.path.join(preambles, h) for h in bpfattach.HOOK_NAMES.values()), preambles):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        for k, v in (("tcx_links", len(found.tcx_pins)), ("tc_ifaces", len(found.tc)), ("xdp_ifaces", len(found.xdp)),
                     ("pins", len(found.pins))):
            self.removed_by_kind[k] = self.removed_by_kind.get(k, 0) + v
            self.removed += v
