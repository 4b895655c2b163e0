"""What the FV scenarios with a network outside the cluster share: an outside namespace with a web
server hanging off one of the node's interfaces, and the IP pool the workloads' addresses are in, sent
as Felix's calc graph sends it (``IPAMPoolUpdate`` and the workloads' ``RouteUpdate``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod
from felixpy.testing.topology import Outside
from fv.datastore import WORKLOADS, nets
from fv.harness import FvNode

WEB = 8080
POOLS = {4: "10.65.0.0/24", 6: "fd00:65::/64"}
POOL_ID = "fv-pool"


@contextmanager
def serving_outside(fvnode: FvNode, iface: str, net4: str, net6: str, *,
                    default_routes: bool = True) -> Iterator[Outside]:
    """An outside namespace behind the node's *iface* (``net4``.0/24, ``net6``::/64) serving TCP ``WEB``;
    without *default_routes* it knows only its own subnet (a reply reaches a workload only if the node
    translated the workload's source)."""
    assert fvnode.node is not None
    out = fvnode.node.add_outside(iface, net4, net6)
    servers = cc.Servers()
    try:
        if not default_routes:
            for fam in ("-4", "-6"):
                nsmod.run_in(out.netns, "ip", fam, "route", "del", "default")
        servers.start(out.netns, tcp_ports=(WEB,), udp_ports=())
        yield out
    finally:
        servers.stop()
        fvnode.node.remove_outside(out)


def pool_and_routes(v: int, *, masquerade: bool = False) -> list[pb.ToDataplane]:
    """The FV pool (masquerading or not) and its local workloads' routes."""
    msgs = [pb.ToDataplane(ipam_pool_update=pb.IPAMPoolUpdate(
        id=POOL_ID, pool=pb.IPAMPool(cidr=POOLS[v], masquerade=masquerade)))]
    for name in WORKLOADS:
        (dst,) = nets(name, v=v)
        msgs.append(pb.ToDataplane(route_update=pb.RouteUpdate(
            types=pb.RouteType.LOCAL_WORKLOAD, ip_pool_type=pb.IPPoolType.NO_ENCAP, dst=dst,
            nat_outgoing=masquerade, local_workload=True)))
    return msgs


def pool_removal(v: int) -> list[pb.ToDataplane]:
    msgs = [pb.ToDataplane(ipam_pool_remove=pb.IPAMPoolRemove(id=POOL_ID))]
    msgs += [pb.ToDataplane(route_remove=pb.RouteRemove(dst=nets(n, v=v)[0])) for n in WORKLOADS]
    return msgs
