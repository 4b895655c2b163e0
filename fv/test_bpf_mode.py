"""BPF-mode-only FV scenarios (every *tables scenario also runs in the BPF modes: fv/conftest.py).

The attach gap: a workload interface the feed describes, up and routed, whose programs are not
attached yet (the daemon's test hook ``FELIXPY_TEST_HOLD_BPF_ATTACH`` holds the attach back
deterministically) receives nothing and sends nothing -- not through another workload's program
(``fib_approve`` refuses to ``bpf_redirect`` to an interface that is not READY in ``cali_iface``),
not through the host stack (``cali-to-wl-dispatch`` admits only interfaces with programs; the
FORWARD/INPUT rules drop workload traffic without the programs' SEEN mark).  Released, it works,
so the blocks were the gap's.

A restart with the same feed re-attaches nothing: the same program ids on every workload
interface's TC hooks before and after (the established-flow half of that scenario is
fv/test_lifecycle.py's, run in every mode).  Needs root, bcc and ``BCC_KERNEL_SOURCE`` (``scripts/bcc-headers.sh``).
"""

from __future__ import annotations

import pytest

from fv.datastore import EXTRA_WORKLOADS, HOST, WORKLOADS, datastore, iface, workload
from fv.expect import ICMP, TCP, UDP, Expect
from fv.harness import FamilyView

pytestmark = [pytest.mark.fv, pytest.mark.bpf, pytest.mark.bpf_only]


def test_attach_gap_interface_receives_nothing(fv: FamilyView) -> None:
    node = fv.node
    everyone = [HOST, *WORKLOADS, *EXTRA_WORKLOADS]
    gap = Expect(True).block(src="d").block(dst="d")
    fv.apply(datastore())
    try:
        node.add_unknown_workload("d")
        node.hold_bpf_attach([iface("d")])
        # d is described with the allow-all profile: only the missing programs keep it closed.
        fv.apply(datastore(workloads=[workload(n) for n in [*WORKLOADS, "d"]]))
        progs = node.bpf_programs()
        assert all((iface(n), h) in progs for n in WORKLOADS for h in ("ingress", "egress")), progs
        assert not any(name == iface("d") for name, _ in progs), f"d got programs despite the hold: {progs}"
        fv.check(gap, (TCP, UDP, ICMP), names=everyone, what="d described, programs held back")
        node.hold_bpf_attach([])
        fv.apply(datastore(workloads=[workload(n) for n in [*WORKLOADS, "d"]]))  # the next apply attaches
        assert {(iface("d"), "ingress"), (iface("d"), "egress")} <= set(node.bpf_programs())
        fv.check(Expect(True), (TCP, UDP, ICMP), names=everyone, what="d attached")
    finally:
        node.hold_bpf_attach([])
        node.remove_extra_workload("d")


@pytest.mark.xfail(strict=True, reason="restart recognition (re-using the attached preambles and the jump maps "
                   "they run on, reclaiming slots from cali_iface) is issue 12's restart slice (branch issue-12c): "
                   "today a fresh process loads new preambles and updates every TCX link to them")
def test_restart_with_same_feed_reattaches_nothing(fv: FamilyView) -> None:
    node = fv.node
    fv.apply(datastore())
    fv.check(Expect(True), (TCP, ICMP), what="before restart")
    before = node.bpf_programs()
    assert all((iface(n), h) in before for n in WORKLOADS for h in ("ingress", "egress")), before
    node.stop_daemon()
    assert node.bpf_programs() == before, "stopping the daemon detached programs (pins must keep them)"
    fv.apply(datastore())  # a new daemon, the same feed
    fv.check(Expect(True), (TCP, ICMP), what="after restart")
    assert node.bpf_programs() == before, "the restart re-attached BPF programs"
