"""IP-set ids and the desired-state writer (against a FakeMap)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from felixpy.bpf import maps
from felixpy.bpf import maptypes as mt
from felixpy.bpf.fake import FakeMap
from felixpy.bpf.ipsets import BPFIPSets, IPSetIDAllocator, member_key


def test_ids_stable_unique_and_below_reserved() -> None:
    a, b = IPSetIDAllocator(), IPSetIDAllocator()
    names = [f"s:{i}" for i in range(2000)]
    ids = [a.get_or_alloc(n) for n in names]
    assert ids == [b.get_or_alloc(n) for n in names]  # a restarted process gets the same ids
    assert len(set(ids)) == len(ids) and all(0 < i < 2**32 for i in ids)
    a.release("s:1")
    assert "s:1" not in a and a.get("s:2") == ids[2]


def test_member_keys() -> None:
    assert member_key(1, "10.0.0.0/8", v6=False).prefixlen == 72
    assert member_key(1, "10.0.0.1", v6=False).prefixlen == 96
    assert member_key(1, "10.0.0.1,tcp:80", v6=False).prefixlen == 120
    assert member_key(1, "fd00::1", v6=False) is None  # other family
    assert member_key(1, "10.0.0.1,icmp:0", v6=False) is None
    assert member_key(1, "fd00::/64", v6=True).prefixlen == 128


def test_writer_applies_deltas() -> None:
    m = FakeMap(maps.IPSETS4.sized(100))
    ids = IPSetIDAllocator()
    w = BPFIPSets(m, ids, v6=False)
    w.replace("s:a", ["10.0.0.0/24", "10.1.0.1", "fd00::1"])
    assert w.apply() == (2, 0)
    assert w.apply() == (0, 0)
    w.add_members("s:a", ["10.2.0.1"])
    w.remove_members("s:a", ["10.1.0.1"])
    assert w.apply() == (1, 1)
    sid = ids.get_or_alloc("s:a")
    probe = mt.ipset_key(sid, "10.0.0.77")
    probe.prefixlen = mt.IPSET_FULL_PREFIX_V4
    assert m.get(probe) is not None
    w.remove("s:a")
    assert w.apply() == (0, 2) and len(m) == 0


def test_a_full_update_does_not_fill_the_member_memo_and_its_keys_are_the_memoised_ones() -> None:
    """A set's full update (a start of day's 100,000 members) is parsed without the delta memo, which would
    otherwise stay full of members no delta names (#17); the map gets the same keys either way."""
    from felixpy.bpf.ipsets import member_key_bytes
    m = FakeMap(maps.IPSETS4.sized(2000))
    ids = IPSetIDAllocator()
    w = BPFIPSets(m, ids, v6=False)
    members = [f"10.77.{i >> 8}.{i & 255}" for i in range(1000)] + ["10.78.0.0/16", "10.79.0.1,tcp:80"]
    info = member_key_bytes.cache_info()
    w.replace("s:full", members)
    after = member_key_bytes.cache_info()
    assert (after.hits, after.misses, after.currsize) == (info.hits, info.misses, info.currsize)
    assert w.apply() == (len(members), 0)
    sid = ids.get_or_alloc("s:full")
    assert set(m.raw_keys()) == {member_key_bytes(sid, mem, False) for mem in members}
    asked = member_key_bytes.cache_info()
    w.add_members("s:full", ["10.80.0.1"])  # a delta goes through the memo
    assert member_key_bytes.cache_info().misses + member_key_bytes.cache_info().hits == asked.misses + asked.hits + 1
    assert w.apply() == (1, 0)


def test_writer_sweeps_unknown_entries_on_first_apply() -> None:
    m = FakeMap(maps.IPSETS4.sized(100))
    m.set(mt.ipset_key(12345, "10.9.9.9"), 1)  # left over by a previous process
    w = BPFIPSets(m, IPSetIDAllocator(), v6=False)
    w.replace("s:a", ["10.0.0.1"])
    assert w.apply() == (1, 1)


def test_memoised_member_keys_equal_the_parse_and_long_strings_stay_out_of_the_cache() -> None:
    """``member_key_bytes`` (the writer's hot path) must give exactly ``member_key``'s bytes for every
    spelling, valid or not, and a string longer than any member must not be kept by the memo."""
    from felixpy.bpf.ipsets import member_key_bytes
    spellings = ["10.0.0.0/8", "10.0.0.1", "10.0.0.1/32", "10.0.0.1/24", "10.0.0.1,tcp:80", "10.0.0.1,TCP:80",
                 "10.0.0.1,udp:53", "10.0.0.1,sctp:9", "10.0.0.1,icmp:0", "fd00::1", "fd00::/64", "FD00::1/128",
                 "fd00::1,tcp:443", "::ffff:10.0.0.1", "bogus", "", "10.0.0.256", "1" * 70, "fd00::1" + " " * 80]
    for v6 in (False, True):
        for sid in (1, 7):
            for m in spellings:
                k = member_key(sid, m, v6)
                assert member_key_bytes(sid, m, v6) == (bytes(k) if k is not None else None), (m, v6)
    before = member_key_bytes.cache_info().currsize
    for i in range(100):
        member_key_bytes(3, "10.0.0.1," + "x" * (100 + i), False)
    assert member_key_bytes.cache_info().currsize == before


def test_dataplane_desired_members_follow_deltas_and_a_snapshot_stays_put() -> None:
    """The BPF IP-set dataplane keeps each set's members once, as map keys; ``get_desired_members``
    decodes a snapshot (as ipset spells members) that later deltas leave alone; a removed set is gone
    from its answers at once, though its keys stay until the deletion step."""
    from felixpy.drivers.bpfendpoints.fake import fake_kernel
    from felixpy.drivers.bpfendpoints.ipsets import BPFIPSetsDataplane
    from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType

    dp = BPFIPSetsDataplane(4, fake_kernel().kernel)
    dp.add_or_replace_ip_set(IPSetMetadata("s:a", IPSetType.HASH_NET, 1000), ["10.0.0.1/32", "10.0.0.2"])
    snap = dp.get_desired_members("s:a")
    dp.add_members("s:a", ["10.0.0.3/32", "10.1.0.0/16"])
    dp.remove_members("s:a", ["10.0.0.1"])
    assert snap == {"10.0.0.1", "10.0.0.2"}
    assert dp.get_desired_members("s:a") == {"10.0.0.2", "10.0.0.3", "10.1.0.0/16"}
    dp.add_members("s:new", ["10.0.0.9/32"])  # a delta for a set not seen yet starts it, as before
    assert dp.get_desired_members("s:new") == {"10.0.0.9"}
    assert dp.status_counts() == {"bpf_sets": 2, "bpf_members": 4}
    dp.remove_ip_set("s:new")
    assert dp.get_desired_members("s:new") is None and dp.status_counts() == {"bpf_sets": 1, "bpf_members": 3}
    dp.apply_deletions()
    assert dp.status_counts() == {"bpf_sets": 1, "bpf_members": 3}


def test_a_key_decodes_to_the_member_it_was_made_from() -> None:
    from felixpy.bpf.ipsets import member_key_bytes, member_of_key

    for v6, spellings in ((False, {"10.0.0.1": "10.0.0.1", "10.0.0.1/32": "10.0.0.1", "10.0.0.7/24": "10.0.0.0/24",
                                   "0.0.0.0/0": "0.0.0.0/0", "10.0.0.1,tcp:80": "10.0.0.1,tcp:80",
                                   "10.0.0.1,UDP:53": "10.0.0.1,udp:53", "10.0.0.1,sctp:9": "10.0.0.1,sctp:9"}),
                          (True, {"fd00::1": "fd00::1", "FD00::1/128": "fd00::1", "fd00::/64": "fd00::/64",
                                  "fd00::1,tcp:443": "fd00::1,tcp:443"})):
        for given_, spelled in spellings.items():
            key = member_key_bytes(77, given_, v6)
            assert key is not None and member_of_key(key, v6) == spelled, given_
            assert member_key_bytes(77, spelled, v6) == key  # and the spelling makes the same key


def test_writer_keeps_what_a_failed_bulk_write_did_write_and_retries_the_rest() -> None:
    import errno

    import pytest

    m = FakeMap(maps.IPSETS4.sized(100))
    w = BPFIPSets(m, IPSetIDAllocator(), v6=False)
    w.replace("s:a", [f"10.0.0.{i}" for i in range(1, 6)])
    real_set, calls = m.set, {"n": 0}

    def third_fails(key, value, flags=0):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise maps.BPFSyscallError("BPF_MAP_UPDATE_ELEM", errno.ENOMEM)
        real_set(key, value, flags)

    m.set = third_fails  # type: ignore[method-assign]
    with pytest.raises(maps.WriteIncomplete) as exc:
        w.apply()
    assert exc.value.done == 2 and len(m) == 2
    m.set = real_set  # type: ignore[method-assign]
    assert w.apply() == (3, 0) and len(m) == 5  # only the three not written, none twice


def test_writer_keeps_exact_account_of_a_bulk_delete_that_stopped_midway() -> None:
    import errno

    import pytest

    m = FakeMap(maps.IPSETS4.sized(100))
    w = BPFIPSets(m, IPSetIDAllocator(), v6=False)
    w.replace("s:a", [f"10.0.0.{i}" for i in range(1, 11)])
    assert w.apply() == (10, 0)
    w.remove("s:a")
    stuck = list(m.raw_keys())[4]
    m.fail_deletes[stuck] = errno.EBUSY  # that member's delete fails, wherever it comes in the batch
    with pytest.raises(maps.WriteIncomplete) as exc:
        w.apply()
    done = exc.value.done
    assert len(m) == 10 - done and m.get(stuck) is not None
    m.fail_deletes.clear()
    assert w.apply() == (0, 10 - done) and len(m) == 0  # exactly those left, none deleted twice or forgotten
    assert w.apply() == (0, 0)


def _members(m: FakeMap) -> set[bytes]:
    return set(m.raw_keys())


def _want(w: BPFIPSets) -> set[bytes]:
    return set().union(*(set(w._iter(keys)) for keys in w._desired.values()))  # (packed sets too)


def test_an_apply_writes_only_the_change_not_the_whole_map() -> None:
    """After a big start of day, a one-member change is one write and nothing else: no read-back, no
    delete, no pass over the other sets (the apply runs twice per loop iteration in BPF mode)."""
    m = FakeMap(maps.IPSETS4.sized(100_000))
    w = BPFIPSets(m, IPSetIDAllocator(), v6=False)
    for j in range(50):
        w.replace(f"s:{j}", [f"10.{j}.{i // 250}.{i % 250}" for i in range(500)])
    assert w.apply() == (25_000, 0)
    calls: list[tuple[str, int]] = []
    set_many, delete_many, raw_keys = m.set_many, m.delete_many, m.raw_keys
    m.set_many = lambda items, flags=0: calls.append(("set", len(items))) or set_many(items, flags)  # type: ignore
    m.delete_many = lambda keys: calls.append(("delete", len(keys))) or delete_many(keys)  # type: ignore
    m.raw_keys = lambda: calls.append(("read", 0)) or raw_keys()  # type: ignore
    w.add_members("s:7", ["10.99.0.1"])
    assert w.apply() == (1, 0) and calls == [("set", 1)]
    assert w.apply() == (0, 0) and calls == [("set", 1)]  # the second apply of the iteration: nothing
    w.remove_members("s:7", ["10.7.0.1"])
    w.replace("s:8", [f"10.8.0.{i}" for i in range(10)])  # 490 of its 500 members go
    assert w.apply() == (0, 491) and calls[1:] == [("delete", 491)]
    assert _members(m) == _want(w)


def test_deltas_that_cancel_before_an_apply_write_nothing() -> None:
    m = FakeMap(maps.IPSETS4.sized(100))
    w = BPFIPSets(m, IPSetIDAllocator(), v6=False)
    w.replace("s:a", ["10.0.0.1", "10.0.0.2"])
    w.apply()
    w.remove_members("s:a", ["10.0.0.1"])
    w.add_members("s:a", ["10.0.0.1", "10.0.0.3"])
    w.remove_members("s:a", ["10.0.0.3"])
    w.remove("s:a")
    w.replace("s:a", ["10.0.0.2", "10.0.0.1"])
    assert w.apply() == (0, 0) and _members(m) == _want(w)


def test_a_resync_repairs_what_changed_behind_our_back_and_counts_it_once() -> None:
    m = FakeMap(maps.IPSETS4.sized(100))
    ids = IPSetIDAllocator()
    w = BPFIPSets(m, ids, v6=False)
    w.replace("s:a", ["10.0.0.1", "10.0.0.2"])
    w.apply()
    m.delete(next(iter(_members(m))))            # one member lost
    m.set(mt.ipset_key(ids.get_or_alloc("s:a"), "10.9.9.9"), 1)  # one foreign
    w.add_members("s:a", ["10.0.0.5"])           # and a change queued meanwhile
    w.queue_resync()
    assert w.apply() == (2, 1) and _members(m) == _want(w)
    assert w.take_drift() == 2 and w.take_drift() == 0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["replace", "add", "remove", "drop", "apply", "resync", "apply_fails"]),
                          st.sampled_from(["s:a", "s:b", "s:c"]),
                          st.sets(st.integers(0, 7), max_size=5)), max_size=40))
def test_after_any_sequence_of_changes_an_apply_leaves_exactly_the_desired_members(ops) -> None:  # type: ignore[no-untyped-def]
    from unittest import mock

    from felixpy.bpf import ipsets as ipsets_mod

    _run_ops(ops)
    with mock.patch.object(ipsets_mod, "_PACK_MIN", 1):  # and with every set packed that can be
        _run_ops(ops)
        with mock.patch.object(ipsets_mod, "BATCH_CHUNK", 2):  # and sets' deltas written a few at a time
            _run_ops(ops)


def _run_ops(ops) -> None:  # type: ignore[no-untyped-def]
    m = FakeMap(maps.IPSETS4.sized(1000))
    m.set(mt.ipset_key(424242, "10.1.1.1"), 1)  # an earlier run's stray
    w = BPFIPSets(m, IPSetIDAllocator(), v6=False)
    for op, name, nums in ops:
        members = [f"10.0.0.{n}" for n in nums]
        if op == "replace":
            w.replace(name, members)
        elif op == "add":
            w.add_members(name, members)
        elif op == "remove":
            w.remove_members(name, members)
        elif op == "drop":
            w.remove(name)
        elif op == "resync":
            w.queue_resync()
        elif op == "apply_fails":  # the (min(nums) + 1)-th element written fails: the rest is retried later
            _apply_failing_at(m, w, min(nums, default=0))
        else:
            w.apply()
            assert _members(m) == _want(w)
    w.apply()
    assert _members(m) == _want(w)
    assert w.apply() == (0, 0)


def _apply_failing_at(m: FakeMap, w: BPFIPSets, n: int) -> None:
    import errno

    real_set, calls = m.set, {"n": 0}

    def fails(key, value, flags=0):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == n + 1:
            raise maps.BPFSyscallError("BPF_MAP_UPDATE_ELEM", errno.ENOMEM)
        real_set(key, value, flags)

    m.set = fails  # type: ignore[method-assign]
    try:
        w.apply()
    except maps.WriteIncomplete:
        pass
    finally:
        m.set = real_set  # type: ignore[method-assign]


def test_sets_are_packed_from_a_full_update_or_a_quiet_cycle_and_unpacked_by_their_next_change() -> None:
    m = FakeMap(maps.IPSETS4.sized(10_000))
    w = BPFIPSets(m, IPSetIDAllocator(), v6=False)
    w.replace("s:quiet", [f"10.0.0.{i}" for i in range(100)])
    w.replace("s:busy", [f"10.1.0.{i}" for i in range(100)])
    w.replace("s:tiny", ["10.2.0.1"])
    # A full update holds a set packed from its arrival (#17); s:tiny is too small to bother.
    assert isinstance(w._desired["s:quiet"], bytes) and isinstance(w._desired["s:busy"], bytes)
    assert isinstance(w._desired["s:tiny"], set)
    assert w.apply() == (201, 0) and _members(m) == _want(w)
    assert w._desired["s:quiet"] is not None and not w._adds   # the whole set was its own delta, written
    w.add_members("s:busy", ["10.1.1.1"])
    assert isinstance(w._desired["s:busy"], set)               # a delta unpacks it
    w.apply()  # s:busy changed in this cycle: it stays a set until a quiet one
    assert isinstance(w._desired["s:quiet"], bytes) and len(w._desired["s:quiet"]) == 100 * 20
    assert isinstance(w._desired["s:busy"], set) and isinstance(w._desired["s:tiny"], set)
    assert w.size("s:quiet") == 100 and w.counts() == (3, 202) and "10.0.0.7" in (w.members_of("s:quiet") or ())
    w.remove_members("s:quiet", ["10.0.0.7"])  # a change unpacks it
    w.add_members("s:quiet", ["10.0.0.200"])
    assert isinstance(w._desired["s:quiet"], set) and w.apply() == (1, 1)
    assert _members(m) == _want(w)
    w.apply()
    w.apply()
    assert isinstance(w._desired["s:quiet"], bytes)
    w.replace("s:quiet", [f"10.0.0.{i}" for i in range(50, 150)])  # a replace of a packed set
    w.remove("s:busy")                                             # and a removal of a (by now) packed one
    assert w.apply() == (50, 151) and _members(m) == _want(w)
    w.queue_resync()
    w.apply()
    w.apply()
    m.delete(next(iter(_members(m))))  # a read-back over packed sets finds what is missing
    w.queue_resync()
    assert w.apply() == (1, 0) and _members(m) == _want(w)


def test_ipv6_sets_pack_and_decode_too() -> None:
    m = FakeMap(maps.IPSETS6.sized(1000))
    w = BPFIPSets(m, IPSetIDAllocator(), v6=True)
    members = [f"fd00:65::{i:x}" for i in range(1, 41)] + ["fd00:66::/64", "fd00:65::1,tcp:443"]
    w.replace("s:six", members)
    w.apply()
    w.apply()  # a quiet cycle: packed, 32-byte keys
    assert isinstance(w._desired["s:six"], bytes) and len(w._desired["s:six"]) == 42 * 32
    assert w.members_of("s:six") == frozenset(members) and _members(m) == _want(w)
    w.remove_members("s:six", ["fd00:66::/64"])
    w.add_members("s:six", ["fd00:67::1"])
    assert w.apply() == (1, 1) and _members(m) == _want(w)


def test_packed_keys_index_and_slice_as_the_list_of_keys_would() -> None:
    import pytest

    keys = [bytes([i]) * 4 for i in range(10)]
    pk = maps.PackedKeys(b"".join(keys), 4)
    assert len(pk) == 10 and list(pk) == keys and pk[3] == keys[3] and pk[-1] == keys[-1]
    assert list(pk[2:5]) == keys[2:5] and list(pk[8:20]) == keys[8:] and list(pk[5:2]) == []
    assert list(pk.items("v")[1:3]) == [(keys[1], "v"), (keys[2], "v")] and len(pk.items("v")) == 10
    with pytest.raises(IndexError):
        pk[10]
    with pytest.raises(ValueError):
        maps.PackedKeys(b"12345", 4)


def test_a_resync_over_packed_sets_counts_drift_per_set_and_repairs_it() -> None:
    """The refresh's believed state and read-back are held packed per set id (#17, memory); the drift they
    count is the symmetric difference, as a set of every key would give: lost and foreign members of a
    packed set, members of an id nobody has, a set changed (unpacked) while the read-back was queued."""
    m = FakeMap(maps.IPSETS4.sized(10_000))
    ids = IPSetIDAllocator()
    w = BPFIPSets(m, ids, v6=False)
    w.replace("s:a", [f"10.0.0.{i}" for i in range(100)])
    w.replace("s:b", [f"10.1.0.{i}" for i in range(100)])
    w.replace("s:c", [f"10.2.0.{i}" for i in range(100)])
    w.apply()
    assert all(isinstance(w._desired[n], bytes) for n in ("s:a", "s:b", "s:c"))
    a, b = ids.get_or_alloc("s:a"), ids.get_or_alloc("s:b")
    for i in (3, 4, 5):
        m.delete(mt.ipset_key(a, f"10.0.0.{i}"))                 # three lost from a packed set
    m.set(mt.ipset_key(a, "10.0.9.1"), 1)                        # two foreign under its id
    m.set(mt.ipset_key(a, "10.0.9.2"), 1)
    m.set(mt.ipset_key(424242, "10.7.7.7"), 1)                   # one under an id nobody has
    m.delete(mt.ipset_key(b, "10.1.0.9"))                        # one lost from s:b ...
    w.add_members("s:b", ["10.1.5.5"])                           # ... which changes meanwhile
    w.remove("s:c")                                              # and a set removed meanwhile
    w.queue_resync()
    assert w.apply() == (5, 103) and _members(m) == _want(w)
    assert w.take_drift() == 7
    w.queue_resync()                                             # nothing behind our back: no drift
    assert w.apply() == (0, 0) and w.take_drift() == 0


def test_a_restarted_writer_keeps_what_is_right_in_packed_sets_and_sweeps_the_rest() -> None:
    m = FakeMap(maps.IPSETS4.sized(10_000))
    ids = IPSetIDAllocator()
    first = BPFIPSets(m, ids, v6=False)
    first.replace("s:a", [f"10.0.0.{i}" for i in range(100)])
    first.replace("s:gone", [f"10.3.0.{i}" for i in range(50)])
    first.apply()
    m.set(mt.ipset_key(ids.get_or_alloc("s:a"), "10.0.9.1"), 1)  # a foreign member under s:a's id
    restarted = BPFIPSets(m, ids, v6=False)
    restarted.replace("s:a", [f"10.0.0.{i}" for i in range(2, 102)])
    assert restarted.apply() == (2, 53) and _members(m) == _want(restarted)
    assert restarted.take_drift() == 0                           # a start of day's sweep is not drift
