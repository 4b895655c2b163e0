"""Stateful in-memory stand-ins for the BPF kernel bundle: every map a
:class:`~felixpy.bpf.fake.FakeMap` (hash / LPM / prog-array semantics, E2BIG when full, failure
injection), program "fds" that are just numbers with program ids, and an attach layer that keeps
which program is on which (interface, hook) and can be told to fail.  The driver code that runs
over these is the production code; only the kernel is replaced.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from felixpy.bpf import progtag
from felixpy.bpf.build import PREAMBLE_FUNC, Program, Variant
from felixpy.bpf.errors import BPFSyscallError
from felixpy.bpf.hook import ProgramsMap
from felixpy.bpf.ipsets import IPSetIDAllocator
from felixpy.bpf.fake import FakeMap, InlineExecutor
from felixpy.bpf.maps import ALL_SPECS, Map, MapSet, MapSpec
from felixpy.bpf.policyload import PolicyPrograms
from felixpy.bpf.polsource import MemorySources, SourceStore
from felixpy.bpf.syscall import ProgInfo
from felixpy.drivers.bpfendpoints.attacher import HOOKS, NETKIT_FEATURE, AttachRequest
from felixpy.drivers.bpfendpoints.kernel import BPFKernel, slot_allocators
from felixpy.drivers.bpfendpoints.xdp import ForeignXdpProgram
from felixpy.errors import UnsupportedFeature


_MAP_FDS = itertools.count(1 << 20)  # far from the program fds (FakePrograms counts from 1000)


class FakeKernelMap(FakeMap):
    """A FakeMap with the attributes MapSet users read from a real :class:`Map`: an fd of its own, as
    each real map has (generated code embeds it, and the bytecode cache tells maps apart by it)."""

    def __init__(self, spec: MapSpec) -> None:
        super().__init__(spec)
        self.fd = next(_MAP_FDS)
        self.fail_updates: int | None = None  # errno for every set() until cleared

    def set(self, key: Any, value: Any, flags: int = 0) -> None:
        if self.fail_updates is not None:
            raise BPFSyscallError("BPF_MAP_UPDATE_ELEM", self.fail_updates)
        super().set(key, value, flags)

    def close(self) -> None:
        pass


@dataclass
class FakePrograms:
    """Program fds and ids: every load gets a fresh fd and a fresh kernel program id."""

    _fds: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    ids: dict[int, int] = field(default_factory=dict)  # fd -> program id
    names: dict[int, str] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    tags: dict[int, str] = field(default_factory=dict)  # fd -> "code" (equal for the same program text, any maps)
    loads: int = 0
    build: str = "v1"  # bump to make every later load different code (an upgrade)
    fail_next_load: int | None = None  # errno for the next load (one-shot)
    load_threads: list[tuple[str, str]] = field(default_factory=list)  # each load: program name, its thread

    # What the kernel reports of each fd (``info``): program type, the tag of its instructions and the
    # maps they use.  A prog-array slot of the fakes holds the fd it was given, so that number is the
    # program's id as slots and ``info`` show it; ``fd_by_id`` opens a new fd to the same program.
    types: dict[int, int] = field(default_factory=dict)
    ktags: dict[int, bytes] = field(default_factory=dict)
    map_ids: dict[int, tuple[int, ...]] = field(default_factory=dict)
    origin: dict[int, int] = field(default_factory=dict)  # fd from fd_by_id -> the program's first fd

    def load(self, prog_type: int, insns: bytes, *, name: str = "", **_: object) -> int:
        self.load_threads.append((name, threading.current_thread().name))
        if self.fail_next_load is not None:
            err, self.fail_next_load = self.fail_next_load, None
            raise BPFSyscallError("BPF_PROG_LOAD", err)
        fd = next(self._fds)
        self.ids[fd] = fd + 50000
        self.names[fd] = name
        self.tags[fd] = f"{self.build}:{name}:{progtag.masked(insns).hex()}"  # (which maps: map_ids)
        self.types[fd] = prog_type
        # The kernel's tag of these instructions, unless ``build`` says the code is another version's.
        other_version = b"" if self.build == "v1" else f"{self.build}:".encode()
        self.ktags[fd] = hashlib.sha256(other_version + progtag.masked(insns)).digest()[:progtag.TAG_SIZE]
        self.map_ids[fd] = tuple(progtag.map_fds(insns))
        self.loads += 1
        return fd

    def fd_by_id(self, prog_id: int) -> int:
        first = self.origin.get(prog_id, prog_id)
        if first not in self.ids:
            raise BPFSyscallError("BPF_PROG_GET_FD_BY_ID", errno.ENOENT)
        fd = next(self._fds)
        self.origin[fd] = first
        self.ids[fd], self.names[fd], self.tags[fd] = self.ids[first], self.names[first], self.tags[first]
        self.types[fd], self.ktags[fd], self.map_ids[fd] = self.types[first], self.ktags[first], self.map_ids[first]
        return fd

    def info(self, fd: int) -> ProgInfo:
        return ProgInfo(self.types[fd], self.origin.get(fd, fd), self.ktags[fd], 0, self.names[fd],
                        self.map_ids[fd])

    def close(self, fd: int) -> None:
        self.closed.add(fd)

    def live(self) -> set[int]:
        return set(self.ids) - self.closed


@dataclass
class _FakeLoaded:
    fds: dict[str, int]

    def fd(self, func: str) -> int:
        return self.fds[func]


@dataclass
class FakeAttacher:
    """Which preamble fd is on each (ifindex, hook); ``fail_ifaces`` makes attach raise.  It
    outlives a simulated restart (:meth:`FakeBPF.restarted`), as attachments and pins do."""

    progs: FakePrograms = field(default_factory=FakePrograms)
    attached: dict[tuple[int, int], int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    fail_ifaces: set[str] = field(default_factory=set)
    attach_calls: int = 0
    kinds: dict[str, str] = field(default_factory=dict)  # what learn_kind was told

    def learn_kind(self, iface: str, kind: str | None) -> None:
        if kind is None:
            self.kinds.pop(iface, None)
        else:
            self.kinds[iface] = kind

    def attach(self, iface: str, ifindex: int, hook: int, prog_fd: int) -> None:
        self.attach_calls += 1
        if self.kinds.get(iface) == "netkit":  # as the kernel attacher: this kernel has no netkit
            raise UnsupportedFeature(NETKIT_FEATURE, "netkit devices are not supported")
        if iface in self.fail_ifaces:
            raise OSError(errno.EBUSY, f"injected attach failure on {iface}")
        self.attached[(ifindex, hook)] = prog_fd
        self.names[ifindex] = iface

    def attach_many(self, requests: Sequence[AttachRequest], *,
                    while_running: Callable[[], None] | None = None) -> dict[str, Exception]:
        if while_running is not None:
            while_running()  # as the tc -batch child: the caller's work runs while the attach does
        failed: dict[str, Exception] = {}
        for r in requests:
            if r.iface not in failed:
                try:
                    self.attach(r.iface, r.ifindex, r.hook, r.prog_fd)
                except Exception as e:
                    failed[r.iface] = e
        return failed

    def detach(self, iface: str, ifindex: int) -> None:
        for hook in HOOKS:
            self.attached.pop((ifindex, hook), None)

    def is_attached(self, iface: str, ifindex: int, hook: int) -> bool:
        return (ifindex, hook) in self.attached

    def is_current(self, iface: str, ifindex: int, hook: int, prog_fd: int) -> bool:
        have = self.attached.get((ifindex, hook))
        return have is not None and self.progs.tags.get(have) == self.progs.tags.get(prog_fd)

    def sweep(self, existing: dict[str, int]) -> None:
        # As in the kernel, an attachment to an interface that is gone (by name, or re-created with a
        # new ifindex) is gone too.
        for ifindex, hook in list(self.attached):
            if existing.get(self.names.get(ifindex, "")) != ifindex:
                del self.attached[(ifindex, hook)]

    def sweep_candidates(self, existing: dict[str, int]) -> set[str]:
        # As a qdisc listing would: only interfaces that carry something.
        return {n for n, i in existing.items() if any((i, h) in self.attached for h in HOOKS)}

    def mode(self, iface: str) -> str:
        return "tcx"

    def ifaces(self) -> set[str]:
        return {self.names[i] for i, _h in self.attached}


@dataclass
class FakeXdpAttacher:
    """Which preamble fd is on each interface's XDP hook; ``foreign`` interfaces run someone else's
    XDP program (never replaced), ``fail_ifaces`` make attach raise.  Outlives a simulated restart."""

    progs: FakePrograms
    attached: dict[int, int] = field(default_factory=dict)  # ifindex -> preamble fd
    foreign: set[int] = field(default_factory=set)
    fail_ifaces: set[str] = field(default_factory=set)
    attach_calls: int = 0

    def attach(self, iface: str, ifindex: int, prog_fd: int) -> None:
        self.attach_calls += 1
        if ifindex in self.foreign:
            raise ForeignXdpProgram(errno.EBUSY, f"{iface} runs an XDP program felixpy did not attach")
        if iface in self.fail_ifaces:
            raise OSError(errno.EOPNOTSUPP, f"injected XDP attach failure on {iface}")
        self.attached[ifindex] = prog_fd

    def detach(self, iface: str, ifindex: int) -> None:
        self.attached.pop(ifindex, None)

    def is_attached(self, iface: str, ifindex: int) -> bool:
        return ifindex in self.attached

    def is_current(self, iface: str, ifindex: int, prog_fd: int) -> bool:
        have = self.attached.get(ifindex)
        return have is not None and self.progs.tags.get(have) == self.progs.tags.get(prog_fd)


@dataclass
class FakeBPF:
    kernel: BPFKernel
    progs: FakePrograms
    attacher: FakeAttacher
    xdp: FakeXdpAttacher

    def map(self, name: str) -> FakeKernelMap:
        return cast(FakeKernelMap, self.kernel.maps[name])

    def restarted(self) -> FakeBPF:
        """A new process's bundle over the same kernel: the pinned maps, the loaded programs and the
        attachments stay; the process state (generic-program layout, policy program cache, slot
        allocators) starts empty, and every program is loaded again with a new fd and id."""
        return _bundle(self.kernel.maps, self.progs, self.attacher, self.xdp, self.kernel.policies.sources)


def fake_kernel(sizes: dict[str, int] | None = None) -> FakeBPF:
    sizes = sizes or {}
    fake_maps = {s.name: FakeKernelMap(s.sized(sizes.get(s.name, min(s.max_entries, 4096)))
                                       if s.name not in ("cali_jump_ing2", "cali_jump_egr2") else s)
                 for s in ALL_SPECS}
    maps = MapSet("fake", maps=cast(dict[str, Map], fake_maps))
    progs = FakePrograms()
    return _bundle(maps, progs, FakeAttacher(progs), FakeXdpAttacher(progs))


def _bundle(maps: MapSet, progs: FakePrograms, attacher: FakeAttacher, xdp: FakeXdpAttacher,
            sources: SourceStore | None = None) -> FakeBPF:

    def loader(variant: Variant, _pin_root: str) -> _FakeLoaded:
        funcs = ([PREAMBLE_FUNC[variant.program]] if variant.program in PREAMBLE_FUNC
                 else list(variant.subprogs.values()))
        return _FakeLoaded({f: progs.load(0, b"", name=f) for f in funcs})

    ids = IPSetIDAllocator()
    kernel = BPFKernel(maps=maps, programs=ProgramsMap(maps, "fake", loader=loader),
                       policies=PolicyPrograms(maps, ids, prog_load=progs.load, close_fd=progs.close,
                                               prog_fd_by_id=progs.fd_by_id, prog_info=progs.info,
                                               map_id=lambda fd: fd, sources=sources or MemorySources(),
                                               writer=InlineExecutor(),  # (sources written when flushed)
                                               load_threads=1,  # (loads, and injected failures, in order)
                                               # ``build`` is the code's version: its generator too.
                                               generator=lambda: f"fake-{progs.build}"),
                       attacher=attacher, ipset_ids=ids, slots=slot_allocators(), xdp=xdp,
                       xdp_metadata=lambda: True)  # (a test makes it False: the kernels that refuse it)
    return FakeBPF(kernel, progs, attacher, xdp)
