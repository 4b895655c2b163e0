"""Floods of endpoint/policy/IP-set updates on the live feed (see :mod:`fv.chaos.flood`), per mode.

CI size by default: ``FLOOD_SECONDS`` (5) at ``FLOOD_RATE`` (20,000) updates per second over
``FLOOD_POOL`` (300) endpoints, policies and sets; ``make chaos`` runs 60 s.  Asserted: the daemon stays
up and catches up; the throttle holds applies to Felix's leaky bucket (10 at once, then 10/s); the
batches grow (many messages per apply); RSS after the flood, idle, is within 25 % (or 40 MiB) of before;
and the final kernel state equals a clean start of the final feed (normalised dumps).
"""

from __future__ import annotations

import os

import pytest

from fv.chaos.flood import FLOOD_CONFIG, flood, flood_world
from fv.chaos.kill9 import dump_diff, normalised_dump
from fv.expect import ICMP, TCP, Expect
from fv.harness import FvNode

pytestmark = pytest.mark.fv

SECONDS = float(os.environ.get("FLOOD_SECONDS", "5"))
RATE = float(os.environ.get("FLOOD_RATE", "20000"))
POOL = int(os.environ.get("FLOOD_POOL", "300"))
MODES = os.environ.get("FLOOD_MODES", "nftables,iptables-nft").split(",")


@pytest.mark.parametrize("mode", MODES)
def test_flood_keeps_up_is_throttled_bounded_and_exact(mode: str) -> None:
    node = FvNode.create(mode)
    try:
        final = flood_world(0, POOL)
        node.apply(final, config=FLOOD_CONFIG)  # the very first start of day with F: the reference
        reference = normalised_dump(node)
        res = flood(node, POOL, RATE, SECONDS)
        print(res.summary())
        assert node.daemon is not None and node.daemon.alive(), node.log_tail(40)
        diff = dump_diff(reference, normalised_dump(node))
        assert not diff, res.summary() + "\n" + "\n".join(diff)
        for v in (4, 6):
            node.check(v, Expect(True).block(src="a", dst="b"), (TCP, ICMP), names=["a", "b", "c"],
                       what="after the flood")
        window = max(res.send_s + res.catch_up_s, 1.0)
        assert res.applies <= 10 + 10.5 * window, res.summary()  # the leaky bucket: 10 at once, ~10/s
        assert res.messages_per_apply >= 100, res.summary()  # batches grew
        growth = res.rss_after_kib - res.rss_before_kib
        assert growth <= max(0.25 * res.rss_before_kib, 40 * 1024), res.summary()
    finally:
        node.close()
