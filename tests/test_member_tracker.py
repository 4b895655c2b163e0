"""MemberTracker (issue #17, memory): the IP-set driver's member tracker keeps only the desired keys and the work
lists, no copy of the keys for the dataplane.  It must give the very results *and orders* DeltaTracker gives (the
ipset restore text is written in pending order, so byte-identical output depends on it): every operation sequence
is run on both, side by side, and compared after each step."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from felixpy.deltatracker import DeltaTracker, MemberTracker

KEYS = st.sampled_from([f"10.0.0.{i}" for i in range(12)])
OPS = st.lists(st.one_of(
    st.tuples(st.just("set_desired"), KEYS),
    st.tuples(st.just("delete_desired"), KEYS),
    st.tuples(st.just("set_dataplane"), KEYS),
    st.tuples(st.just("delete_dataplane"), KEYS),
    st.tuples(st.just("replace_all_desired_keys"), st.lists(KEYS, max_size=10)),
    st.tuples(st.just("replace_all_desired"), st.lists(KEYS, max_size=10)),
    st.tuples(st.just("replace_dataplane_keys"), st.lists(KEYS, max_size=10)),
    st.tuples(st.just("replace_dataplane"), st.lists(KEYS, max_size=10)),
    st.tuples(st.just("write_pending"), st.just("")),
    st.tuples(st.just("compact"), st.just("")),     # MemberTracker only: packs the keys when in sync or unwritten
    st.tuples(st.just("write_whole"), st.just("")),  # the driver's write of a whole set (packed: by snapshot)
    st.tuples(st.just("read_back_equal"), st.just("")),  # a read-back found the desired keys (by digest)
), max_size=40)


def _apply(t: Any, op: str, arg: Any) -> None:
    if op in ("set_desired", "set_dataplane"):
        getattr(t, op)(arg, True)
    elif op in ("delete_desired", "delete_dataplane"):
        getattr(t, op)(arg)
    elif op in ("replace_all_desired_keys", "replace_dataplane_keys"):
        getattr(t, op)(arg, True)
    elif op in ("replace_all_desired", "replace_dataplane"):
        getattr(t, op)(dict.fromkeys(arg, True))
    elif op == "compact":
        if isinstance(t, MemberTracker):
            unwritten = t.dataplane_len() == 0 and t.pending_update_keys() == t.desired_keys()
            assert t.compact(min_keys=1) == ((t.in_sync() or unwritten) and t.desired_len() > 0)
    elif op == "read_back_equal":
        # MemberTracker: in O(1), without the keys (the save worker's digest matched); the reference is
        # told the very keys.  Same state, orders included, whatever the state before.
        if isinstance(t, MemberTracker):
            packed = t.packed_snapshot()
            t.mark_dataplane_desired()
            assert t.packed_snapshot() is packed   # a packed set stays packed
        else:
            t.replace_dataplane_keys(t.desired_keys(), True)
    elif op == "write_whole":
        snap = t.packed_snapshot() if isinstance(t, MemberTracker) else None
        if snap is not None:
            t.mark_written(snap)
        else:
            t.replace_dataplane_keys(t.desired_keys(), True)
    else:  # what the driver does after a successful restore
        for k in t.pending_deletions():
            t.delete_dataplane(k)
        for k in t.pending_update_keys():
            t.set_dataplane(k, True)


def _view(t: Any) -> tuple[object, ...]:
    keys = [f"10.0.0.{i}" for i in range(12)]
    return (t.desired_keys(), list(t.desired_items()), t.desired_len(), t.pending_update_keys(),
            t.pending_updates(), t.pending_deletions(), t.num_pending_updates(), t.num_pending_deletions(),
            t.in_sync(), t.dataplane_len(), [t.get_dataplane(k) for k in keys], [t.get_desired(k) for k in keys],
            sorted(t.dataplane_items()))


@settings(max_examples=400)
@given(OPS)
def test_member_tracker_equals_delta_tracker_step_by_step(ops: list[tuple[str, Any]]) -> None:
    ref: DeltaTracker[str, bool] = DeltaTracker()
    mt: MemberTracker[str] = MemberTracker()
    for op, arg in ops:
        _apply(ref, op, arg)
        _apply(mt, op, arg)
        assert _view(mt) == _view(ref), (op, arg)


def test_member_tracker_holds_no_dataplane_copy_in_sync() -> None:
    mt: MemberTracker[str] = MemberTracker()
    members = [f"10.{i >> 8}.{i & 255}.1" for i in range(5000)]
    mt.replace_all_desired_keys(members, True)
    mt.replace_dataplane_keys(members, True)        # a restart's read-back: in sync
    assert mt.in_sync() and mt.dataplane_len() == 5000
    assert not mt._pending_updates and not mt._pending_deletions   # only the desired dict is held


def test_member_tracker_packs_ipv4_members_in_sync_and_unpacks_them_on_change() -> None:
    mt: MemberTracker[str] = MemberTracker()
    members = [f"10.{i >> 8}.{i & 255}.{i % 7}" for i in range(5000)][::-1]   # not sorted: order is kept
    mt.replace_all_desired_keys(members, True)
    mt.set_dataplane(members[0], True)
    assert not mt.compact()                         # partly written: nothing packed
    mt.replace_dataplane_keys(members, True)
    assert mt.compact() and mt._desired == {}       # in sync: no str, no dict slot per member
    assert mt.desired_keys() == members and mt.dataplane_len() == 5000 and mt.in_sync()
    assert mt.get_dataplane("10.0.3.3") and mt.get_desired("10.0.3.3")
    assert mt.get_desired("10.0.3.03") is None and mt.get_desired("10.0.3.99") is None
    mt.delete_desired("10.0.3.3")                   # a change: unpacked, same order as before
    assert mt._packed is None and mt.pending_deletions() == ["10.0.3.3"]
    assert mt.desired_keys() == [m for m in members if m != "10.0.3.3"]


def test_member_tracker_packs_an_unwritten_set_and_marks_it_written_without_unpacking() -> None:
    """A set just received (nothing of it in the dataplane) is held packed too: the driver's intake of a
    200,000-member node held each member as a str in two dicts until the first write (issue #17)."""
    mt: MemberTracker[str] = MemberTracker()
    members = [f"10.{i >> 8}.{i & 255}.{i % 5}" for i in range(3000)][::-1]
    mt.replace_all_desired_keys(members, True)
    assert mt.compact() and mt._desired == {} and mt._pending_updates == {}
    assert mt.pending_update_keys() == members and mt.num_pending_updates() == 3000
    assert mt.dataplane_len() == 0 and not mt.in_sync() and mt.get_dataplane(members[0]) is None
    assert list(mt.dataplane_items()) == [] and mt.get_desired(members[0])
    mt.replace_dataplane_keys([], True)             # a read-back that found nothing: still packed
    assert mt._packed is not None
    snap = mt.packed_snapshot()
    assert snap is not None
    mt.mark_written(snap)                           # written whole: in sync, still packed
    assert mt._packed is snap and mt.in_sync() and mt.dataplane_len() == 3000
    assert mt.get_dataplane(members[7]) and mt.pending_update_keys() == []


def test_member_tracker_marked_with_a_stale_snapshot_holds_what_was_written() -> None:
    mt: MemberTracker[str] = MemberTracker()
    members = [f"10.0.{i >> 8}.{i & 255}" for i in range(100)]
    mt.replace_all_desired_keys(members, True)
    assert mt.compact()
    snap = mt.packed_snapshot()
    assert snap is not None
    mt.set_desired("10.9.9.9", True)                # changed while the write ran: unpacked
    mt.mark_written(snap)
    assert mt.pending_update_keys() == ["10.9.9.9"] and mt.dataplane_len() == 100
    assert mt.pending_deletions() == []


def test_member_tracker_leaves_non_ipv4_members_unpacked() -> None:
    for members in (["10.0.0.0/24", "10.0.1.0/24"], ["fd00::1", "fd00::2"], ["10.0.0.1,tcp:80", "10.0.0.2"]):
        mt: MemberTracker[str] = MemberTracker()
        mt.replace_all_desired_keys(members, True)
        mt.replace_dataplane_keys(members, True)
        assert not mt.compact(min_keys=1) and mt.desired_keys() == members


def test_a_read_back_equal_to_a_packed_set_leaves_it_packed() -> None:
    """A restart's or a refresh's read-back of a set in sync (in the kernel's order, not ours) is compared
    as sorted addresses: no str and dict slot per member, even for a moment (#17)."""
    members = [f"10.1.{i >> 8}.{i & 255}" for i in range(400)]
    for written in (False, True):
        mt: MemberTracker[str] = MemberTracker()
        mt.replace_all_desired_keys(members, True)
        if written:
            mt.replace_dataplane_keys(members, True)
        assert mt.compact()
        packed = mt.packed_snapshot()
        mt.replace_dataplane_keys(members[::-1], True)
        assert mt.packed_snapshot() is packed and mt.in_sync() and mt.dataplane_len() == 400
        mt.replace_dataplane_keys(members[1:] + ["10.9.9.9"], True)   # not equal: unpacked and diffed
        assert mt.packed_snapshot() is None
        assert mt.pending_update_keys() == [members[0]] and mt.pending_deletions() == ["10.9.9.9"]
