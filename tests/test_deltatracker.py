from __future__ import annotations

from collections.abc import Callable

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


# --------------------------------------------------------------------------- bulk operations
class OneKeyAtATime:
    """The reference: the bulk operations spelled out as the one-key calls they stand for."""

    def __init__(self, equal: Callable[[int, int], bool] = lambda a, b: a == b) -> None:
        self.desired: dict[int, int] = {}
        self.dataplane: dict[int, int] = {}
        self.updates: dict[int, None] = {}
        self.deletions: dict[int, None] = {}
        self.equal = equal

    def set_desired(self, k: int, v: int) -> None:
        self.desired[k] = v
        self.deletions.pop(k, None)
        if k in self.dataplane and self.equal(self.dataplane[k], v):
            self.updates.pop(k, None)
        else:
            self.updates[k] = None

    def delete_desired(self, k: int) -> None:
        if k not in self.desired and k not in self.dataplane:
            return
        self.desired.pop(k, None)
        self.updates.pop(k, None)
        if k in self.dataplane:
            self.deletions[k] = None

    def replace_all_desired(self, items: dict[int, int]) -> None:
        for k in [k for k in self.desired if k not in items]:
            self.delete_desired(k)
        for k, v in items.items():
            self.set_desired(k, v)

    def _recompute(self, k: int) -> None:
        self.updates.pop(k, None)
        self.deletions.pop(k, None)
        if k in self.desired:
            if k not in self.dataplane or not self.equal(self.dataplane[k], self.desired[k]):
                self.updates[k] = None
        elif k in self.dataplane:
            self.deletions[k] = None

    def set_dataplane(self, k: int, v: int) -> None:
        self.dataplane[k] = v
        self._recompute(k)

    def delete_dataplane(self, k: int) -> None:
        self.dataplane.pop(k, None)
        self._recompute(k)

    def replace_dataplane(self, items: dict[int, int]) -> None:
        self.dataplane = dict(items)
        self.updates = {k: None for k, v in self.desired.items()
                        if k not in self.dataplane or not self.equal(self.dataplane[k], v)}
        self.deletions = {k: None for k in self.dataplane if k not in self.desired}


keys_st = st.integers(0, 7)
bulk_st = st.dictionaries(keys_st, st.integers(0, 2), max_size=8)
key_list_st = st.lists(keys_st, max_size=10)  # duplicates: the last mention counts, as in dict.fromkeys
bulk_ops = st.lists(st.one_of(
    st.tuples(st.sampled_from(["sd", "dd", "sp", "dp"]), keys_st, st.integers(0, 2)),
    st.tuples(st.sampled_from(["rad", "rdp"]), bulk_st),
    st.tuples(st.sampled_from(["radk", "rdpk"]), key_list_st, st.integers(0, 2)),
), max_size=40)


def _check_same(t: DeltaTracker[int, int], ref: OneKeyAtATime) -> None:
    # Same contents *and* same order: the order is the order of the lines written to the kernel.
    assert list(t.desired_items()) == list(ref.desired.items())
    assert t.desired_keys() == list(ref.desired)
    assert list(t.dataplane_items()) == list(ref.dataplane.items())
    assert t.pending_updates() == [(k, ref.desired[k]) for k in ref.updates]
    assert t.pending_update_keys() == list(ref.updates)
    assert t.pending_deletions() == list(ref.deletions)
    assert t.in_sync() == (not ref.updates and not ref.deletions)


def _run_bulk(seq: list[tuple], t: DeltaTracker[int, int], ref: OneKeyAtATime) -> None:
    for op in seq:
        kind = op[0]
        if kind == "sd":
            t.set_desired(op[1], op[2]); ref.set_desired(op[1], op[2])
        elif kind == "dd":
            t.delete_desired(op[1]); ref.delete_desired(op[1])
        elif kind == "sp":
            t.set_dataplane(op[1], op[2]); ref.set_dataplane(op[1], op[2])
        elif kind == "dp":
            t.delete_dataplane(op[1]); ref.delete_dataplane(op[1])
        elif kind == "rad":
            t.replace_all_desired(op[1]); ref.replace_all_desired(op[1])
        elif kind == "rdp":
            t.replace_dataplane(op[1]); ref.replace_dataplane(op[1])
        elif kind == "radk":
            t.replace_all_desired_keys(op[1], op[2]); ref.replace_all_desired(dict.fromkeys(op[1], op[2]))
        else:
            t.replace_dataplane_keys(op[1], op[2]); ref.replace_dataplane(dict.fromkeys(op[1], op[2]))
        _check_same(t, ref)


@given(bulk_ops)
def test_bulk_operations_equal_their_one_key_sequences(seq: list[tuple]) -> None:
    _run_bulk(seq, DeltaTracker(), OneKeyAtATime())


@given(bulk_ops)
def test_bulk_operations_with_a_custom_equality(seq: list[tuple]) -> None:
    def same_parity(a: int, b: int) -> bool:
        return a % 2 == b % 2

    _run_bulk(seq, DeltaTracker(same_parity), OneKeyAtATime(same_parity))


def test_replace_all_desired_keeps_the_order_of_surviving_keys() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.replace_all_desired({"a": 1, "b": 2, "c": 3})
    t.replace_dataplane({"b": 2, "z": 9})
    t.replace_all_desired({"d": 4, "c": 30, "a": 1})
    assert t.desired_keys() == ["a", "c", "d"]
    assert t.pending_update_keys() == ["a", "c", "d"]
    assert t.pending_deletions() == ["z", "b"]


def test_bulk_keys_forms_on_a_large_set() -> None:
    members = [f"10.0.{i >> 8}.{i & 255}" for i in range(20_000)]
    t: DeltaTracker[str, bool] = DeltaTracker()
    t.replace_all_desired_keys(members, True)
    assert t.pending_update_keys() == members
    t.replace_dataplane_keys(members, True)
    assert t.in_sync()
    t.replace_dataplane_keys(members[1:] + ["192.0.2.1"], True)
    assert t.pending_update_keys() == members[:1] and t.pending_deletions() == ["192.0.2.1"]
    t.replace_all_desired_keys(members[2:], True)
    assert t.pending_update_keys() == [] and t.pending_deletions() == ["192.0.2.1", members[1]]


def test_a_read_back_value_equal_to_the_desired_one_is_held_as_the_desired_object() -> None:
    """After a resync the kernel's copies of values equal to the desired ones are let go: the dataplane
    side holds the desired objects (one object each, not two), in sync or not; a differing or unwanted
    value stays the kernel's; with a custom equality nothing is swapped (equal need not mean the same)."""
    def val(s: str) -> str:
        out = s[:1] + s[1:]  # an equal string that is another object
        assert out is not s
        return out

    t: DeltaTracker[str, str] = DeltaTracker()
    want = {"a": val("route-a"), "b": val("route-b")}
    t.replace_all_desired(want)
    t.replace_dataplane({"a": val("route-a"), "b": val("route-b")})  # in sync
    assert t.in_sync() and all(t.get_dataplane(k) is v for k, v in want.items())
    got_c = val("route-c")
    t.replace_dataplane({"a": val("route-a"), "b": val("other"), "c": got_c})  # one equal, one not, one extra
    assert t.get_dataplane("a") is want["a"]
    assert t.get_dataplane("b") == "other" and t.get_dataplane("c") is got_c
    assert t.pending_updates() == [("b", "route-b")] and t.pending_deletions() == ["c"]
    custom: DeltaTracker[str, str] = DeltaTracker(values_equal=lambda x, y: x.lower() == y.lower())
    custom.replace_all_desired({"a": "Route-A"})
    custom.replace_dataplane({"a": "route-a"})
    assert custom.in_sync() and custom.get_dataplane("a") == "route-a"
