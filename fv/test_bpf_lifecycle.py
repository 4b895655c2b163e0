"""BPF mode over time with the real daemon: restarts, a stopped daemon, and switches between BPF mode and the
*tables modes (each a restart with the new config).

Probed with TCP and UDP (the ICMP side of BPF mode is the FV suite's).  A secured workload
(b denies everything from a) is probed *continuously* from a, IPv4 and IPv6, across every restart and
switch: not one denied connection may get through at any moment.  The node's bpffs is the test's own
(``FvNode.bpffs``), so pins outlive a stopped daemon as they do on a real node.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator

import pytest

from felixpy.bpf import attach as bpfattach
from felixpy.bpf import defs
from felixpy.bpf import syscall as sc
from felixpy.bpf.maps import OWNED_PREFIXES
from felixpy.bpf.owned import is_owned_prog_name
from felixpy.testing import bpfpins
from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod
from fv.chaos.kill9 import TCPProber
from fv.datastore import HOST, datastore, iface, nets, policy, workload
from fv.expect import TCP, UDP, Expect
from fv.harness import BPF_ATTACH, BPF_MODES, FvNode, Pinger
from fv.test_backend_switch import leftovers as tables_leftovers

pytestmark = [pytest.mark.fv, pytest.mark.bpf]

BPF = "bpf-legacy"
STATE = datastore(policies=[policy("b-denies-a", inbound=[{"action": "deny", "src_net": nets("a")},
                                                          {"action": "allow"}])],
                  workloads=[workload("a"), workload("b", ingress=["b-denies-a"]), workload("c")])
EXPECT = Expect(True).block(src="a", dst="b")
PROBES = (TCP, UDP)
NAMES = [HOST, "a", "b", "c"]
POLICY_CHAIN = re.compile(r"^:(cali-pi-|cali-po-|cali-pri-|cali-pro-|cali-tw-|cali-fw-|cali-gi-|cali-go-)")
HOOKS = (defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS)


@pytest.fixture
def node() -> Iterator[FvNode]:
    pytest.importorskip("bcc")
    n = FvNode.create(BPF)
    try:
        yield n
    finally:
        n.close()


def tcx_links(node: FvNode) -> dict[str, tuple[int, int]]:
    """The preambles' attachments: with TCX the link pins in the node's bpffs, pin name → (link id,
    program id); with clsact (FELIXPY_FV_BPF_ATTACH=TC) ``<iface>_<hook>`` → (0, the filter's program id)."""
    assert node.bpffs is not None
    if BPF_ATTACH == "TC":
        return {f"{name}_{hook}": (0, ids[-1]) for (name, hook), ids in node.bpf_programs().items()}
    return bpfpins.tcx_links(os.path.join(node.bpffs, "tcx"))


def _prog_name(prog_id: int) -> str:
    fd = sc.prog_get_fd_by_id(prog_id)
    try:
        return sc.prog_info(fd).name
    finally:
        os.close(fd)


def bpf_objects(node: FvNode) -> list[str]:
    """Everything of BPF mode on the node: map pins, TCX link pins, our programs on any interface's hooks."""
    assert node.bpffs is not None
    found = [f"pin {os.path.relpath(os.path.join(d, f), node.bpffs)}" for d, _s, fs in os.walk(node.bpffs)
             for f in fs if f.startswith(OWNED_PREFIXES) or os.path.basename(d) == "tcx"]
    links = nsmod.run_in(node.netns, "ip", "-o", "link", "show").stdout
    names = [m.group(1) for m in re.finditer(r"^\d+: ([^:@]+)", links, re.M)]
    with nsmod.entered(node.netns):
        for name in names:
            idx = socket.if_nametoindex(name)
            for hook in HOOKS:
                found += [f"tc filter {name}/{hook}: {f}" for f in bpfattach.tc_filters(idx, hook)
                          if is_owned_prog_name(bpfattach.filter_prog_name(f))]
                found += [f"tcx {name}/{hook}: {p}" for p in bpfattach.tcx_programs(idx, hook)
                          if is_owned_prog_name(_prog_name(p))]
    return found


def bpf_mode_leftovers(node: FvNode) -> list[str]:
    """What the *tables modes left that BPF mode (iptables-legacy) does not keep."""
    found = []
    for six in ("", "6"):
        text = nsmod.run_in(node.netns, f"ip{six}tables-legacy-save").stdout
        found += [f"legacy v{6 if six else 4}: {ln}" for ln in text.splitlines() if POLICY_CHAIN.match(ln)]
        text = nsmod.run_in(node.netns, f"ip{six}tables-nft-save").stdout
        found += [f"nft v{6 if six else 4}: {ln}" for ln in text.splitlines() if "cali" in ln]
    tables = nsmod.run_in(node.netns, "nft", "list", "tables").stdout
    found += [f"nft: {ln}" for ln in tables.splitlines() if ln.strip().endswith(" calico")]
    sets = nsmod.run_in(node.netns, "ipset", "list", "-name").stdout.split()
    found += [f"ipset: {s}" for s in sets if s.startswith("cali")]
    return found


def check_all(node: FvNode, what: str) -> None:
    for v in (4, 6):
        node.check(v, EXPECT, PROBES, names=NAMES, what=what)


def test_restart_keeps_flows_policy_and_attachments_and_a_stopped_daemon_stays_closed(node: FvNode) -> None:
    node.apply(STATE)
    check_all(node, "BPF mode, first start")
    a = node.endpoints["a"]
    conns = [cc.Connection(a.netns, node.endpoints["c"].ip(v), TCP.port) for v in (4, 6)]
    probers = [TCPProber(a.netns, node.endpoints["b"].ip(v)) for v in (4, 6)]
    for p in probers:
        p.start()
    try:
        for c in conns:
            assert c.exchange(), "a fresh connection a → c does not echo"
        links = tcx_links(node)
        want = {f"{iface(n)}_{d}" for n in ("a", "b", "c") for d in ("ingress", "egress")}
        assert want <= set(links), f"TCX link pins missing: {sorted(want - set(links))}"

        node.stop_daemon()
        for c in conns:
            assert c.exchange(), "an established connection broke while the daemon was down"
        check_all(node, "daemon stopped")
        assert tcx_links(node) == links, "a stopped daemon's attachments changed"
        node.add_unknown_workload("d")
        for v in (4, 6):
            node.check(v, Expect(True).block(src="a", dst="b").block(src="d").block(dst="d"), PROBES, names=[*NAMES, "d"],
                       what="unknown cali veth, daemon stopped")

        restart_s = node.apply(STATE)  # a new daemon, the same feed: start of day
        node.timings.setdefault("bpf restart", []).append(restart_s)
        print(f"BPF restart with the same feed: {restart_s:.2f}s to programmed")
        for c in conns:
            assert c.exchange(), "an established connection broke across the restart"
        assert tcx_links(node) == links, "the restart re-attached preambles (link or program ids changed)"
        check_all(node, "after the restart")
        for v in (4, 6):
            node.check(v, Expect(True).block(src="a", dst="b").block(src="d").block(dst="d"), PROBES, names=[*NAMES, "d"],
                       what="unknown cali veth, after the restart")
        for c in conns:
            assert c.exchange(), "an established connection broke after the restart"
    finally:
        for p in probers:
            p.stop()
        for c in conns:
            c.close()
        node.remove_extra_workload("d")
    for v, p in zip((4, 6), probers):
        assert p.tries > 10 and p.got_through == 0, \
            f"IPv{v}: denied TCP a → b got through {p.got_through} of {p.tries} times across the restart"


SEQUENCES = {
    # Both directions against both *tables backends.
    "bpf-both-ways": ["iptables-legacy", BPF, "nftables", BPF, "iptables-legacy"],
    # The reliability harness's chain (issue 14 item 5).
    "every-backend": ["iptables-legacy", "iptables-nft", "nftables", BPF, "iptables-legacy"],
}


@pytest.mark.parametrize("sequence", list(SEQUENCES))
def test_switches_between_bpf_and_tables_modes_leave_nothing_and_stay_closed(sequence: str) -> None:
    """Each step a restart in the new mode, with the same datastore."""
    pytest.importorskip("bcc")
    SEQUENCE = SEQUENCES[sequence]
    node = FvNode.create(SEQUENCE[0])
    try:
        node.apply(STATE)
        check_all(node, SEQUENCE[0])
        a = node.endpoints["a"]
        probers = [TCPProber(a.netns, node.endpoints["b"].ip(v)) for v in (4, 6)]
        control = [Pinger(a.netns, node.endpoints["c"].ip(v)) for v in (4, 6)]
        for p in probers:
            p.start()
        try:
            for prev, mode in zip(SEQUENCE, SEQUENCE[1:]):
                node.stop_daemon()
                node.mode = mode
                node.apply(STATE)
                check_all(node, f"{prev} → {mode}")
                if mode in BPF_MODES:
                    left = bpf_mode_leftovers(node)
                    assert bpf_objects(node), "BPF mode attached nothing"
                else:
                    left = tables_leftovers(node, mode) + bpf_objects(node)
                assert not left, f"{prev} → {mode} left {len(left)} objects behind:\n" + "\n".join(left[:20])
        finally:
            for p in probers:
                p.stop()
            controls = [p.stop() for p in control]
        for v, p in zip((4, 6), probers):
            assert p.tries > 10 and p.got_through == 0, \
                f"IPv{v}: denied TCP a → b got through {p.got_through} of {p.tries} times during the switches"
        for v, (sent, received, summary) in zip((4, 6), controls):
            assert received > sent // 2, f"IPv{v}: the allowed control flow a → c barely passed: {summary}"
    finally:
        node.close()
