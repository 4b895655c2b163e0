"""The two-tier resync queue."""

from __future__ import annotations

from felixpy.drivers.ipsets.resync_queue import ResyncPriority as P
from felixpy.drivers.ipsets.resync_queue import ResyncQueue


def test_fifo_per_tier_and_must_first() -> None:
    q = ResyncQueue()
    for n in "abc":
        q.add(n, P.BACKGROUND)
    q.add("m", P.MUST)
    assert len(q) == 4 and q.must_len() == 1
    assert q.pop_all_must() == ["m"]
    assert [q.pop(P.BACKGROUND) for _ in range(4)] == ["a", "b", "c", None]


def test_readd_keeps_position_and_promotion_moves_to_back_of_must() -> None:
    q = ResyncQueue()
    for n in "abc":
        q.add(n, P.BACKGROUND)
    q.add("a", P.BACKGROUND)  # keeps its place
    assert q.pop(P.BACKGROUND) == "a"
    q.add("x", P.MUST)
    q.add("c", P.MUST)  # promoted behind x
    q.add("c", P.BACKGROUND)  # no demotion
    assert q.priority_of("c") is P.MUST
    assert q.pop_all_must() == ["x", "c"]
    assert q.pop(P.BACKGROUND) == "b" and len(q) == 0


def test_remove_and_clear() -> None:
    q = ResyncQueue()
    q.add("a", P.BACKGROUND)
    q.add("b", P.MUST)
    q.remove("a")
    q.remove("zz")
    assert "a" not in q and "b" in q
    q.clear()
    assert len(q) == 0 and q.pop(P.MUST) is None
