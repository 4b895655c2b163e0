"""The cyclic garbage collector paused around bulk work (an apply, a big transaction).

An apply allocates hundreds of thousands of short-lived objects (rendered rules, hashes, script
lines, parsed listings) that reference counting frees; the cyclic collector would still walk them,
and every few hundred thousand allocations walk everything the process holds in an oldest-generation
pass.  Measured at the large-node profile (docs/benchmarks.md, "Eighth pass"): ~0.45–0.57 s of
collector passes in one start-of-day apply (four oldest-generation passes of ~125 ms each), about a
tenth of a cold start and a sixth of a restart.  Pausing it while such work runs costs nothing but the
cycles made meanwhile, which wait for the first collection after it.

Pauses nest and may overlap across threads: the collector is disabled by the first pause to start
(if it was enabled then) and enabled again when the last one ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_reenable = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    global _depth, _reenable
    with _lock:
        if _depth == 0:
            _reenable = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _reenable:
                gc.enable()
