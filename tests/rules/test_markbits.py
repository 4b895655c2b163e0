"""Mark-bit allocation (reference §2.7): lowest bits of the mask first, Felix's order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from felixpy import markbits
from felixpy.bpf import defs
from felixpy.config import Config
from felixpy.errors import ConfigError
from felixpy.markbits import MarkBitsManager, allocate


def test_default_mask_matches_felix() -> None:
    m = allocate(0xFFFF0000)
    assert (m.accept, m.pass_, m.drop, m.scratch0, m.scratch1) == (0x10000, 0x20000, 0x40000, 0x80000, 0x100000)
    assert m.wireguard == 0
    assert m.endpoint == 0xFFE00000
    assert m.all_calico == 0x1B0000  # accept|pass|scratch0|scratch1, not drop
    assert m.non_calico_endpoint == 0x200000


def test_wireguard_takes_the_next_bit() -> None:
    m = allocate(0xFFFF0000, wireguard=True)
    assert m.wireguard == 0x200000
    assert m.endpoint == 0xFFC00000
    assert m.non_calico_endpoint == 0x400000


@pytest.mark.parametrize(("mask", "expected"), [
    (0x1F, (0x1, 0x2, 0x4, 0x8, 0x10, 0)),                       # exactly five bits: no endpoint block
    (0xFF, (0x1, 0x2, 0x4, 0x8, 0x10, 0xE0)),
    (0xF00F0000, (0x10000, 0x20000, 0x40000, 0x80000, 0x10000000, 0xE0000000)),  # non-contiguous
    (0x80000001 | 0x000F0000, (0x1, 0x10000, 0x20000, 0x40000, 0x80000, 0x80000000)),
])
def test_several_masks(mask: int, expected: tuple[int, ...]) -> None:
    m = allocate(mask)
    assert (m.accept, m.pass_, m.drop, m.scratch0, m.scratch1, m.endpoint) == expected
    bits = [m.accept, m.pass_, m.drop, m.scratch0, m.scratch1, m.endpoint]
    assert sum(bits) == mask  # disjoint and covering


@pytest.mark.parametrize("mask", [0, 0x1, 0xF, 0xF0000000, 0x10101])
def test_too_small_masks_are_a_clear_config_error(mask: int) -> None:
    with pytest.raises(ConfigError, match="IptablesMarkMask/NftablesMarkMask"):
        allocate(mask)


def test_wireguard_needs_a_sixth_bit() -> None:
    allocate(0x1F)
    with pytest.raises(ConfigError, match="WireGuard"):
        allocate(0x1F, wireguard=True)


def test_ipvs_needs_endpoint_bits() -> None:
    with pytest.raises(ConfigError, match="endpoint mark"):
        allocate(0x1F, need_endpoint_bits=True)
    assert allocate(0x3F, need_endpoint_bits=True).endpoint == 0x20


def test_from_config_uses_the_active_backend_mask() -> None:
    assert markbits.from_config(Config(IptablesMarkMask=0xFF)).accept == 1
    nft = Config(NFTablesMode="Enabled", NftablesMarkMask=0xFF00, IptablesMarkMask=0xFF)
    assert markbits.from_config(nft).accept == 0x100
    assert markbits.from_config(Config(WireguardEnabledV6=True)).wireguard == 0x200000


def test_bpf_mode_allocates_around_the_programs_marks() -> None:
    m = markbits.from_config(Config(BPFEnabled=True, WireguardEnabled=True))
    assert (m.accept, m.pass_, m.drop, m.scratch0, m.scratch1, m.wireguard) == (
        0x10000, 0x20000, 0x40000, 0x80000, 0x20000000, 0x40000000)
    assert m.endpoint == 0x80000000
    used = m.accept | m.pass_ | m.drop | m.scratch0 | m.scratch1 | m.wireguard | m.endpoint
    assert used & markbits.BPF_PROGRAM_MARKS == 0
    # Every mark the programs set is inside the reserved bits.
    for mark in (defs.MARK_SEEN, defs.MARK_BYPASS_MASK, defs.MARK_BYPASS_XDP, defs.MARK_FALLTHROUGH,
                 defs.MARK_NAT_OUT, defs.MARK_MASQ, defs.MARK_SKIP_FIB, defs.MARK_CT_ESTABLISHED_MASK):
        assert mark & ~markbits.BPF_PROGRAM_MARKS == 0, hex(mark)
    # Outside BPF mode the same mask allocates as before.
    assert markbits.from_config(Config(WireguardEnabled=True)).scratch1 == 0x100000


@pytest.mark.parametrize("nft", [False, True])
def test_bpf_mode_needs_the_mask_to_cover_the_programs_marks(nft: bool) -> None:
    def config(bpf: bool) -> Config:
        if nft:
            return Config(BPFEnabled=bpf, NFTablesMode="Enabled", NftablesMarkMask=0xFFF0000)
        return Config(BPFEnabled=bpf, IptablesMarkMask=0xFFF0000)
    with pytest.raises(ConfigError, match=r"does not cover 0x1ff00000.*missing 0x10000000"):
        markbits.from_config(config(True))
    assert markbits.from_config(config(False)).scratch1 == 0x100000  # fine without BPF


def test_number_mark_mapping() -> None:
    mgr = MarkBitsManager(0xF00)
    assert mgr.map_number_to_mark(5) == 0x500
    assert mgr.map_mark_to_number(0xA00) == 10
    with pytest.raises(ValueError):
        mgr.map_number_to_mark(16)
    with pytest.raises(ValueError):
        mgr.map_mark_to_number(0x1000)


@given(st.integers(min_value=0, max_value=0xFFFFFFFF), st.data())
def test_number_mark_roundtrip(mask: int, data: st.DataObject) -> None:
    mgr = MarkBitsManager(mask)
    n = data.draw(st.integers(min_value=0, max_value=(1 << mask.bit_count()) - 1))
    mark = mgr.map_number_to_mark(n)
    assert mark & ~mask == 0
    assert mgr.map_mark_to_number(mark) == n


@given(st.integers(min_value=0, max_value=0xFFFFFFFF), st.booleans())
def test_allocation_never_overlaps(mask: int, wg: bool) -> None:
    try:
        m = allocate(mask, wireguard=wg)
    except ConfigError:
        assert mask.bit_count() < (6 if wg else 5)
        return
    parts = [m.accept, m.pass_, m.drop, m.scratch0, m.scratch1, m.wireguard, m.endpoint]
    seen = 0
    for p in parts:
        assert p & seen == 0
        seen |= p
    assert seen == mask
    assert all(p & (p - 1) == 0 for p in parts[:5])  # single bits
    assert m.accept < m.pass_ < m.drop < m.scratch0 < m.scratch1  # lowest first
