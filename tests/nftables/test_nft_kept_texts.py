"""The rule texts rendered for the hashes are the ones the script writes, and the rules gauge's running count.

Issue #17: a steady-state transaction rendered every rule it wrote twice (once to hash it when the chain was
updated, once again for the script).  The table now keeps the first rendering until the commit; these tests
pin that the kept text is only ever used for the very rules it was rendered from, that the script is the
same as a fresh render's, that the memory held for it is bounded, and that the ``felix_nft_rules`` gauge,
now moved by each commit's changes instead of recounted, still equals the count of the dataplane view.
"""

from __future__ import annotations

from typing import Any

import pytest

from felixpy.drivers.generictables.model import Accept, Chain, Drop, Goto, Jump, Match, Rule
from felixpy.drivers.generictables.table import MapMetadata
from felixpy.drivers.nftables import script as script_mod
from felixpy.drivers.nftables import table as table_mod
from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.nftables.names import BASE_CHAINS
from felixpy.testing.clock import FakeClock
from nft_helpers import Harness, program_typical


class ScriptRecorder(FakeNft):
    """Takes the script path (the fake itself has none) and keeps every script it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []

    def run_script(self, script: str) -> None:
        self.scripts.append(script)


def _no_render(*_a: Any, **_k: Any) -> str:
    raise AssertionError("a rule was rendered a second time for the script")


def _chain(name: str, n: int, port0: int = 1000) -> Chain:
    return Chain(name, tuple(Rule(Match().protocol("tcp").dest_ports(port0 + i), Accept()) for i in range(n)))


@pytest.mark.parametrize("v", [4, 6])
def test_script_reuses_the_hashed_texts_and_matches_a_fresh_render(monkeypatch: pytest.MonkeyPatch, v: int) -> None:
    kept, fresh = ScriptRecorder(), ScriptRecorder()
    h_kept = Harness(v, kept, FakeClock())
    program_typical(h_kept)
    h_kept.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Jump("cali-tw-a")),)))
    h_kept.filter.update_chain(_chain("cali-tw-a", 5))
    with monkeypatch.context() as mp:
        # Regular chains' rules must come from the kept texts; base chains (hashed with the IPv4
        # rendering whatever the family) are still rendered for the script.
        real = script_mod.rule_text
        base_rules = {id(r) for n in BASE_CHAINS for r in h_kept.root._inserts[n] + h_kept.root._appends[n]}
        mp.setattr(script_mod, "rule_text", lambda r, *a, **k: real(r, *a, **k) if id(r) in base_rules
                   else _no_render())
        h_kept.root.apply()
    monkeypatch.setattr(table_mod, "KEEP_TEXTS_MAX", 0)
    h_fresh = Harness(v, fresh, FakeClock())
    program_typical(h_fresh)
    h_fresh.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Jump("cali-tw-a")),)))
    h_fresh.filter.update_chain(_chain("cali-tw-a", 5))
    assert not h_fresh.root._texts.chains()
    h_fresh.root.apply()
    assert kept.scripts and kept.scripts == fresh.scripts
    assert "tcp dport { 1004 }" in kept.scripts[-1]
    assert not h_kept.root._texts.chains() and h_kept.root._texts.count == 0   # dropped at the commit


def test_a_chain_replaced_before_the_apply_writes_its_new_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = ScriptRecorder()
    h = Harness(4, rec, FakeClock())
    h.filter.insert_or_append_rules("INPUT", [Rule(Match(), Jump("cali-a"))])
    h.filter.update_chain(_chain("cali-a", 3, port0=1000))
    h.root.apply()
    h.filter.update_chain(_chain("cali-a", 3, port0=2000))
    h.filter.update_chain(_chain("cali-a", 2, port0=3000))      # replaced again before the apply
    assert h.root._texts.count == 2
    h.root.apply()
    last = rec.scripts[-1]
    assert "tcp dport { 3000 }" in last and "tcp dport { 3001 }" in last
    assert "{ 2000 }" not in last and "{ 2002 }" not in last


def test_texts_kept_are_bounded_and_the_rest_still_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_mod, "KEEP_TEXTS_MAX", 4)
    rec = ScriptRecorder()
    h = Harness(6, rec, FakeClock())
    h.filter.insert_or_append_rules("INPUT", [Rule(Match(), Jump("cali-a")), Rule(Match(), Jump("cali-b")),
                                              Rule(Match(), Jump("cali-c"))])
    h.filter.update_chain(_chain("cali-a", 3, port0=1000))
    h.filter.update_chain(_chain("cali-b", 3, port0=2000))      # would pass the bound: not kept
    h.filter.update_chain(_chain("cali-c", 1, port0=3000))
    assert h.root._texts.chains() == {"filter-cali-a", "filter-cali-c"} and h.root._texts.count == 4
    h.filter.remove_chains([_chain("cali-c", 1)])
    assert h.root._texts.count == 3
    h.filter.update_chain(Chain("cali-c", (Rule(Match(), Drop()),)))
    h.root.apply()
    for port in (1000, 1002, 2000, 2002):
        assert f"tcp dport {{ {port} }}" in rec.scripts[-1]


def _gauge(h: Harness) -> float:
    value: float = h.root._g_rules._value.get()
    return value


def _view_rules(h: Harness) -> int:
    return sum(len(c.hashes) for c in h.root._dp_chains.values())


def test_rules_gauge_follows_the_view_through_writes_deletions_reads_and_rebuilds() -> None:
    fake = FakeNft()
    h = Harness(4, fake, FakeClock())
    program_typical(h)
    h.root.apply()
    assert _gauge(h) == _view_rules(h) > 0
    h.filter.update_chain(_chain("cali-fw-cali1234", 7))                  # grows
    h.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Drop()),)))  # shrinks
    h.root.apply()
    assert _gauge(h) == _view_rules(h)
    h.filter.remove_chains([Chain("cali-fw-cali5678", ())])              # a referenced chain goes
    h.filter.add_or_replace_map(MapMetadata("cali-from-wl-dispatch"), {"cali1234": Goto("cali-fw-cali1234")})
    h.root.apply()
    assert _gauge(h) == _view_rules(h)
    h.root.invalidate_dataplane_cache("test")                              # a read gives a new view
    h.filter.update_chain(_chain("cali-fw-cali1234", 2))
    h.root.apply()
    assert _gauge(h) == _view_rules(h)
    h2 = Harness(4, fake, FakeClock())                                     # a restart: read, then nothing
    program_typical(h2)
    h2.root.apply()
    assert _gauge(h2) == _view_rules(h2)



def test_kept_texts_hand_out_only_for_the_same_rules_tuple_and_respect_the_limit() -> None:
    from felixpy.drivers.nftables.texts import KeptTexts
    kept = KeptTexts(limit=3)
    rules = (Rule(Match(), Accept()), Rule(Match(), Drop()))
    kept.keep("a", rules, ["accept", "drop"])
    assert kept.get("a", rules) == ["accept", "drop"]
    assert kept.get("a", tuple(list(rules))) is None            # equal, but not the tuple rendered from
    kept.keep("b", rules[:1], ["accept"])
    kept.keep("c", rules[:1], ["accept"])                       # would pass the limit: not kept
    assert kept.chains() == {"a", "b"} and kept.count == 3
    kept.keep("a", rules[:1], ["accept"])                       # replaced: the old entry's count goes
    assert kept.count == 2 and kept.get("a", rules) is None
    kept.clear()
    assert kept.count == 0 and not kept.chains()
