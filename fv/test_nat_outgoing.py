"""Outgoing NAT (an IP pool with ``masquerade``), in every mode, IPv4 and IPv6.

An outside namespace hangs off the node's ``eth2`` (10.96.0.0/24, fd00:96::/64; the node is .1/::1,
the outside .2/::2) and knows **only its own subnet**: a TCP connection from a workload to it can
complete only if the node rewrote the workload's source to its own address on that subnet.  So
"connects" proves MASQUERADE, and "does not connect" proves its absence.

* pool without masquerade: a → outside does not connect;
* pool with masquerade: a → outside connects; a → b (inside the pool) still shows b the real
  source — b admits only a's own address, so a translated source would be refused;
* masquerade off again: new connections to the outside fail again.

The *tables modes match ``masq-ipam-pools``/``all-ipam-pools`` in ``cali-nat-outgoing``; BPF mode's
programs mark the flow NAT_OUT from the routes map (source route flagged NAT_OUT, destination
outside every pool), keep it off the FIB redirect, and the rule matches the mark.  The pool and the
workloads' routes are sent as Felix's calc graph sends them (``IPAMPoolUpdate``, ``RouteUpdate``
with ``nat_outgoing``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from felixpy.testing import conncheck as cc
from felixpy.testing.topology import Outside
from fv.datastore import addr, datastore, nets, policy, workload
from fv.harness import FamilyView, FvNode
from fv.outside import WEB, pool_and_routes, pool_removal, serving_outside

PROBE_TIMEOUT, SLOW_TIMEOUT = 0.5, 2.0


@pytest.fixture(scope="module")
def outside(fvnode: FvNode) -> Iterator[Outside]:
    with serving_outside(fvnode, "eth2", "10.96.0", "fd00:96", default_routes=False) as out:
        yield out


def _connects(fv: FamilyView, cases: Sequence[tuple[str, str]]) -> dict[tuple[str, str], bool]:
    """TCP to WEB from workload ``src`` to ``dst_ip``; a miss gets one slower retry."""
    eps = fv.node.endpoints
    jobs = {c: (eps[c[0]].netns, c[1], cc.Probe("tcp", WEB)) for c in cases}
    got = cc.probe_all(jobs, PROBE_TIMEOUT)
    retry = {c: jobs[c] for c in cases if not got[c]}
    if retry:
        got.update(cc.probe_all(retry, SLOW_TIMEOUT))
    return got


def test_masquerading_pool_reaches_outside_with_the_node_address(fv: FamilyView, outside: Outside) -> None:
    v = fv.v
    b_only_from_a = policy("b-only-from-a", inbound=[{"action": "allow", "src_net": nets("a", v=v)}])
    state = datastore(policies=[b_only_from_a],
                      workloads=[workload("a"), workload("b", ingress=["b-only-from-a"]), workload("c")])
    fv.apply(state)
    out_ip, b_ip = outside.ip(v), addr("b", v)
    try:
        fv.node.send_payloads(pool_and_routes(v, masquerade=False))
        assert _connects(fv, [("a", out_ip), ("a", b_ip)]) == {("a", out_ip): False, ("a", b_ip): True}, \
            f"[{fv.mode} v{v}] without masquerade the outside must not be reachable (it has no route back)"

        fv.node.send_payloads(pool_and_routes(v, masquerade=True))
        got = _connects(fv, [("a", out_ip), ("c", out_ip), ("a", b_ip)])
        assert got == {("a", out_ip): True, ("c", out_ip): True, ("a", b_ip): True}, \
            f"[{fv.mode} v{v}] with masquerade: outside via the node's address, b sees a's own address: {got}"

        fv.node.send_payloads(pool_and_routes(v, masquerade=False))
        assert _connects(fv, [("a", out_ip)]) == {("a", out_ip): False}, \
            f"[{fv.mode} v{v}] masquerade turned off: new connections to the outside must fail again"
    finally:
        fv.node.send_payloads(pool_removal(v))
