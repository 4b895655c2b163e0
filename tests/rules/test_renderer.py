"""The RuleRenderer facade: construction, marks, options and the IPVS endpoint-mark mapper."""

from __future__ import annotations

import pytest

from felixpy.config import Config
from felixpy.errors import ConfigError
from felixpy.rules import EndpointMarkMapper, RendererOptions, RuleRenderer
from felixpy.rules.epmark import PSEUDO_NON_CALI_ENDPOINT, fnv1_32


def test_construction() -> None:
    r = RuleRenderer(Config(), 6)
    assert r.ip_version == 6 and r.max_name_length == 28
    assert RuleRenderer(Config(NFTablesMode="Enabled"), 4).max_name_length == 256
    with pytest.raises(ValueError):
        RuleRenderer(Config(), 5)
    with pytest.raises(ConfigError):
        RuleRenderer(Config(IptablesMarkMask=0xF), 4)
    with pytest.raises(ConfigError):
        RuleRenderer(Config(IptablesMarkMask=0x1F), 4, options=RendererOptions(kube_ipvs_support=True))


def test_both_families_share_marks() -> None:
    r4 = RuleRenderer(Config(WireguardEnabled=True), 4)
    r6 = RuleRenderer(Config(WireguardEnabled=True), 6, marks=r4.marks)
    assert r4.marks is r6.marks and r4.marks.wireguard == 0x200000


def test_fnv1_matches_go_hash_fnv_new32() -> None:
    assert fnv1_32(b"") == 0x811C9DC5
    assert fnv1_32(b"a") == 0x050C5D7E       # FNV-1, not FNV-1a (0xe40c292c)
    assert fnv1_32(b"foobar") == 0x31F0B262


def test_endpoint_mark_mapper() -> None:
    mapper = EndpointMarkMapper(0xF00, 0x100)   # 4 bits: 16 positions, non-Cali = position 1
    marks = {n: mapper.get_endpoint_mark(n) for n in (f"cali{i}" for i in range(14))}
    assert len(set(marks.values())) == 14 and 0x100 not in marks.values()
    assert all(m is not None and m & ~0xF00 == 0 and m != 0 for m in marks.values())
    assert mapper.get_endpoint_mark("cali0") == marks["cali0"]  # stable
    assert mapper.get_endpoint_mark("one-too-many") is None    # 15 used + position 0 reserved
    mapper.release_endpoint_mark("cali3")
    assert mapper.get_endpoint_mark("one-too-many") == marks["cali3"]
    assert mapper.get_endpoint_mark("") is None
    assert not mapper.set_endpoint_mark("other", 0x100)        # taken by the pseudo endpoint
    assert mapper.set_endpoint_mark(PSEUDO_NON_CALI_ENDPOINT, 0x100)
