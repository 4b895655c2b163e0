"""Pinned maps across a restart into a different layout or size (real maps on a private bpffs).

A fresh :class:`MapSet` is what a new daemon opens: an unchanged map is reused with its entries; a
conntrack map whose configured size changed is rebuilt with every entry copied; a map pinned under an
older version of its name is converted through the upgrade chain (or dropped when a step has no
converter) and its pin removed; a map whose layout changed under the same name is replaced."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest

from felixpy.bpf import maps
from felixpy.bpf import maptypes as mt
from felixpy.bpf import syscall as sc

from .conftest import SMALL_SIZES

pytestmark = pytest.mark.kernel


@pytest.fixture
def root() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF syscalls, bpffs mount)")
    with maps.private_bpffs() as r:
        yield r


def ct_key(i: int) -> mt.CtKey4:
    k = mt.CtKey4()
    raw = bytearray(bytes(k))
    raw[0:4] = i.to_bytes(4, "little")
    return mt.CtKey4.from_buffer_copy(bytes(raw))


def fill_ct(ms: maps.MapSet, n: int) -> None:
    for i in range(n):
        v = mt.CtValue4()
        raw = bytearray(bytes(v))
        raw[0:8] = (1000 + i).to_bytes(8, "little")
        ms.ct(False).set(ct_key(i), bytes(raw))


def ct_values(ms: maps.MapSet) -> dict[bytes, bytes]:
    return {bytes(k): bytes(v) for k, v in ms.ct(False).items()}


def test_an_unchanged_map_is_reused_with_its_entries(root: str) -> None:
    ms = maps.MapSet(root, sizes=SMALL_SIZES).ensure()
    fill_ct(ms, 20)
    before, map_id = ct_values(ms), sc.map_info(ms.ct(False).fd).id
    ms.close()
    again = maps.MapSet(root, sizes=SMALL_SIZES).ensure()
    assert ct_values(again) == before and sc.map_info(again.ct(False).fd).id == map_id
    again.close()


def test_a_resized_conntrack_map_is_rebuilt_with_its_entries(root: str) -> None:
    ms = maps.MapSet(root, sizes=SMALL_SIZES).ensure()
    fill_ct(ms, 50)
    before = ct_values(ms)
    ms.close()
    bigger = maps.MapSet(root, sizes={**SMALL_SIZES, "cali_v4_ct4": 16384, "cali_v4_routes": 4096}).ensure()
    info = sc.map_info(bigger.ct(False).fd)
    assert info.max_entries == 16384 and ct_values(bigger) == before
    pinned = sc.obj_get(os.path.join(root, "cali_v4_ct4"))
    assert sc.map_info(pinned).id == info.id  # the pin is the new map
    os.close(pinned)
    # Other maps keep their pinned size (Felix resizes only what carries state worth copying).
    assert sc.map_info(bigger.routes(False).fd).max_entries == SMALL_SIZES["cali_v4_routes"]
    bigger.close()
    # Shrinking below the entry count keeps what fits.
    smaller = maps.MapSet(root, sizes={**SMALL_SIZES, "cali_v4_ct4": 16}).ensure()
    got = ct_values(smaller)
    assert 0 < len(got) <= 16 and all(before[k] == v for k, v in got.items())
    smaller.close()


OLD_VALUE = 72  # a made-up older conntrack value layout: the first 72 bytes of today's


def _pin_old_ct(root: str, version: int, n: int) -> None:
    fd = sc.map_create(sc.MAP_TYPE_HASH, ctypes.sizeof(mt.CtKey4), OLD_VALUE, 64, name=f"cali_v4_ct{version}")
    for i in range(n):
        sc.map_update(fd, bytes(ct_key(i)), (2000 + i).to_bytes(8, "little") + bytes(OLD_VALUE - 8))
    sc.obj_pin(fd, os.path.join(root, f"cali_v4_ct{version}"))
    os.close(fd)


def test_an_older_conntrack_version_is_migrated_and_its_pin_removed(root: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    size = ctypes.sizeof(mt.CtValue4)
    calls: list[int] = []

    def v3_to_v4(k: bytes, v: bytes) -> tuple[bytes, bytes] | None:
        calls.append(3)
        if int.from_bytes(v[:8], "little") == 2003:
            return None  # a converter may drop an entry it cannot express
        return k, v + bytes(size - len(v))

    monkeypatch.setitem(maps.UPGRADES, ("cali_v4_ct", 3), v3_to_v4)
    _pin_old_ct(root, 3, 10)
    _pin_old_ct(root, 2, 5)  # an even older one: only removed
    ms = maps.MapSet(root, sizes=SMALL_SIZES).ensure()
    got = ct_values(ms)
    assert len(calls) == 10 and len(got) == 9
    assert {int.from_bytes(v[:8], "little") for v in got.values()} == {2000 + i for i in range(10)} - {2003}
    assert all(v[OLD_VALUE:] == bytes(size - OLD_VALUE) for v in got.values())
    assert not os.path.exists(os.path.join(root, "cali_v4_ct3"))
    assert not os.path.exists(os.path.join(root, "cali_v4_ct2"))
    ms.close()


def test_an_older_version_without_a_converter_is_dropped(root: str) -> None:
    _pin_old_ct(root, 3, 4)
    ms = maps.MapSet(root, sizes=SMALL_SIZES).ensure()
    assert ct_values(ms) == {} and not os.path.exists(os.path.join(root, "cali_v4_ct3"))
    ms.close()


def test_a_changed_layout_under_the_same_name_is_replaced(root: str) -> None:
    fd = sc.map_create(sc.MAP_TYPE_HASH, 4, 8, 16, name="cali_iface4")
    sc.map_update(fd, (7).to_bytes(4, "little"), bytes(8))
    sc.obj_pin(fd, os.path.join(root, "cali_iface4"))
    os.close(fd)
    ms = maps.MapSet(root, sizes=SMALL_SIZES).ensure()
    info = sc.map_info(ms.ifstate.fd)
    assert info.value_size == ctypes.sizeof(mt.IfStateValue) and list(ms.ifstate.keys()) == []
    ms.close()


def test_only_a_map_this_process_made_with_nothing_copied_in_counts_as_created_empty(
        root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint driver skips its start-of-day sweep of a jump map made empty by this process; a
    reopened pin, a resized copy or an upgraded map may hold an earlier run's entries."""
    ms = maps.MapSet(root, sizes=SMALL_SIZES).ensure()
    assert ms.ct(False).created_empty and ms.ifstate.created_empty
    fill_ct(ms, 3)
    ms.close()
    again = maps.MapSet(root, sizes=SMALL_SIZES).ensure()
    assert not again.ct(False).created_empty and not again.ifstate.created_empty
    again.close()
    resized = maps.MapSet(root, sizes={**SMALL_SIZES, "cali_v4_ct4": 16384}).ensure()
    assert not resized.ct(False).created_empty
    resized.close()


def test_a_map_upgraded_from_an_older_version_is_not_created_empty(root: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    size = ctypes.sizeof(mt.CtValue4)
    monkeypatch.setitem(maps.UPGRADES, ("cali_v4_ct", 3), lambda k, v: (k, v + bytes(size - len(v))))
    _pin_old_ct(root, 3, 2)
    ms = maps.MapSet(root, sizes=SMALL_SIZES).ensure()
    assert len(ct_values(ms)) == 2 and not ms.ct(False).created_empty
    ms.close()
