from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from felixpy.deltatracker import DeltaTracker


def test_new_desired_is_pending_update_until_dataplane_matches() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.set_desired("a", 1)
    assert t.pending_updates() == [("a", 1)]
    t.set_dataplane("a", 1)
    assert t.pending_updates() == [] and t.in_sync()


def test_changed_value_is_pending_and_deleted_desired_is_pending_deletion() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.replace_dataplane({"a": 1, "b": 2})
    t.set_desired("a", 5)
    assert t.pending_updates() == [("a", 5)]
    assert t.pending_deletions() == ["b"]  # in the kernel, not desired: sweep
    t.delete_dataplane("b")
    t.set_dataplane("a", 5)
    assert t.in_sync()


def test_resync_keeps_what_is_right_fixes_what_is_wrong_sweeps_the_rest() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.replace_all_desired({"keep": 1, "fix": 2, "missing": 3})
    t.replace_dataplane({"keep": 1, "fix": 99, "orphan": 4})
    assert dict(t.pending_updates()) == {"fix": 2, "missing": 3}
    assert t.pending_deletions() == ["orphan"]


def test_delete_desired_of_unknown_key_is_not_an_error() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.delete_desired("nope")
    assert t.in_sync()


def test_replace_all_desired_removes_keys_not_listed() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.replace_all_desired({"a": 1, "b": 2})
    t.replace_dataplane({"a": 1, "b": 2})
    t.replace_all_desired({"a": 1})
    assert t.pending_deletions() == ["b"] and t.pending_updates() == []


ops = st.lists(st.tuples(st.sampled_from(["sd", "dd", "sp", "dp"]), st.integers(0, 5), st.integers(0, 3)),
               max_size=60)


@given(ops)
def test_pending_lists_always_equal_a_from_scratch_diff(seq: list[tuple[str, int, int]]) -> None:
    t: DeltaTracker[int, int] = DeltaTracker()
    desired: dict[int, int] = {}
    dataplane: dict[int, int] = {}
    for op, k, v in seq:
        if op == "sd":
            t.set_desired(k, v); desired[k] = v
        elif op == "dd":
            t.delete_desired(k); desired.pop(k, None)
        elif op == "sp":
            t.set_dataplane(k, v); dataplane[k] = v
        else:
            t.delete_dataplane(k); dataplane.pop(k, None)
        want_updates = {k2: v2 for k2, v2 in desired.items() if dataplane.get(k2, object()) != v2}
        want_deletes = {k2 for k2 in dataplane if k2 not in desired}
        assert dict(t.pending_updates()) == want_updates
        assert set(t.pending_deletions()) == want_deletes


def test_none_is_an_ordinary_value() -> None:
    t: DeltaTracker[str, None] = DeltaTracker()
    t.set_desired("a", None)
    t.delete_desired("a")
    assert t.pending_updates() == [] and t.in_sync()
