"""Benchmark/profiling hooks for a daemon started by bench/ (on ``PYTHONPATH`` only there, never installed).

* ``FELIXPY_BENCH_NFT_SHIM=child`` — nftables mode talks to ``nft`` as a child process per call
  (:class:`felixpy.drivers.nftables.shim.NftChildProcess`) instead of in-process libnftables; it replaces
  the name the wiring looks up, so the daemon's own code is untouched.
* ``FELIXPY_BENCH_TRACEMALLOC=PATH`` — trace Python allocations from the start; on ``SIGUSR2`` write the
  top allocation sites (by line, and by file) of what is held right now, plus the traced peak, to PATH.
  ``FELIXPY_BENCH_TRACEMALLOC_FRAMES=N`` keeps N frames a trace and adds the top tracebacks (slower).
* ``FELIXPY_BENCH_PYSPY=PATH`` — py-spy (next to the interpreter: ``.venv/bin/pip install py-spy``) samples
  this process from its start until it exits (100 Hz, all threads, non-blocking), raw collapsed stacks to
  PATH (``{pid}`` in it: this process's id, one profile a daemon): a profile of a daemon a benchmark starts itself.
  ``FELIXPY_BENCH_PYSPY_RATE=N`` samples N times a second instead; ``FELIXPY_BENCH_PYSPY_IDLE=1`` keeps the
  samples of threads that wait (py-spy's ``--idle``): what a step waits for, not only what runs.
* ``FELIXPY_BENCH_STEPTIMES=PATH`` — every apply appends one JSON line to PATH: its wall time and, for each
  step (``InternalDataplane._step``, and each background future the apply collects), when it started after
  the apply began and how long it ran, in milliseconds: where an apply's time goes, without a sampler;
  and the cyclic collector's passes during the apply (count and milliseconds, per generation).
* ``FELIXPY_BENCH_RSSTRACE=PATH`` — a thread samples this process's resident set every 5 ms during each
  apply; at the apply's end one JSON line goes to PATH: the samples as ``[ms since the apply began, RSS
  MiB, the foreground step running]``, thinned to the points where RSS moved by ≥ 1 MiB, plus the peak:
  where an apply's memory goes, step by step.
* ``FELIXPY_BENCH_CPUTRACE=PATH`` — a thread reads every thread's CPU time (``/proc/self/task``) and each
  live child's (``/proc/<pid>/stat`` of the pids in ``/proc/self/task/*/children``) every 10 ms during
  each apply; at its end one JSON line goes to PATH: per 50 ms of the apply, the CPU milliseconds of each
  thread (by its Python name) and of the children (by command), plus the foreground step running at the
  bucket's end: which work shares the two CPUs when, and whether the loop's thread waits or runs.
* ``FELIXPY_BENCH_TMSTEPS=PATH`` — tracemalloc across the steps of the process's first apply: after each
  step, the lines whose held bytes grew or shrank by ≥ 256 KiB since the step before, to PATH (which step
  builds the apply's peak, and from what; slow).
* ``FELIXPY_BENCH_CPROFILE=PATH`` — cProfile of every apply after this process's first three (a churn's,
  without the cold start or restart in it) to ``PATH.<pid>``, and of the table applies, which run on
  worker threads: nftables to ``PATH.table.<pid>``, iptables (one table at a time) to
  ``PATH.iptables.<pid>``; rewritten every 50 applies (``FELIXPY_BENCH_CPROFILE_EVERY``: every N).
* ``FELIXPY_BENCH_CPROFILE_SLOW=PATH`` — cProfile of every apply on the loop's thread; one that took at least
  ``FELIXPY_BENCH_CPROFILE_SLOW_MS`` (300) is written to ``PATH.<pid>.<n>``: a cold start's or a restart's
  apply, which ``FELIXPY_BENCH_CPROFILE`` leaves out.
* ``FELIXPY_BENCH_NFTLOG=DIR`` — in the nft transaction worker: every transaction's script to
  ``DIR/tx-<pid>-<n>.nft``, its libnftables time to ``DIR/times.jsonl``, and the whole ruleset once (at
  the 50th) to ``DIR/ruleset-<pid>.nft``, for replaying the transactions by hand against the same state.

The hooks that patch the apply (steps, RSS trace, cProfile) act in the daemon only (``-m felixpy run``): the
daemon's children (the save workers) inherit its environment, and importing ``felixpy.dataplane.core`` there
would add most of a second to a child that starts in ~50 ms, on the start of day's critical path.
"""

from __future__ import annotations

import os
import sys

_DAEMON = sys.orig_argv[1:4] == ["-m", "felixpy", "run"]


def _step_naming(state: dict, orig):  # type: ignore[no-untyped-def,type-arg]
    """A wrapper of ``InternalDataplane._step`` *orig* that keeps ``state["step"]`` naming the foreground
    step running (``after <step>`` between steps), for the samplers below."""
    def step(self, report, name, fn):  # type: ignore[no-untyped-def]
        state["step"] = name
        try:
            return orig(self, report, name, fn)
        finally:
            state["step"] = f"after {name}"
    return step

if os.environ.get("FELIXPY_BENCH_NFT_SHIM") == "child":
    import felixpy.drivers.nftables as _nft
    from felixpy.drivers.nftables.shim import NftChildProcess

    _nft.LibNftables = NftChildProcess  # type: ignore[misc,assignment]

_SPY = os.environ.get("FELIXPY_BENCH_PYSPY")
if _SPY:
    import subprocess
    import sys

    _idle = ["--idle"] if os.environ.get("FELIXPY_BENCH_PYSPY_IDLE") else []
    subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid", str(os.getpid()),
                      "--rate", os.environ.get("FELIXPY_BENCH_PYSPY_RATE", "100"), "--format", "raw",
                      "--nonblocking", "--threads", *_idle, "-o", _SPY.replace("{pid}", str(os.getpid()))],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

_TM = os.environ.get("FELIXPY_BENCH_TRACEMALLOC")
if _TM:
    import signal
    import tracemalloc
    from types import FrameType

    _TM_FRAMES = int(os.environ.get("FELIXPY_BENCH_TRACEMALLOC_FRAMES", "1"))
    tracemalloc.start(_TM_FRAMES)

    def _dump(_sig: int, _frame: FrameType | None) -> None:
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        cur, peak = tracemalloc.get_traced_memory()
        with open(_TM, "a") as f:
            f.write(f"## traced now {cur / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB\n")
            for kind in ("filename", "lineno"):
                f.write(f"### by {kind}\n")
                for stat in snap.statistics(kind)[:25]:
                    f.write(f"{stat.size / 2**20:8.2f} MiB {stat.count:9d} blocks  {stat.traceback[0]}\n")
            if _TM_FRAMES > 1:
                f.write("### by traceback\n")
                for stat in snap.statistics("traceback")[:12]:
                    f.write(f"{stat.size / 2**20:8.2f} MiB {stat.count:9d} blocks\n")
                    f.writelines(f"      {line}\n" for line in stat.traceback.format(most_recent_first=True))

    signal.signal(signal.SIGUSR2, _dump)

_STEPS = os.environ.get("FELIXPY_BENCH_STEPTIMES") if _DAEMON else None
if _STEPS:
    import json
    import time
    from concurrent.futures import Future, ThreadPoolExecutor
    from typing import Any, Callable

    from felixpy.dataplane import core as _core

    import gc

    _cur: list[Any] = []  # [t0, steps] of the apply in progress
    _gc: dict[str, Any] = {"t": 0.0, "passes": [0, 0, 0], "ms": [0.0, 0.0, 0.0]}

    def _on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _gc["t"] = time.perf_counter()
        elif _cur:
            g = info["generation"]
            _gc["passes"][g] += 1
            _gc["ms"][g] += (time.perf_counter() - _gc["t"]) * 1000

    gc.callbacks.append(_on_gc)

    _submit = ThreadPoolExecutor.submit

    def _timed_submit(self: ThreadPoolExecutor, fn: Callable[..., Any], /, *a: Any, **k: Any) -> Future[Any]:
        box: dict[str, float] = {}

        def run(*a2: Any, **k2: Any) -> Any:
            box["s"] = time.perf_counter()
            try:
                return fn(*a2, **k2)
            finally:
                box["e"] = time.perf_counter()

        fut = _submit(self, run, *a, **k)
        fut._fp_box = box  # type: ignore[attr-defined]
        return fut

    ThreadPoolExecutor.submit = _timed_submit  # type: ignore[method-assign]

    def _ms(x: float) -> float:
        return round(x * 1000, 2)

    _apply, _step, _collect = _core.InternalDataplane.apply, _core.InternalDataplane._step, \
        _core.InternalDataplane._collect

    def _timed_apply(self: Any) -> Any:
        t0 = time.perf_counter()
        _cur[:] = [t0, []]
        _gc["passes"], _gc["ms"] = [0, 0, 0], [0.0, 0.0, 0.0]
        try:
            return _apply(self)
        finally:
            line = {"at": time.time(), "ms": _ms(time.perf_counter() - t0), "steps": _cur[1],
                    "gc_passes": _gc["passes"], "gc_ms": [round(x, 1) for x in _gc["ms"]]}
            _cur.clear()
            with open(_STEPS, "a") as f:
                f.write(json.dumps(line) + "\n")

    def _timed_step(self: Any, report: Any, name: str, fn: Any) -> Any:
        s = time.perf_counter()
        try:
            return _step(self, report, name, fn)
        finally:
            if _cur:
                _cur[1].append([name, _ms(s - _cur[0]), _ms(time.perf_counter() - s)])

    def _timed_collect(self: Any, report: Any, futs: Any) -> Any:
        try:
            return _collect(self, report, futs)
        finally:
            for name, fut in futs:
                box = getattr(fut, "_fp_box", {})
                if _cur and "s" in box and "e" in box:
                    _cur[1].append([name, _ms(box["s"] - _cur[0]), _ms(box["e"] - box["s"])])

    _core.InternalDataplane.apply = _timed_apply  # type: ignore[method-assign]
    _core.InternalDataplane._step = _timed_step  # type: ignore[method-assign]
    _core.InternalDataplane._collect = _timed_collect  # type: ignore[method-assign]


_RSS = os.environ.get("FELIXPY_BENCH_RSSTRACE") if _DAEMON else None
if _RSS:
    import json as _json
    import threading as _threading
    import time as _time
    from typing import Any as _Any

    from felixpy.dataplane import core as _rcore

    _page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
    _state: dict[str, _Any] = {"on": False, "step": "", "t0": 0.0, "samples": []}

    def _rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _page_mib

    def _sampler() -> None:
        while True:
            if _state["on"]:
                _state["samples"].append([round((_time.perf_counter() - _state["t0"]) * 1000, 1),
                                          round(_rss_mib(), 1), _state["step"]])
            _time.sleep(0.005)

    _threading.Thread(target=_sampler, name="bench-rss", daemon=True).start()
    _rapply, _rstep = _rcore.InternalDataplane.apply, _rcore.InternalDataplane._step

    def _traced_apply(self: _Any) -> _Any:
        _state.update(on=True, step="", t0=_time.perf_counter(), samples=[])
        try:
            return _rapply(self)
        finally:
            _state["on"] = False
            samples, kept, last = _state["samples"], [], None
            for smp in samples:
                if last is None or abs(smp[1] - last) >= 1.0:
                    kept.append(smp)
                    last = smp[1]
            peak = max(samples, key=lambda x: x[1]) if samples else None
            with open(_RSS, "a") as f:
                f.write(_json.dumps({"at": _time.time(), "peak": peak, "samples": kept}) + "\n")

    _rcore.InternalDataplane.apply = _traced_apply  # type: ignore[method-assign]
    _rcore.InternalDataplane._step = _step_naming(_state, _rstep)  # type: ignore[method-assign]


_CPU = os.environ.get("FELIXPY_BENCH_CPUTRACE") if _DAEMON else None
if _CPU:
    import json as _cjson
    import threading as _cthreading
    import time as _ctime2
    from typing import Any as _CpAny

    from felixpy.dataplane import core as _cpcore

    _tick = os.sysconf("SC_CLK_TCK")
    _cst: dict[str, _CpAny] = {"on": False, "t0": 0.0, "step": "", "rows": []}

    def _stat_cpu_ms(path: str) -> tuple[str, float] | None:
        try:
            with open(path) as f:
                raw = f.read()
        except OSError:
            return None
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2:].split()
        return comm, (int(rest[11]) + int(rest[12])) * 1000 / _tick  # utime + stime

    def _cpu_now() -> dict[str, float]:
        names = {t.native_id: t.name for t in _cthreading.enumerate()}
        out: dict[str, float] = {}
        for tid in os.listdir("/proc/self/task"):
            got = _stat_cpu_ms(f"/proc/self/task/{tid}/stat")
            if got is not None:
                key = names.get(int(tid), f"tid{tid}").rstrip("_0123456789") or "thread"
                out[key] = out.get(key, 0.0) + got[1]
            try:
                with open(f"/proc/self/task/{tid}/children") as f:
                    kids = f.read().split()
            except OSError:
                kids = []
            for pid in kids:
                got = _stat_cpu_ms(f"/proc/{pid}/stat")
                if got is not None:
                    out[f"child:{got[0]}:{pid}"] = got[1]
        return out

    def _cpu_sampler() -> None:
        while True:
            if _cst["on"]:
                _cst["rows"].append((_ctime2.perf_counter() - _cst["t0"], _cst["step"], _cpu_now()))
            _ctime2.sleep(0.01)

    _cthreading.Thread(target=_cpu_sampler, name="bench-cpu", daemon=True).start()
    _cpapply, _cpstep = _cpcore.InternalDataplane.apply, _cpcore.InternalDataplane._step

    def _cpu_traced_apply(self: _CpAny) -> _CpAny:
        _cst.update(on=False, rows=[(0.0, "", _cpu_now())], step="")
        _cst.update(t0=_ctime2.perf_counter(), on=True)
        try:
            return _cpapply(self)
        finally:
            _cst["on"] = False
            rows = _cst["rows"] + [(_ctime2.perf_counter() - _cst["t0"], _cst["step"], _cpu_now())]
            buckets: list[dict[str, _CpAny]] = []
            prev = rows[0][2]
            edge = 0.05
            acc: dict[str, float] = {}
            for t, step, now in rows[1:]:
                for k, v in now.items():
                    d = v - prev.get(k, 0.0 if k.startswith("child:") else v)
                    if d > 0:
                        name = k.rsplit(":", 1)[0] if k.startswith("child:") else k
                        acc[name] = acc.get(name, 0.0) + d
                prev = {**prev, **now}
                if t >= edge or (t, step, now) == rows[-1]:
                    buckets.append({"to_ms": round(t * 1000), "step": step,
                                    "cpu_ms": {k: round(v) for k, v in sorted(acc.items()) if v >= 1}})
                    acc = {}
                    while edge <= t:
                        edge += 0.05
            with open(_CPU, "a") as f:
                f.write(_cjson.dumps({"at": _ctime2.time(), "ms": round(rows[-1][0] * 1000),
                                      "buckets": buckets}) + "\n")

    _cpcore.InternalDataplane.apply = _cpu_traced_apply  # type: ignore[method-assign]
    _cpcore.InternalDataplane._step = _step_naming(_cst, _cpstep)  # type: ignore[method-assign]


_CSLOW = os.environ.get("FELIXPY_BENCH_CPROFILE_SLOW") if _DAEMON else None
if _CSLOW:
    import cProfile as _cprof
    import time as _ctime
    from typing import Any as _CAny

    from felixpy.dataplane import core as _ccore

    _capply = _ccore.InternalDataplane.apply
    _cslow_ms = float(os.environ.get("FELIXPY_BENCH_CPROFILE_SLOW_MS", "300"))
    _cn = [0]

    def _slow_profiled_apply(self: _CAny) -> _CAny:
        prof = _cprof.Profile()
        t0 = _ctime.perf_counter()
        prof.enable()
        try:
            return _capply(self)
        finally:
            prof.disable()
            if (_ctime.perf_counter() - t0) * 1000 >= _cslow_ms:
                _cn[0] += 1
                prof.dump_stats(f"{_CSLOW}.{os.getpid()}.{_cn[0]}")

    _ccore.InternalDataplane.apply = _slow_profiled_apply  # type: ignore[method-assign]


_NFTLOG = os.environ.get("FELIXPY_BENCH_NFTLOG")
if _NFTLOG:
    # In the nft transaction worker (the only user of in-process libnftables the daemon starts): every
    # transaction's payload and the time libnftables took for it go to DIR, and once, at the 50th, the
    # whole ruleset as it stands, so the transactions can be replayed against the same state by hand.
    _nlog: str = _NFTLOG
    import json as _njson
    import subprocess as _nsub
    import time as _ntime
    from typing import Any as _NAny

    try:
        import nftables as _nftables  # type: ignore[import-untyped]
    except ImportError:
        _nftables = None
    if _nftables is not None:
        _ncmd = _nftables.Nftables.cmd
        _ncount = [0]

        def _logged_cmd(self: _NAny, text: str) -> _NAny:
            _ncount[0] += 1
            n = _ncount[0]
            if n == 50:
                with open(os.path.join(_nlog, f"ruleset-{os.getpid()}.nft"), "w") as f:
                    _nsub.run(["nft", "list", "ruleset"], stdout=f, check=False)
            t = _ntime.perf_counter()
            out = _ncmd(self, text)
            ms = (_ntime.perf_counter() - t) * 1000
            with open(os.path.join(_nlog, f"tx-{os.getpid()}-{n:05d}.nft"), "w") as f:
                f.write(text)
            with open(os.path.join(_nlog, "times.jsonl"), "a") as f:
                f.write(_njson.dumps({"pid": os.getpid(), "n": n, "ms": round(ms, 2), "bytes": len(text),
                                      "rc": out[0]}) + "\n")
            return out

        _nftables.Nftables.cmd = _logged_cmd


_CPROF = os.environ.get("FELIXPY_BENCH_CPROFILE") if _DAEMON else None
if _CPROF:
    # cProfile over the applies after this process's first three (so a restart's or a cold start's big
    # apply stays out of it): the steady state's applies alone, e.g. a churn's.  The table applies run on
    # worker threads, which a profile of the loop's thread does not see (cProfile is per thread): the
    # nftables tables and the iptables tables get a profile each, taken by one apply at a time.  The stats
    # go to PATH[.table|.iptables].<pid> every 50 applies of the loop (overwritten), readable with pstats.
    import cProfile as _cProfile
    import threading as _pthreading

    from felixpy.dataplane import core as _pcore
    from felixpy.drivers.iptables import table as _pitable
    from felixpy.drivers.nftables import table as _ptable

    _pn = [0]   # the loop's applies so far

    def _profile_applies(cls: type, suffix: str, *, counts: bool = False) -> None:
        prof = _cProfile.Profile()
        lock = _pthreading.Lock()
        orig = cls.apply  # type: ignore[attr-defined]

        def profiled(self: object) -> object:
            if counts:
                _pn[0] += 1
            if _pn[0] <= 3 or not lock.acquire(blocking=False):
                return orig(self)
            try:
                prof.enable()
                try:
                    return orig(self)
                finally:
                    prof.disable()
                    if _pn[0] % int(os.environ.get("FELIXPY_BENCH_CPROFILE_EVERY", "50")) == 0:
                        prof.dump_stats(f"{_CPROF}{suffix}.{os.getpid()}")
            finally:
                lock.release()

        cls.apply = profiled  # type: ignore[attr-defined]

    _profile_applies(_pcore.InternalDataplane, "", counts=True)
    _profile_applies(_ptable.NftablesTable, ".table")
    _profile_applies(_pitable.IptablesTable, ".iptables")


_TMSTEPS = os.environ.get("FELIXPY_BENCH_TMSTEPS")
if _TMSTEPS:
    # tracemalloc across the steps of the process's first apply (the cold start's or the restart's): after
    # each step, what is held now that was not after the one before, by line, largest first -- which step
    # builds the apply's peak, and from what.  Slow (a snapshot per step): for profiling only.
    import tracemalloc as _tm
    from typing import Any as _TAny

    from felixpy.dataplane import core as _tcore

    _tm.start(1)
    _tstate: dict[str, _TAny] = {"applies": 0, "prev": None}
    _tapply, _tstep = _tcore.InternalDataplane.apply, _tcore.InternalDataplane._step

    def _tm_note(name: str) -> None:
        snap = _tm.take_snapshot().filter_traces([_tm.Filter(False, _tm.__file__)])
        cur, peak = _tm.get_traced_memory()
        with open(_TMSTEPS, "a") as f:
            f.write(f"## after {name}: traced now {cur / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB\n")
            if _tstate["prev"] is not None:
                for st in snap.compare_to(_tstate["prev"], "lineno")[:12]:
                    if abs(st.size_diff) >= 256 * 1024:
                        f.write(f"{st.size_diff / 2**20:+8.2f} MiB {st.count_diff:+9d} blocks  {st.traceback[0]}\n")
        _tstate["prev"] = snap

    def _tm_apply(self: _TAny) -> _TAny:
        _tstate["applies"] += 1
        if _tstate["applies"] == 1:
            _tm_note("before the first apply")
        try:
            return _tapply(self)
        finally:
            if _tstate["applies"] == 1:
                _tm_note("the first apply")
                _tstate["prev"] = None

    def _tm_step(self: _TAny, report: _TAny, name: str, fn: _TAny) -> _TAny:
        try:
            return _tstep(self, report, name, fn)
        finally:
            if _tstate["applies"] == 1:
                _tm_note(name)

    _tcore.InternalDataplane.apply = _tm_apply  # type: ignore[method-assign]
    _tcore.InternalDataplane._step = _tm_step  # type: ignore[method-assign]
