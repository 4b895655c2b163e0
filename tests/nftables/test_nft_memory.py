"""Memory behaviour of the nftables driver: shared namespaced rules, big transactions one at a time."""

from __future__ import annotations

import threading
import time
from typing import Any

from felixpy.drivers.generictables.model import Accept, Chain, Jump, Match, Rule
from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.nftables.layer import NftablesLayer

from felixpy.testing.clock import FakeClock
from nft_helpers import Harness

BODY = (Rule(Match().conntrack_state("INVALID"), Accept()), Rule(Match(), Jump("cali-pi-x")))


def test_chains_sharing_a_rule_tuple_share_the_namespaced_one() -> None:
    h = Harness(4, FakeNft(), FakeClock())
    h.filter.update_chains([Chain("cali-tw-a", BODY), Chain("cali-tw-b", BODY), Chain("cali-pi-x", ())])
    chains = h.root._chains
    a, b = chains["filter-cali-tw-a"], chains["filter-cali-tw-b"]
    assert a.rules is b.rules
    assert a.rules[1].action == Jump("filter-cali-pi-x")
    assert a.rules[0] is BODY[0]  # nothing to rename: the rule itself is kept
    assert h.root._chains["filter-cali-pi-x"].rules == ()


def test_namespacing_memo_is_bounded_and_correct_after_eviction(monkeypatch: Any) -> None:
    monkeypatch.setattr("felixpy.drivers.nftables.layer.NS_MEMO_SIZE", 2)
    h = Harness(6, FakeNft(), FakeClock())
    layer: NftablesLayer = h.filter
    bodies = [(Rule(Match(), Jump(f"cali-pi-{i}")),) for i in range(5)]
    for round_ in range(2):
        for i, body in enumerate(bodies):
            out = layer._ns_rules(body)
            assert out == (Rule(Match(), Jump(f"filter-cali-pi-{i}")),), round_
    assert len(layer._ns_memo) == 2
    assert layer._ns_rules(list(bodies[0])) == (Rule(Match(), Jump("filter-cali-pi-0")),)  # not a tuple: uncached


class SlowScriptShim(FakeNft):
    """Takes the script path (the fake has none) and records how many runs overlap in time."""

    def __init__(self) -> None:
        super().__init__()
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def run_script(self, script: str) -> None:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(0.05)
        with self._lock:
            self.active -= 1


def _big(h: Harness, n: int) -> None:
    h.filter.insert_or_append_rules("INPUT", [Rule(Match(), Jump("cali-big"))])
    h.filter.update_chain(Chain("cali-big", tuple(Rule(Match().source_net(f"10.0.{i // 250}.{i % 250}/32"), Accept())
                                                  for i in range(n))))


def test_big_transactions_of_both_families_take_turns() -> None:
    shim = SlowScriptShim()
    hs = [Harness(v, shim, FakeClock(), text_threshold=10) for v in (4, 6)]
    for h in hs:
        _big(h, 20)
    threads = [threading.Thread(target=h.root.apply) for h in hs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert shim.max_active == 1
