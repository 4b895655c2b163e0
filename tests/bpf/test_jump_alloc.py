"""The policy jump maps' entry allocator: what a restart's reclaim (``assign``, in ``cali_iface``'s
order) and later endpoints (``get``/``put``) may rely on, checked against a plain model."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from felixpy.bpf.policyload import JumpMapAllocator

SIZE = 40
OPS = st.lists(st.one_of(st.tuples(st.just("get"), st.just(0)),
                         st.tuples(st.just("put"), st.integers(0, SIZE - 1)),
                         st.tuples(st.just("assign"), st.integers(0, SIZE - 1))), max_size=120)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_never_hands_out_an_owned_entry_and_uses_every_free_one(ops: list[tuple[str, int]]) -> None:
    alloc = JumpMapAllocator(size=SIZE)
    owned: dict[int, str] = {}
    for n, (op, idx) in enumerate(ops):
        if op == "get":
            if len(owned) == SIZE:
                with pytest.raises(RuntimeError):
                    alloc.get(f"o{n}")
                continue
            got = alloc.get(f"o{n}")
            assert 0 <= got < SIZE and got not in owned
            owned[got] = f"o{n}"
        elif op == "put":
            alloc.put(idx)
            owned.pop(idx, None)
        elif idx in owned:
            with pytest.raises(ValueError):
                alloc.assign(idx, f"o{n}")
        else:
            alloc.assign(idx, f"o{n}")
            owned[idx] = f"o{n}"
    # Whatever happened, the allocator hands out exactly the entries nobody owns, then is exhausted.
    rest = {alloc.get(f"r{k}") for k in range(SIZE - len(owned))}
    assert rest == set(range(SIZE)) - set(owned)
    with pytest.raises(RuntimeError):
        alloc.get("one too many")


def test_a_restart_reclaiming_entries_in_any_order_then_allocating_fills_the_gaps() -> None:
    """10,000 reclaimed entries in hash order (the restart at stress): each assign is constant time
    (it was a scan of the free list), and the gaps are handed out afterwards."""
    alloc = JumpMapAllocator(size=10_000)
    reclaimed = random.Random(7).sample(range(10_000), 9_000)
    for k, idx in enumerate(reclaimed):
        alloc.assign(idx, f"w{k}")
    gaps = sorted(set(range(10_000)) - set(reclaimed))
    got = [alloc.get(f"n{k}") for k in range(len(gaps))]
    assert sorted(got) == gaps and len(set(got)) == len(gaps)
    alloc.put(got[0])
    assert alloc.get("again") == got[0]
