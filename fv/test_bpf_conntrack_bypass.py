"""``BPFHostConntrackBypass`` in the BPF modes, IPv4 and IPv6: forwarded traffic the programs handle
stays out of Linux conntrack, and what Linux must track still is.

An outside namespace hangs off the node's ``ext2`` (as in fv/test_nat_outgoing.py, but a name outside
``BPFDataIfacePattern``, so no program runs on it and what comes in from the outside takes the host
stack: the workload's own packets leave by the programs' FIB redirect and never meet Linux
conntrack).  Workload ``a`` opens TCP connections to it; each scenario counts the node's Linux
conntrack entries for them (``conntrack -L`` in the node namespace):

* bypass off: the forwarded connection is in Linux conntrack (so the count can tell the two apart);
* bypass on: it is not -- raw ``cali-PREROUTING`` sent it to ``cali-untracked-flows``, which
  NOTRACKed it -- and it still connects (policy and the programs' own conntrack are unaffected);
  with the uplink in ``BPFForceTrackPacketsFromIfaces`` it is tracked again;
* bypass on, a masquerading pool and an outside with no route back: the connection completes only
  if MASQUERADE rewrote its source, which needs a Linux conntrack entry -- so the programs' NAT-out
  mark must have kept it tracked.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod
from felixpy.testing.topology import Outside
from fv.datastore import datastore
from fv.harness import FamilyView, FvNode
from fv.outside import WEB, pool_and_routes, pool_removal, serving_outside

pytestmark = [pytest.mark.fv, pytest.mark.bpf, pytest.mark.bpf_only]

BYPASS = {"BPFHostConntrackBypass": "true"}
# Not a BPFDataIfacePattern name: no programs on it, so what comes in from the outside takes the host stack.
UPLINK = "ext2"


@pytest.fixture(scope="module")
def outside(fvnode: FvNode) -> Iterator[Outside]:
    with serving_outside(fvnode, UPLINK, "10.97.0", "fd00:97") as out:
        yield out


def _conntrack(node_ns: str, v: int, peer: str, *, flush: bool = False) -> int:
    """Linux conntrack entries of the node for TCP to or from *peer*'s WEB port, either direction (the
    replies coming in from the outside are what the host stack sees)."""
    fam = "ipv4" if v == 4 else "ipv6"
    if flush:
        nsmod.run_in(node_ns, "conntrack", "-D", "-f", fam, "-p", "tcp", check=False)
        return 0
    out = nsmod.run_in(node_ns, "conntrack", "-L", "-f", fam, "-p", "tcp", check=False).stdout
    return sum(1 for line in out.splitlines()
               if f"src={peer} " in line and f"sport={WEB} " in line or f"dst={peer} " in line and f"dport={WEB} " in line)


def _connect(fv: FamilyView, dst: str, tries: int = 3) -> bool:
    src = fv.node.endpoints["a"].netns
    return any(cc.probe_all({0: (src, dst, cc.Probe("tcp", WEB))}, 1.0)[0] for _ in range(tries))


def _set_default_route(out: Outside, v: int, present: bool) -> None:
    fam = "-4" if v == 4 else "-6"
    via = out.node4 if v == 4 else out.node6
    nsmod.run_in(out.netns, "ip", fam, "route", "replace" if present else "del", "default", "via", via,
                 check=present)


def test_forwarded_flows_leave_linux_conntrack_only_with_the_bypass(fv: FamilyView, outside: Outside) -> None:
    v = fv.v
    node_ns, dst = fv.node.netns, outside.ip(v)
    fv.apply(datastore())
    fv.node.send_payloads(pool_and_routes(v, masquerade=False))
    _conntrack(node_ns, v, dst, flush=True)
    assert _connect(fv, dst), f"[{fv.mode} v{v}] a -> outside must connect (outside routes back via the node)"
    assert _conntrack(node_ns, v, dst) >= 1, \
        f"[{fv.mode} v{v}] without the bypass the forwarded flow must be in Linux conntrack (else this proves nothing)"

    fv.apply(datastore(), config=BYPASS)
    fv.node.send_payloads(pool_and_routes(v, masquerade=False))
    _conntrack(node_ns, v, dst, flush=True)
    assert _connect(fv, dst), f"[{fv.mode} v{v}] with the bypass a -> outside must still connect"
    assert _conntrack(node_ns, v, dst) == 0, \
        f"[{fv.mode} v{v}] with BPFHostConntrackBypass the forwarded flow must not be in Linux conntrack"

    fv.apply(datastore(), config={**BYPASS, "BPFForceTrackPacketsFromIfaces": f"docker+,{UPLINK[:-1]}+"})
    fv.node.send_payloads(pool_and_routes(v, masquerade=False))
    _conntrack(node_ns, v, dst, flush=True)
    assert _connect(fv, dst)
    assert _conntrack(node_ns, v, dst) >= 1, \
        f"[{fv.mode} v{v}] traffic from a BPFForceTrackPacketsFromIfaces interface must stay in Linux conntrack"
    fv.node.send_payloads(pool_removal(v))
    fv.apply(datastore())


def test_bypass_keeps_nat_outgoing_flows_tracked_so_masquerade_works(fv: FamilyView, outside: Outside) -> None:
    v = fv.v
    dst = outside.ip(v)
    fv.apply(datastore(), config=BYPASS)
    _set_default_route(outside, v, present=False)
    try:
        fv.node.send_payloads(pool_and_routes(v, masquerade=False))
        assert not _connect(fv, dst, tries=1), \
            f"[{fv.mode} v{v}] without masquerade the outside has no route back: must not connect"
        fv.node.send_payloads(pool_and_routes(v, masquerade=True))
        assert _connect(fv, dst), \
            f"[{fv.mode} v{v}] with the bypass a masqueraded flow must stay tracked and connect"
        assert _conntrack(fv.node.netns, v, dst) >= 1
    finally:
        fv.node.send_payloads(pool_removal(v))
        _set_default_route(outside, v, present=True)
        fv.apply(datastore())
