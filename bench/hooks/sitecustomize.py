"""Benchmark/profiling hooks for a daemon started by bench/ (on ``PYTHONPATH`` only there, never installed).

* ``FELIXPY_BENCH_NFT_SHIM=child`` — nftables mode talks to ``nft`` as a child process per call
  (:class:`felixpy.drivers.nftables.shim.NftChildProcess`) instead of in-process libnftables; it replaces
  the name the wiring looks up, so the daemon's own code is untouched.
* ``FELIXPY_BENCH_TRACEMALLOC=PATH`` — trace Python allocations from the start; on ``SIGUSR2`` write the
  top allocation sites (by line, and by file) of what is held right now, plus the traced peak, to PATH.
* ``FELIXPY_BENCH_PYSPY=PATH`` — py-spy (next to the interpreter: ``.venv/bin/pip install py-spy``) samples
  this process from its start until it exits (100 Hz, all threads, non-blocking), raw collapsed stacks to
  PATH: a profile of a daemon a benchmark starts itself.
"""

from __future__ import annotations

import os

if os.environ.get("FELIXPY_BENCH_NFT_SHIM") == "child":
    import felixpy.drivers.nftables as _nft
    from felixpy.drivers.nftables.shim import NftChildProcess

    _nft.LibNftables = NftChildProcess  # type: ignore[misc,assignment]

_SPY = os.environ.get("FELIXPY_BENCH_PYSPY")
if _SPY:
    import subprocess
    import sys

    subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid", str(os.getpid()),
                      "--rate", "100", "--format", "raw", "--nonblocking", "--threads", "-o", _SPY],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

_TM = os.environ.get("FELIXPY_BENCH_TRACEMALLOC")
if _TM:
    import signal
    import tracemalloc
    from types import FrameType

    tracemalloc.start(1)

    def _dump(_sig: int, _frame: FrameType | None) -> None:
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        cur, peak = tracemalloc.get_traced_memory()
        with open(_TM, "a") as f:
            f.write(f"## traced now {cur / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB\n")
            for kind in ("filename", "lineno"):
                f.write(f"### by {kind}\n")
                for stat in snap.statistics(kind)[:25]:
                    f.write(f"{stat.size / 2**20:8.2f} MiB {stat.count:9d} blocks  {stat.traceback[0]}\n")

    signal.signal(signal.SIGUSR2, _dump)
