"""Backend switches with the real daemon: legacy → iptables-nft → nftables → legacy, each a restart.

A secured workload (b denies everything from a) is probed *continuously* from a — ICMP at 50 pps and TCP
connects in a loop, IPv4 and IPv6 — from before the first daemon starts programming until after the last
switch: not one denied packet may get through at any moment.  A control flow (a → c, allowed) runs
alongside, so a probe that could never succeed would be noticed.  After each switch the previous backend
holds nothing of ours and the matrix is what the policy says.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from felixpy.testing import netns as nsmod
from fv.datastore import HOST, datastore, nets, policy, workload
from fv.expect import ICMP, TCP, Expect
from fv.chaos.kill9 import TCPProber
from fv.harness import FvNode, Pinger

pytestmark = pytest.mark.fv

SEQUENCE = ["iptables-legacy", "iptables-nft", "nftables", "iptables-legacy"]


@pytest.fixture
def node() -> Iterator[FvNode]:
    n = FvNode.create(SEQUENCE[0])
    try:
        yield n
    finally:
        n.close()


def leftovers(node: FvNode, mode: str) -> list[str]:
    """Calico objects outside *mode*'s backend."""
    active = mode.split("-")[1] if mode.startswith("iptables") else None
    found = []
    for backend in ("legacy", "nft"):
        if backend == active:
            continue
        for six in ("", "6"):
            text = nsmod.run_in(node.netns, f"ip{six}tables-{backend}-save").stdout
            found += [f"{backend} v{6 if six else 4}: {ln}" for ln in text.splitlines() if "cali" in ln]
    tables = nsmod.run_in(node.netns, "nft", "list", "tables").stdout
    if mode != "nftables":
        found += [f"nft: {ln}" for ln in tables.splitlines() if ln.strip().endswith(" calico")]
    else:
        sets = nsmod.run_in(node.netns, "ipset", "list", "-name").stdout.split()
        found += [f"ipset: {s}" for s in sets if s.startswith("cali")]
    return found


def test_denied_traffic_never_gets_through_a_backend_switch(node: FvNode) -> None:
    state = datastore(policies=[policy("b-denies-a", inbound=[{"action": "deny", "src_net": nets("a")},
                                                              {"action": "allow"}])],
                      workloads=[workload("a"), workload("b", ingress=["b-denies-a"]), workload("c")])
    expect = Expect(True).block(src="a", dst="b")
    a = node.endpoints["a"]
    node.apply(state)  # first start of day (legacy)
    for v in (4, 6):
        node.check(v, expect, (TCP, ICMP), what=f"{SEQUENCE[0]} before the switches")
    denied = [Pinger(a.netns, node.endpoints["b"].ip(v)) for v in (4, 6)]
    control = [Pinger(a.netns, node.endpoints["c"].ip(v)) for v in (4, 6)]
    tcp = [TCPProber(a.netns, node.endpoints["b"].ip(v)) for v in (4, 6)]
    for t in tcp:
        t.start()
    try:
        for prev, mode in zip(SEQUENCE, SEQUENCE[1:]):
            node.stop_daemon()
            node.mode = mode
            node.apply(state)  # a new daemon in the new mode, a new feed: start of day
            for v in (4, 6):
                node.check(v, expect, (TCP, ICMP), names=[HOST, "a", "b", "c"], what=f"{prev} → {mode}")
            left = leftovers(node, mode)
            assert not left, f"{prev} → {mode} left {len(left)} objects behind:\n" + "\n".join(left[:20])
    finally:
        for t in tcp:
            t.stop()
        results = [p.stop() for p in denied]
        controls = [p.stop() for p in control]
    for v, (sent, received, summary) in zip((4, 6), results):
        assert sent > 50, f"IPv{v}: the denied-flow pinger hardly ran: {summary}"
        assert received == 0, f"IPv{v}: denied ICMP a → b got through during the switches: {summary}"
    for v, t in zip((4, 6), tcp):
        assert t.tries > 10 and t.got_through == 0, \
            f"IPv{v}: denied TCP a → b got through {t.got_through} of {t.tries} times during the switches"
    for v, (sent, received, summary) in zip((4, 6), controls):
        assert received > sent // 2, f"IPv{v}: the allowed control flow a → c barely passed: {summary}"
