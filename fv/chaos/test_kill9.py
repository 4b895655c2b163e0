"""kill -9 at random moments of a large change, per mode (see :mod:`fv.chaos.kill9`).

Quick by default (CI): ``CHAOS_TRIALS`` (2) trials per mode at ``CHAOS_ENDPOINTS`` (100) endpoints, seed
``CHAOS_SEED`` (1414).  ``make chaos`` runs the full counts.
"""

from __future__ import annotations

import os

import pytest

from fv.chaos.kill9 import Probes, TrialResult, kill9_attach_trial, kill9_trial, normalised_dump, world
from fv.expect import ICMP, TCP, Expect
from fv.harness import BPF_MODES, MODES, FvNode

pytestmark = pytest.mark.fv

TRIALS = int(os.environ.get("CHAOS_TRIALS", "2"))
ENDPOINTS = int(os.environ.get("CHAOS_ENDPOINTS", "100"))
SEED = int(os.environ.get("CHAOS_SEED", "1414"))


@pytest.mark.parametrize("mode", [*MODES, *(pytest.param(m, marks=pytest.mark.bpf) for m in BPF_MODES)])
def test_kill9_mid_change_converges_exactly_and_never_opens(mode: str) -> None:
    if mode in BPF_MODES:
        pytest.importorskip("bcc")
    a, b = world("x", ENDPOINTS), world("y", ENDPOINTS)
    node = FvNode.create(mode)
    results: list[TrialResult] = []
    breaches: list[str] = []
    try:
        first_s = node.apply(b)  # the very first start of day on a fresh kernel: the reference
        reference = normalised_dump(node)
        for v in (4, 6):
            node.check(v, Expect(True).block(src="a", dst="b"), (TCP,) if mode in BPF_MODES else (TCP, ICMP),
                       names=["host", "a", "b", "c"], what="reference")
        change_s = node.apply(a)  # how long a change of this size takes (B → A)
        for i in range(TRIALS):
            seed = SEED + i
            if i:
                node.apply(a)
            probes = Probes.start(node)
            try:
                results.append(kill9_trial(node, a, b, reference, change_s, seed))
            finally:
                breaches += [f"seed={seed}: {p}" for p in probes.stop()]
        if mode in BPF_MODES:  # and killed while attaching, after a *tables run removed every program
            node.apply(b)
            for i in range(max(1, TRIALS // 2)):  # each costs two BPF-mode starts
                seed = SEED + TRIALS + i
                probes = Probes.start(node)
                try:
                    results.append(kill9_attach_trial(node, b, reference, first_s, seed))
                finally:
                    breaches += [f"seed={seed} (attach): {p}" for p in probes.stop()]
    finally:
        node.close()
    failed = [r for r in results if not r.converged]
    summary = (f"[{mode}] {len(results)} trials at {ENDPOINTS} endpoints, seeds {SEED}..{SEED + len(results) - 1}: "
               f"{len(results) - len(failed)} converged exactly, {len(breaches)} probe breaches; restart→in sync "
               f"max {max((r.restart_s for r in results), default=0):.2f}s, → dump equal max "
               f"{max((r.converge_s for r in results), default=0):.2f}s")
    print(summary)
    assert not breaches, summary + "\n" + "\n".join(breaches)
    assert not failed, summary + "\n" + "\n".join(
        f"seed={r.seed} kill_after={r.kill_after:.3f}s:\n" + "\n".join(r.diff) for r in failed)
