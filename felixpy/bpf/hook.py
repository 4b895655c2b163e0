"""The generic prog arrays and where each variant's sub-programs sit in them.

Felix's ``hook.ProgramsMap``: each compiled variant (:class:`~felixpy.bpf.build.Variant`) is
loaded at most once; its sub-programs are put in the hook's generic prog array
(``cali_progs_ing2`` / ``cali_progs_egr2`` / ``xdp_cali_progs3``) and a :class:`Layout` maps each
*logical* index (``defs.ProgIndex``; debug builds at +11) to its *physical* slot.  The layout is
what goes into ``globals.jumps[]``.

Restart: every variant has a **fixed** block of slots (:func:`variant_base_slot`: its position in
a canonical order of (endpoint type, family, debug) times the sub-program count), so the layout
does not depend on load order.  A restarted process loads the same variants (the same code) and
overwrites each slot in place with an equivalent program -- prog-array updates are atomic per
slot -- while the preambles already attached keep running with the globals they have, which name
the same slots.  (Felix instead re-pins the old arrays under ``old_jumps/`` and re-attaches every
preamble; a fixed layout makes that unnecessary.)
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


def variant_base_slot(variant: Variant) -> int:
    """The first generic prog-array slot of *variant*'s block (the same in every process)."""
    n = len(variant.subprogs)
    if variant.program is Program.XDP:
        order = int(variant.ipv6) * 2 + int(variant.debug)
    else:
        order = (list(EpType).index(variant.ep) * 2 + int(variant.ipv6)) * 2 + int(variant.debug)
    return order * n


@dataclass
class ProgramsMap:
    maps: MapSet
    pin_root: str
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
        base = variant_base_slot(variant)
        if base + len(variant.subprogs) > pm.spec.max_entries:
            raise RuntimeError(f"generic prog array for hook {variant.hook} is too small for {variant}")
        for k, (idx, func) in enumerate(variant.subprogs.items()):
            slot = base + k
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
