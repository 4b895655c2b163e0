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

from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod
from felixpy.testing.topology import Outside
from fv.datastore import WORKLOADS, datastore, nets
from fv.harness import FamilyView, FvNode

pytestmark = [pytest.mark.fv, pytest.mark.bpf, pytest.mark.bpf_only]

WEB = 8080
POOLS = {4: "10.65.0.0/24", 6: "fd00:65::/64"}
BYPASS = {"BPFHostConntrackBypass": "true"}
# Not a BPFDataIfacePattern name: no programs on it, so what comes in from the outside takes the host stack.
UPLINK = "ext2"


@pytest.fixture(scope="module")
def outside(fvnode: FvNode) -> Iterator[Outside]:
    assert fvnode.node is not None
    out = fvnode.node.add_outside(UPLINK, "10.97.0", "fd00:97")
    servers = cc.Servers()
    try:
        servers.start(out.netns, tcp_ports=(WEB,), udp_ports=())
        yield out
    finally:
        servers.stop()
        fvnode.node.remove_outside(out)


def _pool(v: int, *, masquerade: bool) -> list[pb.ToDataplane]:
    msgs = [pb.ToDataplane(ipam_pool_update=pb.IPAMPoolUpdate(
        id="fv-pool", pool=pb.IPAMPool(cidr=POOLS[v], masquerade=masquerade)))]
    for name in WORKLOADS:
        (dst,) = nets(name, v=v)
        msgs.append(pb.ToDataplane(route_update=pb.RouteUpdate(
            types=pb.RouteType.LOCAL_WORKLOAD, ip_pool_type=pb.IPPoolType.NO_ENCAP, dst=dst,
            nat_outgoing=masquerade, local_workload=True)))
    return msgs


def _no_pool(v: int) -> list[pb.ToDataplane]:
    msgs = [pb.ToDataplane(ipam_pool_remove=pb.IPAMPoolRemove(id="fv-pool"))]
    msgs += [pb.ToDataplane(route_remove=pb.RouteRemove(dst=nets(n, v=v)[0])) for n in WORKLOADS]
    return msgs


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
    fv.node.send_payloads(_pool(v, masquerade=False))
    _conntrack(node_ns, v, dst, flush=True)
    assert _connect(fv, dst), f"[{fv.mode} v{v}] a -> outside must connect (outside routes back via the node)"
    assert _conntrack(node_ns, v, dst) >= 1, \
        f"[{fv.mode} v{v}] without the bypass the forwarded flow must be in Linux conntrack (else this proves nothing)"

    fv.apply(datastore(), config=BYPASS)
    fv.node.send_payloads(_pool(v, masquerade=False))
    _conntrack(node_ns, v, dst, flush=True)
    assert _connect(fv, dst), f"[{fv.mode} v{v}] with the bypass a -> outside must still connect"
    assert _conntrack(node_ns, v, dst) == 0, \
        f"[{fv.mode} v{v}] with BPFHostConntrackBypass the forwarded flow must not be in Linux conntrack"

    fv.apply(datastore(), config={**BYPASS, "BPFForceTrackPacketsFromIfaces": f"docker+,{UPLINK[:-1]}+"})
    fv.node.send_payloads(_pool(v, masquerade=False))
    _conntrack(node_ns, v, dst, flush=True)
    assert _connect(fv, dst)
    assert _conntrack(node_ns, v, dst) >= 1, \
        f"[{fv.mode} v{v}] traffic from a BPFForceTrackPacketsFromIfaces interface must stay in Linux conntrack"
    fv.node.send_payloads(_no_pool(v))
    fv.apply(datastore())


def test_bypass_keeps_nat_outgoing_flows_tracked_so_masquerade_works(fv: FamilyView, outside: Outside) -> None:
    v = fv.v
    dst = outside.ip(v)
    fv.apply(datastore(), config=BYPASS)
    _set_default_route(outside, v, present=False)
    try:
        fv.node.send_payloads(_pool(v, masquerade=False))
        assert not _connect(fv, dst, tries=1), \
            f"[{fv.mode} v{v}] without masquerade the outside has no route back: must not connect"
        fv.node.send_payloads(_pool(v, masquerade=True))
        assert _connect(fv, dst), \
            f"[{fv.mode} v{v}] with the bypass a masqueraded flow must stay tracked and connect"
        assert _conntrack(fv.node.netns, v, dst) >= 1
    finally:
        fv.node.send_payloads(_no_pool(v))
        _set_default_route(outside, v, present=True)
        fv.apply(datastore())
