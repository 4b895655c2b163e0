"""Loading generated policy programs and placing them in the policy jump maps.

What it owns: the policy programs (``p4i_<hash>``, ``p6e_<hash>_1``...) it loads, and the
policy-map slots it installs them in.  Identical policy means one program: programs are cached
by content (the :class:`PolicySet`, hook, family and the numeric ids of the IP sets it uses) and
reference counted; any number of endpoint slots may hold the same program.  A program is closed
when its last slot is released (the prog array keeps it alive while a slot still holds it).

How a fresh process recognises them: program names start ``p<4|6><i|e|x>_``; the per-endpoint
slot indices are recorded in ``cali_iface`` (by the endpoint manager) so a restart can reclaim
them, and :meth:`PolicyPrograms.adopt` keeps a reclaimed slot's program when it is exactly the one
this process would load: its source (below) names this generator (:func:`generator_fingerprint`)
and the same input, and the kernel's tag and maps agree -- or, without such a source, the
instructions it would generate have the kernel's tag.

Each loaded program's *source* (:mod:`felixpy.bpf.polsource`: what it was built from) is kept beside
the pins for ``felixpy explain`` (which reads the kernel, never the daemon) and for a restart's
:meth:`PolicyPrograms.adopt`.  It is written before :meth:`PolicyPrograms.acquire` returns, i.e.
before any slot holds the program -- or, inside :meth:`PolicyPrograms.deferred_writes` (the endpoint
driver's apply), queued and written once the programs are in their slots, on the writer thread
(that method's docstring says why a restart in between keeps no wrong program) -- and removed when
the program is closed; :meth:`PolicyPrograms.sweep_sources` removes those an earlier run left once
this run has replaced its programs.

Generated instructions may come from the on-disk bytecode cache (:mod:`felixpy.bpf.polcache`, keyed
by the program's whole key and the generator's fingerprint): a fresh start with a warm cache loads
without generating.  Only parts the kernel loaded (or a restart found loaded) are stored.

Apply contract: :meth:`PolicyPrograms.install` writes part k at ``entry + k*stride`` and
deletes any higher parts a previous, larger program left behind, so a slot is always either
the old or the new program (prog-array updates are atomic per slot).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import structlog

from felixpy.bpf import defs, polcache, progtag
from felixpy.bpf import syscall as sc
from felixpy.bpf.ipsets import IPSetIDAllocator
from felixpy.bpf.maps import MapSet
from felixpy.bpf.errors import BPFSyscallError
from felixpy.bpf.policy_ir import PolicySet
from felixpy.bpf.polcache import PolicyBytecodeCache
from felixpy.bpf.polsource import (MemorySources, SourceStore, input_text, recorded_parts, source_doc)
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


def _prog_type(hook: int) -> int:
    return sc.PROG_TYPE_XDP if hook == defs.HOOK_XDP else sc.PROG_TYPE_SCHED_CLS


def _part_name(name: str, k: int) -> str:
    """The kernel name of part *k* of program *name* (``p4i_<hash>``, ``p4i_<hash>_1``, ...)."""
    return name if k == 0 else f"{name}_{k}"


# The modules whose code decides a policy program's instructions.
_GENERATOR_MODULES = ("felixpy.bpf.polprog", "felixpy.bpf.asm", "felixpy.bpf.policy_ir", "felixpy.bpf.defs",
                      "felixpy.bpf.maptypes", "felixpy.bpf.polsource", __name__)


@functools.cache
def generator_fingerprint() -> str:
    """A digest of the generator's source files: equal inputs and an equal fingerprint mean equal
    instructions (the generator reads nothing else: no kernel probe, no environment).  Empty when a
    file cannot be read; then no source is trusted and a restart compares generated instructions."""
    h = hashlib.sha256()
    try:
        for mod in _GENERATOR_MODULES:
            spec = importlib.util.find_spec(mod)
            if spec is None or spec.origin is None:
                return ""
            with open(spec.origin, "rb") as f:
                h.update(mod.encode() + b"\0" + f.read())
    except OSError:
        return ""
    return h.hexdigest()[:32]


_CacheEntry = tuple[str, list[bytes], ProgramMaps]  # a bytecode-cache entry to store: key, parts, their maps
_Ahead = tuple[str, list[int], float, "_CacheEntry | None", "Future[tuple[list[int], list[sc.ProgInfo], float]]"]
# A source to write: policy set, hook, v6, IP-set ids, instruction counts, kernel tags.
_PendingSource = tuple[PolicySet, int, bool, dict[str, int], list[int], list[bytes]]


@dataclass
class PolicyProgram:
    key: tuple[object, ...]
    name: str
    fds: list[int]
    insn_counts: list[int]
    refs: int = 0
    gen_seconds: float = 0.0
    load_seconds: float = 0.0
    ids: list[int] | None = None  # the kernel's program id per part (read when first needed)


@dataclass
class PolicyPrograms:
    maps: MapSet
    ipset_ids: IPSetIDAllocator = field(default_factory=IPSetIDAllocator)
    max_jumps: int = DEFAULT_MAX_JUMPS
    max_insns: int = DEFAULT_MAX_INSNS
    # Kernel access, injectable so drivers can be tested over in-memory fakes.
    prog_load: Callable[..., int] = sc.prog_load
    close_fd: Callable[[int], None] = os.close
    prog_fd_by_id: Callable[[int], int] = sc.prog_get_fd_by_id
    prog_info: Callable[[int], sc.ProgInfo] = sc.prog_info
    map_id: Callable[[int], int] = field(default=lambda fd: sc.map_info(fd).id)
    sources: SourceStore = field(default_factory=MemorySources)
    # Which generator wrote a source (the fakes stand in another version's code with their own).
    generator: Callable[[], str] = generator_fingerprint
    _cache: dict[tuple[object, ...], PolicyProgram] = field(default_factory=dict)
    _installed: dict[tuple[int, int], PolicyProgram] = field(default_factory=dict)
    # Generated instructions kept on disk (:mod:`felixpy.bpf.polcache`): None, every program is generated.
    bytecode_cache: PolicyBytecodeCache | None = None
    # The parts adopt() generated for a key it could not adopt: acquire() loads them, not a second build.
    _spare: tuple[tuple[object, ...], list[bytes], float, _CacheEntry | None] | None = None
    stats: dict[str, int] = field(default_factory=lambda: {"loads": 0, "hits": 0, "adopted": 0, "generated": 0,
                                                           "cached": 0})
    _map_ids: dict[tuple[int, bool], frozenset[int]] = field(default_factory=dict)
    # Inside deferred_writes(): sources (by program name) and cache entries not written yet.
    _defer_depth: int = 0
    _pending_sources: dict[str, _PendingSource] = field(default_factory=dict)
    _pending_cache: list[_CacheEntry] = field(default_factory=list)
    # Where loading_ahead() loads (``load_threads`` threads: the verifier runs on as many CPUs as load
    # at once), and where background flushes write (one thread: one writer at a time; the fakes write
    # inline, when flushed).  Made when first needed.
    load_threads: int = 2
    loader: Executor | None = None
    writer: Executor | None = None
    # Sources are written on the writer thread too: the names of the programs loaded now (a source is
    # written for these only), the pending sources and the source store are changed under this lock.
    _live: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _writing: Future[None] | None = None  # the last background flush
    # Inside loading_ahead(): key -> name, instruction counts, seconds generating, cache entry, the load.
    _ahead: dict[tuple[object, ...], _Ahead] = field(default_factory=dict)

    # -- programs ------------------------------------------------------------------------------

    def _key(self, ps: PolicySet, hook: int, v6: bool, xdp: XdpSlots | None) -> tuple[object, ...]:
        ids = tuple(sorted((s, self.ipset_ids.get_or_alloc(s)) for s in ps.ip_sets()))
        return (ps, hook, v6, xdp, ids, self.max_jumps, self.max_insns)

    def _build(self, key: tuple[object, ...], key_repr: str, ps: PolicySet, hook: int, v6: bool,
               xdp: XdpSlots | None) -> tuple[list[bytes], float, _CacheEntry | None]:
        """The program's parts for ``key`` (whose ``repr`` is *key_repr*), the seconds getting them
        took, and -- when they were generated and the bytecode cache is on -- the entry to store once
        the kernel took them (:meth:`_cache_later`): from the cache when it holds them, else generated."""
        if self._spare is not None and self._spare[0] == key:
            _key, parts, secs, entry = self._spare
            self._spare = None
            return parts, secs, entry
        t0 = time.perf_counter()
        pm = ProgramMaps(self.maps.state.fd, self.maps.ipsets(v6).fd, self.maps.progs(hook).fd,
                         self.maps.jumps(hook).fd)
        cache_key = None
        if self.bytecode_cache is not None:
            generator = self.generator()
            if generator:  # without a fingerprint nothing says the entry is this code's
                cache_key = polcache.entry_key(generator, key_repr)
                got = self.bytecode_cache.get(cache_key, pm)
                if got is not None:
                    self.stats["cached"] += 1
                    return got, time.perf_counter() - t0, None
        self.stats["generated"] += 1
        builder = PolicyProgramBuilder(pm, self.ipset_ids.get_or_alloc, v6=v6, xdp=xdp, max_jumps=self.max_jumps,
                                       max_insns=self.max_insns)
        parts = builder.build(ps)
        return parts, time.perf_counter() - t0, (None if cache_key is None else (cache_key, parts, pm))

    def _cache_later(self, entry: _CacheEntry | None) -> None:
        """Store a generated program's parts in the bytecode cache (inside :meth:`deferred_writes`:
        queue them) -- only parts the kernel loaded, or found loaded, reach the cache."""
        if entry is not None:
            self._pending_cache.append(entry)
            if not self._defer_depth:
                self.flush_deferred()

    @staticmethod
    def _name(key_repr: str, hook: int, v6: bool) -> str:
        digest = hashlib.sha256(key_repr.encode()).hexdigest()[:8]
        return f"p{6 if v6 else 4}{_HOOK_CHAR[hook]}_{digest}"

    def _ipset_ids(self, ps: PolicySet) -> dict[str, int]:
        return {s: self.ipset_ids.get_or_alloc(s) for s in ps.ip_sets()}

    def _write_source(self, name: str, ps: PolicySet, hook: int, v6: bool, counts: list[int],
                      tags: list[bytes]) -> None:
        """Write (inside :meth:`deferred_writes`: queue) the source of the loaded program *name*.  The
        IP-set ids are taken now, the ones the program was built with, however late it is written."""
        ids = self._ipset_ids(ps)
        if self._defer_depth:
            with self._lock:
                self._pending_sources[name] = (ps, hook, v6, ids, counts, tags)
            return
        blob = source_doc(ps, name=name, hook=hook, v6=v6, ipset_ids=ids, generator=self.generator(),
                          insn_counts=counts, tags=tags)
        with self._lock:
            self.sources.write(name, blob)

    @contextlib.contextmanager
    def deferred_writes(self, *, background: bool = False) -> Iterator[None]:
        """Within: loaded programs' sources and new bytecode-cache entries are queued, not written;
        :meth:`flush_deferred` writes them (call it where the caller waits anyway, e.g. while a ``tc``
        child attaches), and leaving the outermost block flushes whatever is left -- with *background*,
        on the writer thread while the caller goes on (:meth:`background_writes` is the future to
        join, :meth:`wait_for_writes` waits for it).

        Why this is safe for a restart: a source only says which instructions (by tag) a program
        of that name, generator and input has; :meth:`adopt` still compares the slot's program with
        it.  A restart in the window before the write finds no source (or an earlier run's for the
        same name, generator and input: the same tags) and generates and compares the instructions
        instead -- slower, never a wrong program kept.  A program released before its source was
        written drops the queued write with it (a background write checks, under the lock, that the
        program is still loaded).  Until the write, ``felixpy explain`` shows such a program without
        its policy, as it shows one whose source is missing."""
        self._defer_depth += 1
        try:
            yield
        finally:
            self._defer_depth -= 1
            if not self._defer_depth:
                self.flush_deferred(background=background)

    def flush_deferred(self, *, background: bool = False) -> None:
        """Write the queued sources and cache entries: now, or with *background* on the writer thread
        (the writes are Python and small syscalls: off the apply's path).
        Never raises: the programs already enforce, a missing source only costs a restart a
        generation (a failed write is queued again, for the next flush)."""
        with self._lock:
            pending, self._pending_sources = self._pending_sources, {}
        entries, self._pending_cache = self._pending_cache, []
        if not pending and not entries:
            return
        if background:
            if self.writer is None:
                self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bpf-policy-write")
            self._writing = self.writer.submit(self._write, pending, entries)
        else:
            self.wait_for_writes()  # (one writer at a time)
            self._write(pending, entries)

    def background_writes(self) -> Future[None] | None:
        """The last background flush (the writer runs them in order: when it is done, all are)."""
        return self._writing

    def wait_for_writes(self) -> None:
        """Wait until a background flush has written everything it took."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _write(self, pending: dict[str, _PendingSource], entries: list[_CacheEntry]) -> None:
        generator = self.generator() if pending else ""
        for name, item in pending.items():
            ps, hook, v6, ids, counts, tags = item
            try:
                blob = source_doc(ps, name=name, hook=hook, v6=v6, ipset_ids=ids, generator=generator,
                                  insn_counts=counts, tags=tags)
                with self._lock:
                    if name in self._live:  # (else released meanwhile: its source went with it)
                        self.sources.write(name, blob)
            except Exception as e:
                with self._lock:
                    if name in self._live and name not in self._pending_sources:
                        self._pending_sources[name] = item
                log.warning("Policy program source not written; will retry", program=name, error=str(e),
                            error_type=type(e).__name__)
        if self.bytecode_cache is not None:
            for key, parts, pm in entries:
                self.bytecode_cache.put(key, parts, pm)  # (logs its own failures; a miss regenerates)

    def _maps_of(self, hook: int, v6: bool) -> frozenset[int]:
        """The ids of the maps this process's programs for ``hook`` and family use."""
        got = self._map_ids.get((hook, v6))
        if got is None:
            fds = (self.maps.state.fd, self.maps.ipsets(v6).fd, self.maps.progs(hook).fd, self.maps.jumps(hook).fd)
            got = self._map_ids[(hook, v6)] = frozenset(self.map_id(fd) for fd in fds)
        return got

    def acquire(self, ps: PolicySet, *, hook: int, v6: bool,
                xdp: XdpSlots | None = None) -> PolicyProgram:
        """The loaded program for ``ps`` (loading it unless an identical one is loaded, or taking the
        one :meth:`loading_ahead` loads); the caller owns one reference."""
        key = self._key(ps, hook, v6, xdp)
        prog = self._cache.get(key)
        if prog is not None:
            self.stats["hits"] += 1
            prog.refs += 1
            return prog
        ahead = self._ahead.pop(key, None)
        if ahead is not None:
            name, counts, gen_seconds, cache_entry, loading = ahead
            fds, infos, load_seconds = loading.result()  # (a failed load raises here, for this caller)
        else:
            key_repr = repr(key)
            parts, gen_seconds, cache_entry = self._build(key, key_repr, ps, hook, v6, xdp)
            name = self._name(key_repr, hook, v6)
            counts = [len(p) // 8 for p in parts]
            fds, infos, load_seconds = self._load_parts(_prog_type(hook), parts, name)
        try:
            self._write_source(name, ps, hook, v6, counts, [i.tag for i in infos])
        except Exception:
            for fd in fds:
                self.close_fd(fd)
            raise
        prog = PolicyProgram(key, name, fds, counts, 1, gen_seconds, load_seconds, [i.id for i in infos])
        self._keep(prog)
        self._cache_later(cache_entry)
        self.stats["loads"] += 1
        log.debug("policy program loaded", name=name, parts=len(fds), insns=counts,
                  gen_ms=round(gen_seconds * 1e3, 2), load_ms=round(load_seconds * 1e3, 2))
        return prog

    def _keep(self, prog: PolicyProgram) -> None:
        """*prog* is loaded and cached: its source may be written (the writer thread cannot read
        ``_cache``, which the loop's thread changes, so the names are kept under the lock too)."""
        self._cache[prog.key] = prog
        with self._lock:
            self._live.add(prog.name)

    def _load_parts(self, prog_type: int, parts: list[bytes],
                    name: str) -> tuple[list[int], list[sc.ProgInfo], float]:
        """Load a program's parts; their fds, the kernel's info on each, and the seconds the loads took.
        Loads all or nothing (closes what it loaded when a part fails).  Called on a loader thread by
        :meth:`loading_ahead`: it touches nothing but the kernel (``prog_load``, ``prog_info``)."""
        t1 = time.perf_counter()
        fds: list[int] = []
        try:
            for k, insns in enumerate(parts):
                fds.append(self.prog_load(prog_type, insns, name=_part_name(name, k)))
            t2 = time.perf_counter()
            infos = [self.prog_info(fd) for fd in fds]
        except BaseException:
            for fd in fds:
                self.close_fd(fd)
            raise
        return fds, infos, t2 - t1

    @contextlib.contextmanager
    def loading_ahead(self, wanted: Iterable[tuple[PolicySet, int, bool]]) -> Iterator[int]:
        """Within: the TC programs *wanted* (policy set, hook, v6) that are not loaded yet are being
        loaded, in that order, on the loader threads, while the caller goes on; :meth:`acquire` takes
        each when it asks for it (waiting for its load if need be).  Yields how many are loading.

        Why: a program is generated (or read from the bytecode cache) in Python, holding the GIL, and
        loaded by ``BPF_PROG_LOAD``, whose verifier runs with the GIL released -- on another CPU, and
        two verifiers at once on two (a policy change's loads are most of its apply).  Generated here,
        all at once before the caller's loop, program k+1 is generated while the earlier ones are
        verified, and the caller's other writes (counters, globals) overlap the last loads.

        It changes no outcome, only when the work happens: a program is built exactly as
        :meth:`acquire` builds it (the same key, IP-set ids allocated in the same order when *wanted*
        follows the caller's order), its source and bytecode-cache entry are written only once it is
        acquired, a failed generation is left for :meth:`acquire` to repeat and raise for its caller,
        and a failed load is raised by the :meth:`acquire` that takes it.  Programs nobody acquired by
        the end are closed then.  One program alone is loaded by its :meth:`acquire` (nothing to overlap)."""
        todo: dict[tuple[object, ...], tuple[PolicySet, int, bool]] = {}
        for ps, hook, v6 in wanted:
            key = self._key(ps, hook, v6, None)
            if key not in self._cache and key not in self._ahead:
                todo.setdefault(key, (ps, hook, v6))
        if len(todo) < 2:
            yield 0
            return
        mine: list[tuple[object, ...]] = []
        try:
            for key, (ps, hook, v6) in todo.items():
                key_repr = repr(key)
                try:
                    parts, gen_seconds, entry = self._build(key, key_repr, ps, hook, v6, None)
                except Exception as e:  # acquire() builds it again and fails the endpoints that need it
                    log.debug("Policy program not generated ahead", error=str(e), error_type=type(e).__name__)
                    continue
                name = self._name(key_repr, hook, v6)
                loading = self._loader().submit(self._load_parts, _prog_type(hook), parts, name)
                self._ahead[key] = (name, [len(p) // 8 for p in parts], gen_seconds, entry, loading)
                mine.append(key)
            yield len(mine)
        finally:
            for key in mine:
                left = self._ahead.pop(key, None)
                if left is None:
                    continue  # acquired
                try:
                    fds, _infos, _secs = left[-1].result()
                except Exception:
                    continue  # (closed what it loaded)
                for fd in fds:
                    self.close_fd(fd)

    def _loader(self) -> Executor:
        if self.loader is None:
            self.loader = ThreadPoolExecutor(max_workers=self.load_threads, thread_name_prefix="bpf-prog-load")
        return self.loader

    def adopt(self, ps: PolicySet, *, hook: int, v6: bool, entry: int) -> bool:
        """At a restart: take over slot ``entry`` of ``hook`` as it is if it holds exactly the program
        this process would put there for ``ps`` -- every part, by name, type, tag and the ids of the
        maps it uses (this process's maps).  The program's source says which generator wrote it for
        which input, and each part's tag: when it names this generator and ``ps``'s input, nothing is
        generated; otherwise the instructions are generated and their tag (:mod:`felixpy.bpf.progtag`)
        compared.  Then nothing is loaded or written: the slot counts as installed, holding one
        reference.  Returns False, leaving the slot alone, on any difference (an earlier version's
        code, another policy, a part missing or extra) or if a program went away meanwhile; the
        caller installs then.  (TC hooks only: XDP slots are always installed afresh.)"""
        jm = self.maps.jumps(hook)
        stride = self.stride(hook)
        found: list[int] = []
        for k in range(defs.MAX_POLICY_SUBPROGS):
            got = jm.get(entry + k * stride)
            if got is None:
                break
            found.append(int(got.value) if hasattr(got, "value") else int(got))
        if not found:
            return False
        key = self._key(ps, hook, v6, None)
        prog = self._cache.get(key)
        if prog is not None:  # already adopted or loaded for another slot: this slot must hold that one
            if self._ids(prog) != found:
                return False
            prog.refs += 1
            self._installed[(hook, entry)] = prog
            return True
        key_repr = repr(key)
        name = self._name(key_repr, hook, v6)
        want = input_text(ps, name=name, hook=hook, v6=v6, ipset_ids=self._ipset_ids(ps))
        self.wait_for_writes()
        recorded = recorded_parts(self.sources.read(name), want, self.generator())
        gen_seconds = 0.0
        cache_entry: _CacheEntry | None = None
        if recorded is not None:
            counts, tags = recorded
            maps = self._maps_of(hook, v6)

            def same(k: int, info: sc.ProgInfo) -> bool:
                return info.tag == tags[k] and set(info.map_ids) <= maps
        else:
            parts, gen_seconds, cache_entry = self._build(key, key_repr, ps, hook, v6, None)
            self._spare = (key, parts, gen_seconds, cache_entry)
            counts = [len(p) // 8 for p in parts]

            def same(k: int, info: sc.ProgInfo) -> bool:
                return (info.tag in progtag.tags(parts[k])
                        and set(info.map_ids) == {self.map_id(fd) for fd in progtag.map_fds(parts[k])})
        if len(counts) != len(found):
            return False
        fds: list[int] = []
        tags_now: list[bytes] = []
        try:
            for k, prog_id in enumerate(found):
                try:
                    fds.append(self.prog_fd_by_id(prog_id))
                except BPFSyscallError:
                    return False  # replaced or unloaded since the slot was read
                info = self.prog_info(fds[-1])
                if info.type != sc.PROG_TYPE_SCHED_CLS or info.name != _part_name(name, k) or not same(k, info):
                    return False
                tags_now.append(info.tag)
            if recorded is None:
                self._write_source(name, ps, hook, v6, counts, tags_now)
            prog = PolicyProgram(key, name, fds, counts, 1, gen_seconds, 0.0, found)
        finally:
            if prog is None:
                for fd in fds:
                    self.close_fd(fd)
        self._spare = None
        self._keep(prog)
        self._installed[(hook, entry)] = prog
        self.stats["adopted"] += 1
        self._cache_later(cache_entry)  # generated and found loaded: the next fresh start loads it from disk
        return True

    def _ids(self, prog: PolicyProgram) -> list[int]:
        if prog.ids is None:
            prog.ids = [self.prog_info(fd).id for fd in prog.fds]
        return prog.ids

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
            with self._lock:
                self._live.discard(prog.name)
                self._pending_sources.pop(prog.name, None)
                self.sources.remove(prog.name)

    def sweep_sources(self) -> int:
        """Remove every source no program of this process has (an earlier run's); returns how many."""
        self.wait_for_writes()
        mine = {p.name for p in self._cache.values()}
        gone = 0
        for name in self.sources.names():
            if name not in mine:
                self.sources.remove(name)
                gone += 1
        return gone

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
    0..9999, XDP 0..99; sub-program k of an entry lives at ``entry + k*stride``.

    A restart assigns the reclaimed entries in ``cali_iface``'s order, not the entries' order, so an
    assign must not scan the free list: the list keeps the order entries are handed out in, the set
    says which of its entries are still free (an assigned one is skipped when popped)."""

    size: int = defs.TC_POLICY_STRIDE
    _free: list[int] = field(default_factory=list)
    _free_set: set[int] = field(default_factory=set)
    _next: int = 0
    _owner: dict[int, str] = field(default_factory=dict)

    def get(self, owner: str) -> int:
        while self._free:
            idx = self._free.pop()
            if idx in self._free_set:
                self._free_set.remove(idx)
                break
        else:
            if self._next >= self.size:
                raise RuntimeError("policy jump map exhausted")
            idx = self._next
            self._next += 1
        self._owner[idx] = owner
        return idx

    def assign(self, idx: int, owner: str) -> None:
        """Reclaim a known index (e.g. read back from cali_iface after a restart)."""
        if idx in self._owner:
            raise ValueError(f"index {idx} already owned by {self._owner[idx]}")
        self._owner[idx] = owner
        self._free_set.discard(idx)  # (left in the list: get() skips it)
        while self._next <= idx:
            if self._next != idx:
                self._put_free(self._next)
            self._next += 1

    def put(self, idx: int) -> None:
        if self._owner.pop(idx, None) is not None:
            self._put_free(idx)

    def _put_free(self, idx: int) -> None:
        self._free.append(idx)
        self._free_set.add(idx)
