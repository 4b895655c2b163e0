"""FakeMap semantics, and parity with the kernel for the same operations."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from felixpy.bpf import maps
from felixpy.bpf import maptypes as mt
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError
from felixpy.bpf.fake import FakeMap

SMALL_LPM = maps.IPSETS4.sized(16)
SMALL_HASH = maps.IFSTATE.sized(2)
COUNTERS = maps.COUNTERS.sized(4)


def ops(m: maps.BPFMap) -> list[object]:
    """A script of operations; returns observations to compare between implementations."""
    out: list[object] = []
    m.set(mt.ipset_key(1, "10.0.0.0", 8), ctypes.c_uint32(1))
    m.set(mt.ipset_key(1, "10.1.0.0", 16), ctypes.c_uint32(2))
    m.set(mt.ipset_key(2, "10.1.2.3", port=80, protocol=6), ctypes.c_uint32(3))
    for addr, port, proto, sid in (("10.1.2.3", 0, 0, 1), ("10.2.0.1", 0, 0, 1),
                                   ("11.0.0.1", 0, 0, 1), ("10.1.2.3", 80, 6, 2),
                                   ("10.1.2.3", 81, 6, 2), ("10.1.2.3", 80, 17, 2)):
        k = mt.ipset_key(sid, addr, port=port, protocol=proto)
        k.prefixlen = mt.IPSET_FULL_PREFIX_V4
        v = m.get(k)
        out.append(None if v is None else v.value)
    with pytest.raises(BPFSyscallError) as ei:
        m.set(mt.ipset_key(1, "10.0.0.0", 8), ctypes.c_uint32(1), sc.NOEXIST)
    out.append(ei.value.errno)
    out.append(m.delete(mt.ipset_key(1, "10.0.0.0", 8)))
    out.append(m.delete(mt.ipset_key(1, "10.0.0.0", 8)))
    out.append(sorted(bytes(k).hex() for k in m.keys()))
    return out


def test_fake_lpm_semantics() -> None:
    obs = ops(FakeMap(SMALL_LPM))
    assert obs[:6] == [2, 1, None, 3, None, None]
    assert obs[6] == errno.EEXIST and obs[7:9] == [True, False]


def test_fake_hash_limits_and_failure_injection() -> None:
    m = FakeMap(SMALL_HASH)
    m.set(1, mt.ifstate_value(1))
    m.set(2, mt.ifstate_value(2))
    with pytest.raises(BPFSyscallError) as ei:
        m.set(3, mt.ifstate_value(3))
    assert ei.value.errno == errno.E2BIG
    m.fail_next_update = errno.ENOMEM
    with pytest.raises(BPFSyscallError):
        m.set(1, mt.ifstate_value(9))
    assert m.get(1).flags == 1
    with pytest.raises(BPFSyscallError):
        m.set(4, mt.ifstate_value(1), sc.EXIST)


def test_fake_delete_many_is_the_one_by_one_loop_and_a_failing_key_stops_it() -> None:
    m = FakeMap(SMALL_HASH.sized(8))
    for i in range(5):
        m.set(i, mt.ifstate_value(i))
    assert m.delete_many([0, 7, 1, 1, 2]) == 3  # absent and repeated keys skipped, as delete() skips them
    assert sorted(m.raw_keys()) == [bytes(ctypes.c_uint32(i)) for i in (3, 4)]
    m.fail_deletes[bytes(ctypes.c_uint32(4))] = errno.EBUSY
    with pytest.raises(maps.WriteIncomplete) as ei:
        m.delete_many([3, 4, 9])
    assert (ei.value.done, ei.value.errno) == (1, errno.EBUSY)
    assert list(m.raw_keys()) == [bytes(ctypes.c_uint32(4))]  # stopped at the failing key: it stays


def test_fake_percpu() -> None:
    m = FakeMap(COUNTERS)
    maps.ensure_counters(m, 5, 0)
    maps.ensure_counters(m, 5, 0)  # idempotent
    assert maps.counters_total(m, 5, 0) == [0] * 27
    v = m.get(mt.CountersKey(5, 0))
    assert len(v) == sc.possible_cpus()


def test_percpu_single_value_is_written_to_every_cpu_at_its_stride() -> None:
    # A 12-byte value sits at an 8-byte-aligned stride (16) per possible CPU; one value is copied to
    # each CPU's slot, its padding zero, and a list gives each CPU its own.
    val3 = ctypes.c_uint32 * 3
    m = FakeMap(maps.MapSpec("t_pcpu", 1, sc.MAP_TYPE_PERCPU_HASH, ctypes.c_uint32, val3, 8))
    n = sc.possible_cpus()
    m.set(1, val3(1, 2, 3))
    assert m._d[bytes(ctypes.c_uint32(1))] == (bytes(val3(1, 2, 3)) + bytes(4)) * n
    assert [list(v) for v in m.get(1)] == [[1, 2, 3]] * n
    m.set(2, [val3(i, 0, 7) for i in range(n)])
    assert [list(v) for v in m.get(2)] == [[i, 0, 7] for i in range(n)]
    with pytest.raises(ValueError):
        m.set(3, b"\x00" * 8)  # the wrong size for one CPU's value, however many CPUs there are


def test_map_spec_derived_values_follow_the_fields() -> None:
    spec = maps.MapSpec("cali_t", 3, sc.MAP_TYPE_PERCPU_HASH, mt.CountersKey, mt.CountersValue, 10)
    assert (spec.name, spec.key_size, spec.value_size, spec.percpu) == \
        ("cali_t3", ctypes.sizeof(mt.CountersKey), ctypes.sizeof(mt.CountersValue), True)
    bigger = spec.sized(20)
    assert (bigger.name, bigger.max_entries, bigger.percpu) == ("cali_t3", 20, True)
    assert bigger != spec and spec.sized(10) == spec and hash(spec.sized(10)) == hash(spec)
    with pytest.raises(ValueError, match="too long"):
        _ = maps.MapSpec("cali_much_too_long", 2, sc.MAP_TYPE_HASH, ctypes.c_uint32, ctypes.c_uint32, 1).name


@pytest.mark.kernel
def test_kernel_map_matches_fake() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    real = maps.Map.create(SMALL_LPM)
    try:
        assert ops(real) == ops(FakeMap(SMALL_LPM))
    finally:
        real.close()


@pytest.mark.kernel
def test_pinned_maps_are_recognised_and_layout_checked() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    with maps.private_bpffs() as root:
        ms = maps.MapSet(root, sizes={"cali_v4_ct4": 64, "cali_v6_ct4": 64}).ensure()
        ms.ifstate.set(7, mt.ifstate_value(3, "eth0"))
        ms.close()
        # A fresh "process" finds them by pin path and kernel name, contents intact.
        ms2 = maps.MapSet(root, sizes={"cali_v4_ct4": 64, "cali_v6_ct4": 64}).ensure()
        assert ms2.ifstate.get(7).name == b"eth0"
        info = sc.map_info(ms2.ifstate.fd)
        assert info.name == "cali_iface4" and info.value_size == 52
        assert ms2.ct(False).spec.max_entries == 64
        ms2.close()
        # A pin with a different layout under our name is replaced.
        os.unlink(os.path.join(root, "cali_iface4"))
        bad = maps.Map.create(maps.MapSpec("cali_iface", 4, sc.MAP_TYPE_HASH, ctypes.c_uint32,
                                           ctypes.c_uint64, 10, sc.F_NO_PREALLOC))
        sc.obj_pin(bad.fd, os.path.join(root, "cali_iface4"))
        bad.close()
        ms3 = maps.MapSet(root, sizes={"cali_v4_ct4": 64, "cali_v6_ct4": 64}).ensure()
        assert sc.map_info(ms3.ifstate.fd).value_size == 52
        ms3.close()
