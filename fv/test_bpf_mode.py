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

from felixpy.testing import netns as nsmod
from fv.datastore import EXTRA_WORKLOADS, HOST, WORKLOADS, datastore, iface, workload
from fv.expect import ICMP, TCP, UDP, Expect
from fv.harness import FamilyView

pytestmark = [pytest.mark.fv, pytest.mark.bpf, pytest.mark.bpf_only]


def _count_probes_arriving(netns: str, v: int) -> int:
    """Packets of the probes (TCP 8080, UDP 5353, ICMP echo request) that reached the workload's
    own INPUT, from the counters of rules this test put in the workload's namespace."""
    tool = "iptables-legacy" if v == 4 else "ip6tables-legacy"
    out = nsmod.run_in(netns, tool, "-w", "-L", "INPUT", "-v", "-n", "-x").stdout
    return sum(int(line.split()[0]) for line in out.splitlines()[2:] if line.strip())


def _watch_probes(netns: str, v: int) -> None:
    tool = "iptables-legacy" if v == 4 else "ip6tables-legacy"
    icmp = ["-p", "icmp", "--icmp-type", "echo-request"] if v == 4 else \
        ["-p", "ipv6-icmp", "--icmpv6-type", "echo-request"]
    for match in (["-p", "tcp", "--dport", str(TCP.port)], ["-p", "udp", "--dport", str(UDP.port)], icmp):
        nsmod.run_in(netns, tool, "-w", "-A", "INPUT", *match, "-j", "ACCEPT")


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
        d_ns = node.endpoints["d"].netns
        _watch_probes(d_ns, fv.v)
        fv.check(gap, (TCP, UDP, ICMP), names=[*WORKLOADS, "d"], what="d described, programs held back")
        # Not even one way: no other workload's probe reached d (a reply dropped on its way back
        # would hide that).  (The host's own packets do reach it, as in Felix: host -> workload is
        # never policed; d's replies are dropped, which the next check shows.)
        assert _count_probes_arriving(d_ns, fv.v) == 0, "probes reached the workload in the attach gap"
        fv.check(gap, (TCP, UDP, ICMP), names=everyone, what="d described, programs held back (host too)")
        node.hold_bpf_attach([])
        fv.apply(datastore(workloads=[workload(n) for n in [*WORKLOADS, "d"]]))  # the next apply attaches
        assert {(iface("d"), "ingress"), (iface("d"), "egress")} <= set(node.bpf_programs())
        fv.check(Expect(True), (TCP, UDP, ICMP), names=everyone, what="d attached")
        assert _count_probes_arriving(d_ns, fv.v) > 0, "the counters would prove nothing"
    finally:
        node.hold_bpf_attach([])
        node.remove_extra_workload("d")


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


DRIFT_CONFIG = {"RouteRefreshInterval": "2", "IpsetsRefreshInterval": "2", "PrometheusMetricsEnabled": "true",
                "PrometheusMetricsHost": "127.0.0.1", "PrometheusMetricsPort": "9091"}


def _drift_repairs(netns: str) -> dict[str, float]:
    import re
    import urllib.request

    with nsmod.entered(netns):
        with urllib.request.urlopen("http://127.0.0.1:9091/metrics", timeout=5) as r:
            text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^felixpy_drift_repairs\{kind="([a-z_]+)"\} (\S+)$', text, re.M)}


def test_bpf_drift_is_repaired_by_the_refresh_and_counted(fv: FamilyView) -> None:
    """A foreign hand detaches a's from-workload preamble (its TCX link), empties b's to-workload policy
    slot and deletes c's entry in the routes map (which the source check needs): each breaks that
    workload's traffic, fail closed; the next refresh (2 s here) puts all three back, the probes pass
    again, and ``felixpy_drift_repairs`` moves by exactly one of each BPF kind."""
    import ctypes
    import os
    import socket
    import time

    from felixpy.bpf import defs
    from felixpy.bpf import maptypes as mt
    from felixpy.bpf import syscall as sc
    from felixpy.bpf.attach import tcx_pin_path

    node, v = fv.node, fv.v
    assert node.bpffs is not None
    root = os.path.join(node.bpffs, "tc", "globals")
    fv.apply(datastore(), config=DRIFT_CONFIG)
    fv.check(Expect(True), (TCP, ICMP), what="before the drift")
    time.sleep(5)  # a refresh or two that finds nothing
    before = _drift_repairs(node.netns)

    def pinned(name: str) -> int:
        return sc.obj_get(os.path.join(root, name))

    if os.environ.get("FELIXPY_FV_BPF_ATTACH", "TCX").upper() == "TC":
        nsmod.run_in(node.netns, "tc", "filter", "del", "dev", iface("a"), "ingress")   # clsact: the filter goes
    else:
        link = sc.obj_get(tcx_pin_path(os.path.join(node.bpffs, "tcx"), iface("a"), defs.HOOK_TC_INGRESS))
        try:
            sc.link_detach(link)                   # the pin stays, the link is defunct (bpftool link detach)
        finally:
            os.close(link)
    with nsmod.entered(node.netns):
        idx_b = socket.if_nametoindex(iface("b"))
    fd = pinned("cali_iface4")
    try:
        raw = sc.map_lookup(fd, ctypes.c_uint32(idx_b).value.to_bytes(4, "little"), ctypes.sizeof(mt.IfStateValue))
    finally:
        os.close(fd)
    assert raw is not None
    st = mt.IfStateValue.from_buffer_copy(raw)
    entry = int(getattr(st, f"ingress_policy_v{v}"))  # the to-workload program, in cali_jump_egr
    fd = pinned("cali_jump_egr2")
    try:
        assert sc.map_delete(fd, entry.to_bytes(4, "little"))
    finally:
        os.close(fd)
    c_ip = node.endpoints["c"].ip(v)
    fd = pinned(f"cali_v{v}_routes")
    try:
        assert sc.map_delete(fd, bytes(mt.route_key(f"{c_ip}/{32 if v == 4 else 128}")))
    finally:
        os.close(fd)

    node.check(v, Expect(True), (TCP, ICMP), timeout=30, what="after the refresh repaired the drift")
    deadline = time.monotonic() + 10
    while True:
        after = _drift_repairs(node.netns)
        moved = {k: int(after.get(k, 0) - before.get(k, 0)) for k in after if after.get(k, 0) != before.get(k, 0)}
        if moved == {"bpf_attachment": 1, "bpf_policy": 1, "bpf_route": 1} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert moved == {"bpf_attachment": 1, "bpf_policy": 1, "bpf_route": 1}, moved
    if os.environ.get("FELIXPY_FV_BPF_ATTACH", "TCX").upper() != "TC":   # bpf_programs() lists TCX links
        assert (iface("a"), "ingress") in node.bpf_programs()
