"""The feed fuzzer against the real daemon in a namespace (issue #14 item 6, the live half).

A node with workloads a, b (its policy denies a) and c; then ``FUZZ_LIVE_EXAMPLES`` (40) hypothesis
streams from :mod:`tests/fuzz/feedfuzz.py` — generic hostile payloads and known-bad objects — each sent
on the live feed and applied (a barrier after each).  Left out are the payload kinds that legitimately
rewire the node itself (config, which restarts the daemon by design, host endpoints, routes, tunnels,
pools, host metadata, encapsulation and BGP settings): the manager-graph fuzz covers those.
Asserted: the daemon stays up, logs no traceback and no manager failure, and throughout a → b stays
blocked and a → c open in both families — the known-good endpoint keeps its policy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from fv.chaos.kill9 import world
from fv.expect import ICMP, TCP, Expect
from fv.harness import FvNode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from fuzz.feedfuzz import Bad, streams  # noqa: E402

pytestmark = pytest.mark.fv

EXAMPLES = int(os.environ.get("FUZZ_LIVE_EXAMPLES", "40"))
MODES = os.environ.get("FUZZ_LIVE_MODES", "nftables,iptables-legacy").split(",")
NODE_LEVEL = (pb.ConfigUpdate, pb.HostEndpointUpdate, pb.HostEndpointRemove, pb.RouteUpdate, pb.RouteRemove,
              pb.VXLANTunnelEndpointUpdate, pb.VXLANTunnelEndpointRemove, pb.IPAMPoolUpdate, pb.IPAMPoolRemove,
              pb.HostMetadataUpdate, pb.HostMetadataRemove, pb.Encapsulation, pb.GlobalBGPConfigUpdate,
              pb.WireguardEndpointUpdate, pb.WireguardEndpointRemove, pb.WireguardEndpointV6Update,
              pb.WireguardEndpointV6Remove, pb.InSync)


def _payloads(items: list[Any]) -> list[Any]:
    out = []
    for item in items:
        msg = item.msg if isinstance(item, Bad) else item
        if not isinstance(msg, NODE_LEVEL):
            out.append(msg)
    return out


@pytest.mark.parametrize("mode", MODES)
def test_live_daemon_survives_hostile_feeds_and_keeps_good_policy(mode: str) -> None:
    node = FvNode.create(mode)
    sent = [0]
    try:
        node.apply(world("g", 0))
        for v in (4, 6):
            node.check(v, Expect(True).block(src="a", dst="b"), (TCP, ICMP), names=["a", "b", "c"], what="before")

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(items=streams(huge=True, max_size=40))
        def check(items: list[Any]) -> None:
            payloads = _payloads(items)
            node.send_payloads([to_dataplane(0, p) for p in payloads])
            sent[0] += len(payloads)
            assert node.daemon is not None and node.daemon.alive(), node.log_tail(40)

        check()
        logs = node.daemon.logs() if node.daemon is not None else ""
        assert "Traceback" not in logs and "Manager failed" not in logs, logs[-4000:]
        for v in (4, 6):
            node.check(v, Expect(True).block(src="a", dst="b"), (TCP, ICMP), names=["a", "b", "c"],
                       what=f"after {sent[0]} hostile messages")
        print(f"[{mode}] live fuzz: {sent[0]} hostile messages in {EXAMPLES} streams; daemon up, policy kept")
    finally:
        node.close()
