"""The BPF objects every BPF driver shares on a node: pinned maps, generic programs, policy
programs and the attach layer (one bundle, both IP families).

What it owns: nothing by itself; :func:`open_kernel` opens (or creates and pins) every map in
:data:`felixpy.bpf.maps.ALL_SPECS` under the pin root, and hands the compile work to the
short-lived worker (:mod:`felixpy.bpf.worker`) so this process never imports bcc or LLVM.  The
policy programs' bytecode cache (:mod:`felixpy.bpf.polcache`) lives in the compile cache's
directory (``FELIXPY_BPF_CACHE_DIR``; empty: neither cache).

How a fresh process recognises them: maps by pin path, kernel name and layout
(:mod:`felixpy.bpf.maps`); the drivers that use this bundle say how they recognise the rest.

Apply contract: opening is idempotent; the drivers reconcile entries in their own ``apply()``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from felixpy.bpf import defs
from felixpy.bpf.attach import PREAMBLE_PIN_DIR
from felixpy.bpf.build import xdp_metadata_supported
from felixpy.bpf.hook import ProgramsMap
from felixpy.bpf.ipsets import IPSetIDAllocator
from felixpy.bpf.maps import MapSet, ensure_pin_root
from felixpy.bpf.polcache import PolicyBytecodeCache
from felixpy.bpf.policyload import JumpMapAllocator, PolicyPrograms
from felixpy.bpf.polsource import PinnedSources
from felixpy.drivers.bpfendpoints.attacher import HOOKS, Attacher, KernelAttacher
from felixpy.drivers.bpfendpoints.xdp import KernelXdpAttacher, XdpAttacher


@dataclass
class BPFKernel:
    maps: MapSet
    programs: ProgramsMap
    policies: PolicyPrograms
    attacher: Attacher
    ipset_ids: IPSetIDAllocator
    slots: dict[int, JumpMapAllocator]  # per hook (TC ingress/egress, XDP): policy entry allocator
    xdp: XdpAttacher  # host interfaces' XDP hook (untracked ingress policy)
    # Whether the XDP program can tell TC that untracked policy accepted a packet (build.py's probe).
    xdp_metadata: Callable[[], bool] = xdp_metadata_supported


def slot_allocators() -> dict[int, JumpMapAllocator]:
    """One policy-entry allocator per hook: TC entries 0..9999, XDP 0..99 (Felix's sizes)."""
    out = {hook: JumpMapAllocator() for hook in HOOKS}
    out[defs.HOOK_XDP] = JumpMapAllocator(size=defs.XDP_POLICY_STRIDE)
    return out


PIN_ROOT_ENV = "FELIXPY_BPF_PIN_ROOT"


def configured_pin_root() -> str:
    """The daemon's pin root: ``$FELIXPY_BPF_PIN_ROOT`` (tests: a private bpffs) or Felix's
    ``/sys/fs/bpf/tc/globals``.  BPF mode pins there; the *tables modes clean up there."""
    from felixpy.bpf.maps import DEFAULT_PIN_ROOT

    return os.environ.get(PIN_ROOT_ENV, DEFAULT_PIN_ROOT)


def default_tcx_pin_dir(pin_root: str) -> str:
    """Felix pins TCX links in ``/sys/fs/bpf/tcx`` beside ``/sys/fs/bpf/tc/globals``; any other
    pin root keeps them in its own ``tcx`` subdirectory."""
    root = pin_root.rstrip("/")
    suffix = os.path.join("tc", "globals")
    if root.endswith(os.sep + suffix):
        return os.path.join(root[: -len(suffix)], "tcx")
    return os.path.join(root, "tcx")


def open_kernel(pin_root: str, attach_type: str, *, tcx_pin_dir: str | None = None,
                sizes: dict[str, int] | None = None) -> BPFKernel:
    """The real bundle: maps pinned under *pin_root* (bpffs is mounted at /sys/fs/bpf when
    nothing is), variants compiled in the worker."""
    from felixpy.bpf import objcache
    from felixpy.bpf.worker import WorkerLoader

    cache = objcache.cache_dir()  # the compile cache's directory holds the policy bytecode cache too
    ensure_pin_root(pin_root)
    maps = MapSet(pin_root, sizes=sizes or {}).ensure()
    ids = IPSetIDAllocator()
    tcx_dir = tcx_pin_dir or default_tcx_pin_dir(pin_root)
    attacher = KernelAttacher(attach_type, tcx_dir, preamble_pin_dir=os.path.join(pin_root, PREAMBLE_PIN_DIR))
    return BPFKernel(maps=maps, programs=ProgramsMap(maps, pin_root, loader=WorkerLoader(pin_root)),
                     policies=PolicyPrograms(maps, ids, sources=PinnedSources(pin_root),
                                             bytecode_cache=PolicyBytecodeCache(cache) if cache else None),
                     attacher=attacher, ipset_ids=ids, slots=slot_allocators(),
                     xdp=KernelXdpAttacher(attacher.nl))
