"""The generic prog arrays and where each variant's sub-programs sit in them.

Felix's ``hook.ProgramsMap``: each compiled variant (:class:`~felixpy.bpf.build.Variant`) is
loaded at most once; its sub-programs are put at the next free slots of the hook's generic prog
array (``cali_progs_ing2`` / ``cali_progs_egr2`` / ``xdp_cali_progs3``, monotonic allocation)
and a :class:`Layout` maps each *logical* index (``defs.ProgIndex``; debug builds at +11) to its
*physical* slot.  The layout is what goes into ``globals.jumps[]``.

Restart: a new process starts a fresh allocation over the same pinned arrays; slots are
overwritten in place.  (Felix re-pins the old arrays under ``old_jumps/`` so attached preambles
keep running on the old chain until re-attached; the endpoint manager does that.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from felixpy.bpf import build, defs
from felixpy.bpf.build import EpType, Program, Variant
from felixpy.bpf.maps import MapSet


@dataclass(frozen=True, slots=True)
class Layout:
    slots: tuple[tuple[int, int], ...]  # (logical index, physical slot)

    def as_dict(self) -> dict[int, int]:
        return dict(self.slots)

    def merged(self, other: Layout) -> Layout:
        d = self.as_dict()
        d.update(other.as_dict())
        return Layout(tuple(sorted(d.items())))

    def slot(self, idx: int) -> int:
        return self.as_dict()[idx]


@dataclass
class ProgramsMap:
    maps: MapSet
    pin_root: str
    _next: dict[int, int] = field(default_factory=lambda: {defs.HOOK_TC_INGRESS: 0,
                                                           defs.HOOK_TC_EGRESS: 0,
                                                           defs.HOOK_XDP: 0})
    _layouts: dict[Variant, Layout] = field(default_factory=dict)
    _preambles: dict[int, int] = field(default_factory=dict)
    # How variants get compiled and loaded: in this process (build.load_variant, the default)
    # or in a short-lived worker (felixpy.bpf.worker.WorkerLoader) to keep LLVM out of the
    # daemon.  Either returns an object with .fd(func).
    loader: Callable[[Variant, str], Any] = build.load_variant

    def layout(self, variant: Variant) -> Layout:
        """Load ``variant`` (compiling it if this process has not) and place its sub-programs."""
        got = self._layouts.get(variant)
        if got is not None:
            return got
        loaded = self.loader(variant, self.pin_root)
        pm = self.maps.progs(variant.hook)
        offset = defs.PROG_INDEX_DEBUG_OFFSET if variant.debug else 0
        slots: list[tuple[int, int]] = []
        for idx, func in variant.subprogs.items():
            slot = self._next[variant.hook]
            if slot >= pm.spec.max_entries:
                raise RuntimeError(f"generic prog array for hook {variant.hook} is full")
            self._next[variant.hook] = slot + 1
            pm.set(slot, loaded.fd(func))
            slots.append((int(idx) + offset, slot))
        lay = Layout(tuple(sorted(slots)))
        self._layouts[variant] = lay
        return lay

    def prefetch_tc(self, ep: EpType, families: list[bool], debug: bool = False) -> None:
        """Compile (in one worker run, when the loader batches) every TC variant and preamble an
        attach point of ``ep`` needs for ``families`` (key: v6), before the first layout call."""
        prefetch = getattr(self.loader, "prefetch", None)
        if prefetch is None:
            return
        want = [Variant(Program.TC, hook, ep, v6, dbg) for hook in (defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS)
                for v6 in families for dbg in ((False, True) if debug else (False,))]
        want += [Variant(Program.TC_PREAMBLE, hook, EpType.WEP)
                 for hook in (defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS) if hook not in self._preambles]
        prefetch([v for v in want if v not in self._layouts])

    def tc_layout(self, hook: int, ep: EpType, v6: bool, debug: bool) -> Layout:
        """Fast-path layout, merged with the debug one when ``debug``."""
        lay = self.layout(Variant(Program.TC, hook, ep, v6, False))
        if debug:
            lay = lay.merged(self.layout(Variant(Program.TC, hook, ep, v6, True)))
        return lay

    def xdp_layout(self, v6: bool, debug: bool) -> Layout:
        """XDP has no log filter: an interface runs either the fast or (at debug level) only
        the debug objects; the preamble falls back from jumps[MAIN] to jumps[MAIN_DEBUG]."""
        return self.layout(Variant(Program.XDP, defs.HOOK_XDP, EpType.HEP, v6, debug))

    def xdp_continuations(self, v6: bool, debug: bool) -> tuple[int, int]:
        """(allowed slot, drop slot) an XDP policy program tail-calls."""
        lay = self.xdp_layout(v6, debug)
        off = defs.PROG_INDEX_DEBUG_OFFSET if debug else 0
        return lay.slot(defs.ProgIndex.ALLOWED + off), lay.slot(defs.ProgIndex.DROP + off)

    def preamble_fd(self, hook: int) -> int:
        """The preamble for a hook: one program serves every interface (per-interface values
        come from the attach-point globals map)."""
        fd = self._preambles.get(hook)
        if fd is None:
            prog = Program.XDP_PREAMBLE if hook == defs.HOOK_XDP else Program.TC_PREAMBLE
            v = Variant(prog, hook, EpType.HEP if hook == defs.HOOK_XDP else EpType.WEP)
            loaded = self.loader(v, self.pin_root)
            fd = loaded.fd(build.PREAMBLE_FUNC[prog])
            self._preambles[hook] = fd
        return fd
