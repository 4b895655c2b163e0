"""Batched map read-back and deletes (``BPF_MAP_LOOKUP_BATCH`` / ``BPF_MAP_DELETE_BATCH``) on real
kernel maps of every type felixpy uses: the batched walk returns exactly what the get-next-key walk
returns (more than one chunk, an empty map, per-CPU values), ``delete_many`` equals the one-by-one
loop (absent keys included), map types the kernel refuses batches for fall back, and the IP-set writer
and conntrack scanner work through them.  Unpinned maps, closed after each test."""

from __future__ import annotations

import ctypes
import errno
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from felixpy.bpf import maps
from felixpy.bpf import maptypes as mt
from felixpy.bpf import syscall as sc
from felixpy.bpf.fake import FakeMap
from felixpy.bpf.ipsets import BPFIPSets, IPSetIDAllocator, member_key_bytes
from felixpy.drivers.bpfconntrack.scanner import ConntrackScanner

pytestmark = pytest.mark.kernel

CHUNK = 64  # BATCH_CHUNK in these tests: a few hundred entries are several chunks
N = 300
u64 = ctypes.c_uint64


@pytest.fixture(autouse=True)
def _root_and_small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF syscalls)")
    monkeypatch.setattr(maps, "BATCH_CHUNK", CHUNK)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times each bpf(2) map command the walks and deletes use was issued."""
    counts = {"lookup_batch": 0, "delete_batch": 0, "next_key": 0, "delete": 0}
    for name, fn in (("lookup_batch", "map_lookup_batch"), ("delete_batch", "map_delete_batch"),
                     ("next_key", "map_next_key"), ("delete", "map_delete")):
        real = getattr(sc, fn)

        def counting(*a: Any, _real: Callable[..., Any] = real, _name: str = name) -> Any:
            counts[_name] += 1
            return _real(*a)

        monkeypatch.setattr(sc, fn, counting)
    return counts


def _ncpu_values(vt: Any, i: int) -> list[Any]:
    return [vt(i * 1000 + cpu) for cpu in range(sc.possible_cpus())]


def _ct_value(i: int) -> Any:
    v = mt.CtValue4()
    v.last_seen = i
    return v


def _counters_value(i: int) -> list[Any]:
    vals = []
    for cpu in range(sc.possible_cpus()):
        v = mt.CountersValue()
        v.c[0], v.c[1] = i, cpu
        vals.append(v)
    return vals


# (spec, the i-th entry's key and value): every value differs, so a key paired with the wrong value shows.
ArrayU64 = maps.MapSpec("t_array", 1, sc.MAP_TYPE_ARRAY, ctypes.c_uint32, u64, N)
PercpuArrayU64 = maps.MapSpec("t_pcpu_array", 1, sc.MAP_TYPE_PERCPU_ARRAY, ctypes.c_uint32, u64, N)
ENTRIES: dict[str, tuple[maps.MapSpec, Callable[[int], tuple[Any, Any]]]] = {
    "lpm_v4": (maps.IPSETS4.sized(4 * N), lambda i: (mt.ipset_key(7, f"10.1.{i >> 8}.{i & 255}"), ctypes.c_uint32(i))),
    "lpm_v6": (maps.IPSETS6.sized(4 * N), lambda i: (mt.ipset_key(7, f"fd00::{i:x}", v6=True), ctypes.c_uint32(i))),
    "lru_hash": (maps.CT4.sized(4 * N), lambda i: (mt.ct_key(17, "10.0.0.1", 1000 + i, "10.0.0.2", 53), _ct_value(i))),
    "hash": (maps.IFSTATE.sized(4 * N), lambda i: (ctypes.c_uint32(i), mt.ifstate_value(i))),
    "percpu_hash": (maps.COUNTERS.sized(4 * N), lambda i: (mt.CountersKey(i, 0), _counters_value(i))),
    "array": (ArrayU64, lambda i: (ctypes.c_uint32(i), u64(i * 7))),
    "percpu_array": (PercpuArrayU64, lambda i: (ctypes.c_uint32(i), _ncpu_values(u64, i))),
}


def _filled(kind: str, n: int) -> maps.Map:
    spec, entry = ENTRIES[kind]
    m = maps.Map.create(spec)
    for i in range(n):
        m.set(*entry(i))
    return m


def _canon(kv: tuple[Any, Any]) -> tuple[bytes, Any]:
    k, v = kv
    return bytes(k), tuple(bytes(x) for x in v) if isinstance(v, list) else bytes(v)


def _walks(m: maps.Map) -> list[list[Any]]:
    """raw_keys, raw_items, keys and items, comparable."""
    return [list(m.raw_keys()), list(m.raw_items()), [bytes(k) for k in m.keys()], [_canon(kv) for kv in m.items()]]


@pytest.mark.parametrize("kind", list(ENTRIES))
@pytest.mark.parametrize("n", [N, 0], ids=["several_chunks", "empty"])
def test_batched_walk_returns_what_get_next_key_returns(kind: str, n: int, calls: dict[str, int]) -> None:
    m = _filled(kind, n)
    try:
        batched = _walks(m)
        assert not m._no_batch and calls["next_key"] == 0  # every walk was batched...
        size = m.spec.max_entries if m.spec.map_type in (sc.MAP_TYPE_ARRAY, sc.MAP_TYPE_PERCPU_ARRAY) else n
        # ...in at least size / CHUNK calls each (a hash walk ends a chunk at a bucket's end); an empty
        # map is one call, answered ENOENT with count 0.
        assert calls["lookup_batch"] >= 4 * max(1, -(-size // CHUNK))
        m._no_batch = True
        by_next_key = _walks(m)
        assert calls["next_key"] > 0
        for got, want in zip(batched, by_next_key, strict=True):
            assert len(got) == size and sorted(got) == sorted(want)
        if kind.startswith("percpu") and n:
            assert len(next(iter(m.items()))[1]) == sc.possible_cpus()
    finally:
        m.close()


def test_lpm_walk_ends_on_the_kernels_partial_last_batch(calls: dict[str, int]) -> None:
    """A map of CHUNK * 2 + 5 entries: the third call returns the last 5 with ENOENT -- they are kept."""
    m = _filled("lpm_v4", 2 * CHUNK + 5)
    try:
        assert len(set(m.raw_keys())) == 2 * CHUNK + 5 and calls["lookup_batch"] == 3
    finally:
        m.close()


def test_a_map_type_without_batch_lookups_is_walked_by_get_next_key(calls: dict[str, int]) -> None:
    m = maps.Map.create(maps.PROGS_ING.sized(10))  # PROG_ARRAY: the kernel has no batch operations for it
    try:
        assert list(m.raw_keys()) == [i.to_bytes(4, "little") for i in range(10)]
        assert m._no_batch and calls["lookup_batch"] == 1  # refused once, then never asked again
        assert len(list(m.raw_keys())) == 10 and calls["lookup_batch"] == 1
    finally:
        m.close()


def test_refused_batch_commands_report_nothing_done() -> None:
    """The kernel leaves the count as passed when it refuses a batch command up front: that is none
    done, not all of them."""
    arr = maps.Map.create(ArrayU64)
    h = maps.Map.create(maps.IFSTATE.sized(8))
    try:
        with pytest.raises(sc.BatchIncomplete) as exc:
            sc.map_delete_batch(arr.fd, bytes(12), 3)  # arrays have no batch delete
        assert exc.value.errno in maps._NO_BATCH_ERRNOS and exc.value.done == 0
        with pytest.raises(sc.BatchIncomplete) as exc:
            sc.map_update_batch(h.fd, bytes(12), bytes(3 * h.spec.value_size), 3, flags=1 << 10)  # bad flags
        assert exc.value.errno == errno.EINVAL and exc.value.done == 0
        assert list(h.raw_keys()) == []
    finally:
        arr.close()
        h.close()


def _delete_script(kind: str) -> tuple[list[Any], set[bytes]]:
    """Keys to delete over a map of N entries: absent ones first, in the middle, in a row, repeated and
    last; and the keys that must be left."""
    _, entry = ENTRIES[kind]

    def key(i: int) -> Any:
        return entry(i)[0]

    present = list(range(0, N, 2))
    todo = [key(N + 1)] + [key(i) for i in present[:100]] + [key(N + 2), key(N + 3), key(4)]
    todo += [key(i) for i in present[100:140]] + [key(N + 4)]
    left = {bytes(key(i)) for i in range(N) if i % 2 or i >= 280}
    return todo, left


@pytest.mark.parametrize("kind", ["lpm_v4", "lpm_v6", "hash", "lru_hash", "percpu_hash"])
def test_delete_many_skips_absent_keys_as_the_one_by_one_loop_does(kind: str, calls: dict[str, int]) -> None:
    todo, left = _delete_script(kind)
    m = _filled(kind, N)
    fake = FakeMap(m.spec)
    for k, v in m.items():
        fake.set(k, v)
    try:
        assert m.delete_many(todo) == 140 == fake.delete_many(todo)
        assert set(m.raw_keys()) == left == set(fake.raw_keys())
        # Batched: one call per chunk plus one per absent key (where the kernel stopped), none one by one.
        assert calls["delete"] == 0 and calls["delete_batch"] <= 3 + 5 and not m._no_batch
        assert m.delete_many([]) == 0 and m.delete_many(todo[:2]) == 0
    finally:
        m.close()


def test_delete_many_fallback_one_by_one(calls: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced (``_no_batch``) and where the kernel refuses the batch: the same result, one delete a key."""
    todo, left = _delete_script("lpm_v4")
    m = _filled("lpm_v4", N)
    try:
        m._no_batch = True
        assert m.delete_many(todo) == 140 and set(m.raw_keys()) == left
        assert calls["delete_batch"] == 0 and calls["delete"] == len(todo)
    finally:
        m.close()

    def refusing(fd: int, keys: bytes, count: int) -> None:
        raise sc.BatchIncomplete("MAP_DELETE_BATCH", 524, 0)

    monkeypatch.setattr(sc, "map_delete_batch", refusing)
    m = _filled("lpm_v4", N)
    try:
        assert m.delete_many(todo) == 140 and set(m.raw_keys()) == left and m._no_batch
    finally:
        m.close()


def test_delete_many_stopped_by_a_bad_key_raises_its_index_and_keeps_the_rest() -> None:
    """A key the kernel cannot delete (an LPM prefix longer than the key: EINVAL) midway through a batch:
    the keys before it are gone, it and those after it are not, and ``done`` says where."""
    m = _filled("lpm_v4", N)
    keys = [bytes(ENTRIES["lpm_v4"][1](i)[0]) for i in range(N)]
    bad = bytearray(keys[0])
    bad[0:4] = (9999).to_bytes(4, "little")
    try:
        with pytest.raises(maps.WriteIncomplete) as exc:
            m.delete_many(keys[:100] + [bytes(bad)] + keys[100:150])
        assert exc.value.done == 100 and exc.value.errno == errno.EINVAL
        assert set(m.raw_keys()) == set(keys[100:]) and not m._no_batch
    finally:
        m.close()


def test_ipset_writer_reads_back_and_sweeps_a_big_map_in_batches(calls: dict[str, int]) -> None:
    """A restarted writer reads an earlier run's members back and deletes the sets nobody wants any more
    (mark-and-sweep), a syscall per chunk; what it keeps is not rewritten."""
    m = maps.Map.create(maps.IPSETS4.sized(2000))
    try:
        ids = IPSetIDAllocator()
        first = BPFIPSets(m, ids, v6=False)
        first.replace("s:keep", [f"10.0.{i >> 8}.{i & 255}" for i in range(300)])
        first.replace("s:gone", [f"10.9.{i >> 8}.{i & 255}" for i in range(500)])
        assert first.apply() == (800, 0)
        restarted = BPFIPSets(m, ids, v6=False)
        restarted.replace("s:keep", [f"10.0.{i >> 8}.{i & 255}" for i in range(300)])
        calls.update(dict.fromkeys(calls, 0))
        assert restarted.apply() == (0, 500)
        assert calls["lookup_batch"] == 800 // CHUNK + 1 and calls["next_key"] == 0
        assert calls["delete_batch"] == -(-500 // CHUNK) and calls["delete"] == 0
        sid = ids.get_or_alloc("s:keep")
        assert set(m.raw_keys()) == {member_key_bytes(sid, f"10.0.{i >> 8}.{i & 255}", False) for i in range(300)}
    finally:
        m.close()


def _ct_fill(m: maps.Map, n: int, *, last_seen: int, base: int) -> list[bytes]:
    keys = []
    for i in range(base, base + n):
        k = bytes(mt.ct_key(17, f"10.2.{i >> 8 & 255}.{i & 255}", 1000 + i, "10.3.0.1", 53))
        v = mt.CtValue4()
        v.last_seen = last_seen
        m.set(k, v, sc.NOEXIST)
        keys.append(k)
    return keys


def test_conntrack_scan_walks_the_map_in_batches_and_deletes_exactly_the_expired(calls: dict[str, int]) -> None:
    """The scanner's walk is lazy and batched; it deletes after the walk, so every entry is judged once
    (``used`` is the map's size, not more) and only the expired go."""
    m = maps.Map.create(maps.CT4.sized(4096))
    try:
        now = time.monotonic_ns()
        live = _ct_fill(m, 700, last_seen=now, base=0)
        _ct_fill(m, 900, last_seen=now - 61 * 1_000_000_000, base=1000)
        res = ConntrackScanner(4, m, background=False).scan()
        assert (res.used, res.expired, res.cleaned) == (1600, 900, 900)
        assert sorted(m.raw_keys()) == sorted(live)
        assert calls["lookup_batch"] >= 1600 // CHUNK and calls["next_key"] == 0
    finally:
        m.close()


def test_walk_chunks_never_exceed_the_chunk_size() -> None:
    m = _filled("hash", N)
    try:
        sizes = [n for _, _, n in m._chunks()]
        assert sum(sizes) == N and max(sizes) <= CHUNK and len(sizes) >= N // CHUNK
    finally:
        m.close()


def test_lookup_batch_asks_for_more_when_a_hash_bucket_is_bigger_than_the_count() -> None:
    """16 entries in a hash map's 16 buckets, read one element a call: some bucket holds two (all distinct
    has a chance of 16!/16**16, about 1e-6), which the kernel refuses with ENOSPC -- the call asks again
    for more and the walk still returns every entry once."""
    m = maps.Map.create(maps.IFSTATE.sized(16))
    try:
        for i in range(16):
            m.set(i, mt.ifstate_value(i))
        cursor: bytes | None = None
        keys: list[bytes] = []
        sizes = []
        while True:
            packed, _, n, cursor = sc.map_lookup_batch(m.fd, cursor, 1, 4, m.spec.value_size)
            keys += [packed[i * 4:(i + 1) * 4] for i in range(n)]
            sizes.append(n)
            if cursor is None:
                break
        assert sorted(keys) == sorted(bytes(ctypes.c_uint32(i)) for i in range(16)) and max(sizes) > 1
    finally:
        m.close()


def test_packed_keys_are_written_and_deleted_in_batches_like_a_list(calls: dict[str, int]) -> None:
    """The IP-set writer hands the map its keys packed (:class:`maps.PackedKeys`, no object per key): the
    same entries as the same keys as a list, a syscall per chunk, in the kernel and in the fake."""
    spec, entry = ENTRIES["lpm_v4"]
    raw = [bytes(entry(i)[0]) for i in range(N)]
    packed = maps.PackedKeys(b"".join(raw), spec.key_size)
    present = ctypes.c_uint32(1)
    m = maps.Map.create(spec)
    fake = FakeMap(spec)
    try:
        for target in (m, fake):
            target.set_many(packed.items(present))
            assert set(target.raw_keys()) == set(raw)
            assert target.delete_many(packed[:100]) == 100 and set(target.raw_keys()) == set(raw[100:])
        assert calls["delete_batch"] == -(-100 // CHUNK) and calls["delete"] == 0 and not m._no_batch
    finally:
        m.close()
