"""Loading generated policy programs and placing them in the policy jump maps.

What it owns: the policy programs (``p4i_<hash>``, ``p6e_<hash>_1``...) it loads, and the
policy-map slots it installs them in.  Identical policy means one program: programs are cached
by content (the :class:`PolicySet`, hook, family and the numeric ids of the IP sets it uses) and
reference counted; any number of endpoint slots may hold the same program.  A program is closed
when its last slot is released (the prog array keeps it alive while a slot still holds it).

How a fresh process recognises them: program names start ``p<4|6><i|e|x>_``; the per-endpoint
slot indices are recorded in ``cali_iface`` (by the endpoint manager) so a restart can reclaim
them.

Apply contract: :meth:`PolicyPrograms.install` writes part k at ``entry + k*stride`` and
deletes any higher parts a previous, larger program left behind, so a slot is always either
the old or the new program (prog-array updates are atomic per slot).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from felixpy.bpf import defs
from felixpy.bpf import syscall as sc
from felixpy.bpf.ipsets import IPSetIDAllocator
from felixpy.bpf.maps import MapSet
from felixpy.bpf.policy_ir import PolicySet
from felixpy.bpf.polprog import (
    DEFAULT_MAX_INSNS,
    DEFAULT_MAX_JUMPS,
    PolicyProgramBuilder,
    ProgramMaps,
    XdpSlots,
    log_filter_match_all,
)

log = structlog.get_logger(__name__)

_HOOK_CHAR = {defs.HOOK_TC_INGRESS: "i", defs.HOOK_TC_EGRESS: "e", defs.HOOK_XDP: "x"}


@dataclass
class PolicyProgram:
    key: tuple[object, ...]
    name: str
    fds: list[int]
    insn_counts: list[int]
    refs: int = 0
    gen_seconds: float = 0.0
    load_seconds: float = 0.0


@dataclass
class PolicyPrograms:
    maps: MapSet
    ipset_ids: IPSetIDAllocator = field(default_factory=IPSetIDAllocator)
    max_jumps: int = DEFAULT_MAX_JUMPS
    max_insns: int = DEFAULT_MAX_INSNS
    # Kernel access, injectable so drivers can be tested over in-memory fakes.
    prog_load: Callable[..., int] = sc.prog_load
    close_fd: Callable[[int], None] = os.close
    _cache: dict[tuple[object, ...], PolicyProgram] = field(default_factory=dict)
    _installed: dict[tuple[int, int], PolicyProgram] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=lambda: {"loads": 0, "hits": 0})

    # -- programs ------------------------------------------------------------------------------

    def _key(self, ps: PolicySet, hook: int, v6: bool, xdp: XdpSlots | None) -> tuple[object, ...]:
        ids = tuple(sorted((s, self.ipset_ids.get_or_alloc(s)) for s in ps.ip_sets()))
        return (ps, hook, v6, xdp, ids, self.max_jumps, self.max_insns)

    def acquire(self, ps: PolicySet, *, hook: int, v6: bool,
                xdp: XdpSlots | None = None) -> PolicyProgram:
        """The loaded program for ``ps`` (loading it unless an identical one is loaded);
        the caller owns one reference."""
        key = self._key(ps, hook, v6, xdp)
        prog = self._cache.get(key)
        if prog is not None:
            self.stats["hits"] += 1
            prog.refs += 1
            return prog
        t0 = time.perf_counter()
        progs_map = self.maps.progs(hook)
        jump_map = self.maps.jumps(hook)
        builder = PolicyProgramBuilder(
            ProgramMaps(self.maps.state.fd, self.maps.ipsets(v6).fd, progs_map.fd, jump_map.fd),
            self.ipset_ids.get_or_alloc, v6=v6, xdp=xdp, max_jumps=self.max_jumps,
            max_insns=self.max_insns)
        parts = builder.build(ps)
        t1 = time.perf_counter()
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:8]
        name = f"p{6 if v6 else 4}{_HOOK_CHAR[hook]}_{digest}"
        prog_type = sc.PROG_TYPE_XDP if hook == defs.HOOK_XDP else sc.PROG_TYPE_SCHED_CLS
        fds: list[int] = []
        try:
            for k, insns in enumerate(parts):
                fds.append(self.prog_load(prog_type, insns, name=name if k == 0 else f"{name}_{k}"))
        except Exception:
            for fd in fds:
                self.close_fd(fd)
            raise
        t2 = time.perf_counter()
        prog = PolicyProgram(key, name, fds, [len(p) // 8 for p in parts], 1, t1 - t0, t2 - t1)
        self._cache[key] = prog
        self.stats["loads"] += 1
        log.debug("policy program loaded", name=name, parts=len(parts),
                  insns=prog.insn_counts, gen_ms=round((t1 - t0) * 1e3, 2),
                  load_ms=round((t2 - t1) * 1e3, 2))
        return prog

    def num_loaded(self) -> int:
        """Distinct policy programs loaded now (identical policy sets share one)."""
        return len(self._cache)

    def release(self, prog: PolicyProgram) -> None:
        prog.refs -= 1
        if prog.refs <= 0:
            self._cache.pop(prog.key, None)
            for fd in prog.fds:
                self.close_fd(fd)
            prog.fds = []

    # -- slots ---------------------------------------------------------------------------------

    @staticmethod
    def stride(hook: int) -> int:
        return defs.XDP_POLICY_STRIDE if hook == defs.HOOK_XDP else defs.TC_POLICY_STRIDE

    def install(self, hook: int, entry: int, prog: PolicyProgram) -> None:
        """Put ``prog`` (already acquired by the caller, who hands over that reference) in the
        policy map slot ``entry`` of ``hook``; the previous occupant's reference is released."""
        jm = self.maps.jumps(hook)
        stride = self.stride(hook)
        old = self._installed.get((hook, entry))
        for k, fd in enumerate(prog.fds):
            jm.set(entry + k * stride, fd)
        if old is not None:
            for k in range(len(prog.fds), len(old.fds) or defs.MAX_POLICY_SUBPROGS):
                jm.delete(entry + k * stride)
            if old is not prog:
                self.release(old)
            else:
                prog.refs -= 1  # re-installing the same program: keep one reference
        self._installed[(hook, entry)] = prog

    def uninstall(self, hook: int, entry: int) -> None:
        jm = self.maps.jumps(hook)
        old = self._installed.pop((hook, entry), None)
        n = len(old.fds) if old is not None else 1
        for k in range(max(n, 1)):
            jm.delete(entry + k * self.stride(hook))
        if old is not None:
            self.release(old)

    def set_policy(self, ps: PolicySet, *, hook: int, entry: int, v6: bool,
                   xdp: XdpSlots | None = None) -> PolicyProgram:
        prog = self.acquire(ps, hook=hook, v6=v6, xdp=xdp)
        self.install(hook, entry, prog)
        return prog

    def installed(self, hook: int, entry: int) -> PolicyProgram | None:
        return self._installed.get((hook, entry))

    def loaded_programs(self) -> list[PolicyProgram]:
        return list(self._cache.values())

    # -- log filters ------------------------------------------------------------------------------

    def load_log_filter_all(self, hook: int) -> int:
        """Load the match-all log filter for ``hook``; returns its fd (caller owns it)."""
        insns = log_filter_match_all(self.maps.progs(hook).fd)
        return sc.prog_load(sc.PROG_TYPE_SCHED_CLS, insns, name="calico_log_filt")


@dataclass
class JumpMapAllocator:
    """Entry-slot allocator for a policy jump map (Felix's ``jumpMapAlloc``): TC entries
    0..9999, XDP 0..99; sub-program k of an entry lives at ``entry + k*stride``."""

    size: int = defs.TC_POLICY_STRIDE
    _free: list[int] = field(default_factory=list)
    _next: int = 0
    _owner: dict[int, str] = field(default_factory=dict)

    def get(self, owner: str) -> int:
        if self._free:
            idx = self._free.pop()
        elif self._next < self.size:
            idx = self._next
            self._next += 1
        else:
            raise RuntimeError("policy jump map exhausted")
        self._owner[idx] = owner
        return idx

    def assign(self, idx: int, owner: str) -> None:
        """Reclaim a known index (e.g. read back from cali_iface after a restart)."""
        if idx in self._owner:
            raise ValueError(f"index {idx} already owned by {self._owner[idx]}")
        self._owner[idx] = owner
        if idx in self._free:
            self._free.remove(idx)
        while self._next <= idx:
            if self._next != idx:
                self._free.append(self._next)
            self._next += 1

    def put(self, idx: int) -> None:
        if self._owner.pop(idx, None) is not None:
            self._free.append(idx)
