"""FV fixtures: one node + daemon per dataplane mode, shared by every test of that mode.

* ``fvnode`` (session scope, parametrised over the *tables modes and the BPF modes): a node
  namespace with workloads a, b and c plugged in as CNI would, echo servers in
  each (and in the node itself, "host"), and the real daemon in the node.
  pytest groups the tests by mode, so each mode's node is built once and torn
  down (namespaces deleted, daemon stopped) before the next mode's — also when
  tests fail.
* ``fv`` (per test, parametrised over IPv4 and IPv6): the node seen through
  one IP family.  Each test states the whole datastore it needs with
  ``fv.apply(...)``; the node sends the difference on its feed, so tests don't
  depend on each other's leftovers.

BPF modes (``fv.harness.BPF_MODES``) run every scenario too; a test or module marked
``tables_only(reason)`` is about *tables state itself (the explain CLI reads it) or a feature BPF
mode leaves to another issue, and is skipped in BPF modes with that reason; ``bpf_skip(reason)``
skips a scenario in BPF modes with exactly its reason (a feature Felix's BPF mode lacks, or one
felixpy's has not ported yet, each saying which).  A check inside a
scenario that reads *tables state is skipped by the scenario itself (``fv.mode in BPF_MODES``).

A test that kills or stops the daemon leaves that to the node: the next
``apply`` starts a fresh one.  A daemon that *dies* during a test fails that
test (at teardown) with its log.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fv.harness import BPF_MODES, MODES, TIMINGS, FamilyView, FvNode

FAMILIES = (4, 6)
ALL_MODES = [*MODES, *(pytest.param(m, marks=pytest.mark.bpf) for m in BPF_MODES)]
_setup_times: dict[str, float] = {}


@pytest.fixture(scope="session", autouse=True)
def bpf_compile_cache() -> Iterator[str]:
    """FV daemons share one on-disk BPF compile cache for the session (a node keeps its cache across
    restarts too), in a temp dir: never the machine's /var/lib/felixpy.  Only the FV session's
    daemons see it (tests/ run with the cache off)."""
    before = os.environ.get("FELIXPY_BPF_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="fpy-bpfcache-") as d:
        os.environ["FELIXPY_BPF_CACHE_DIR"] = d
        try:
            yield d
        finally:
            if before is None:
                del os.environ["FELIXPY_BPF_CACHE_DIR"]
            else:
                os.environ["FELIXPY_BPF_CACHE_DIR"] = before


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tables_only(reason): not run in BPF modes (reason says why)")
    config.addinivalue_line("markers", "bpf_only: a BPF-mode scenario (deselected for the *tables modes)")
    config.addinivalue_line("markers", "bpf_skip(reason): skipped in BPF modes with exactly this reason")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        mode = callspec.params.get("fvnode") if callspec is not None else None
        if mode is not None and mode not in BPF_MODES and item.get_closest_marker("bpf_only"):
            drop.append(item)
            continue
        keep.append(item)
        skip = item.get_closest_marker("bpf_skip")
        if skip is not None and mode in BPF_MODES:
            item.add_marker(pytest.mark.skip(reason=skip.args[0] if skip.args else skip.kwargs["reason"]))
            continue
        mark = item.get_closest_marker("tables_only")
        if mark is None or mode not in BPF_MODES:
            continue
        reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
        item.add_marker(pytest.mark.skip(reason=f"not a BPF-mode scenario: {reason}"))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session", params=ALL_MODES)
def fvnode(request: pytest.FixtureRequest) -> Iterator[FvNode]:
    if request.param in BPF_MODES:
        pytest.importorskip("bcc")
    t0 = time.monotonic()
    node = FvNode.create(request.param)
    _setup_times[request.param] = time.monotonic() - t0
    try:
        yield node
    finally:
        node.close()


@pytest.fixture(params=FAMILIES, ids=[f"ipv{v}" for v in FAMILIES])
def fv(request: pytest.FixtureRequest, fvnode: FvNode) -> Iterator[FamilyView]:
    fvnode.check_daemon()
    yield FamilyView(fvnode, request.param)
    fvnode.check_daemon()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _setup_times:
        return
    tr = terminalreporter
    tr.section("fv timings")

    def stats(xs: list[float]) -> str:
        if not xs:
            return "-"
        xs = sorted(xs)
        return f"n={len(xs)} median {xs[len(xs) // 2] * 1000:.0f} ms, max {xs[-1] * 1000:.0f} ms"

    for mode, secs in _setup_times.items():
        t = TIMINGS.get(mode, {})
        tr.write_line(f"{mode}: node + daemon set up in {secs:.1f}s; feed batch → applied: {stats(t.get('apply', []))}; "
                      f"applied → matrix as expected: {stats(t.get('converge', []))}; "
                      f"daemon restart → in sync: {stats(t.get('restart', []))}")
