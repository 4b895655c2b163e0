"""Chain, policy, NFLOG-prefix and IP-set names, at and over the length limits.

Golden values are recomputed here from the documented algorithm (SHA-256, URL-safe unpadded
base64, ``prefix + "_" + hash`` cut to the limit) and a few are pinned as literals.
"""

from __future__ import annotations

import base64
import hashlib

import pytest

from felixpy.drivers.ipsets.naming import IPVersionConfig
from felixpy.rules import nflog
from felixpy.rules.ipset_names import main_ipset_name, owns_ipset, temp_ipset_name
from felixpy.rules.names import (
    ALL_INTERFACES,
    POLICY_INBOUND_PFX,
    PROFILE_OUTBOUND_PFX,
    PolicyID,
    ProfileID,
    endpoint_chain_name,
    length_limited_id,
    policy_chain_name,
    profile_chain_name,
)


def b64sha256(s: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(s.encode()).digest()).decode().replace("=", "")


def expected(prefix: str, suffix: str, limit: int) -> str:
    if len(prefix) + len(suffix) > limit or (len(prefix) + len(suffix) == limit and suffix.startswith("_")):
        return prefix + "_" + b64sha256(suffix)[: limit - 1 - len(prefix)]
    return prefix + suffix


@pytest.mark.parametrize("iface", [
    "cali12345678901",            # typical: 8 + 15 = 23
    "c" * 20,                     # exactly 28: kept
    "_" + "c" * 19,               # exactly 28 but starts with "_": hashed
    "c" * 21,                     # 29: hashed
    "x",
    "",                           # empty: becomes "_", then fits
])
def test_endpoint_chain_names_iptables(iface: str) -> None:
    name = endpoint_chain_name("cali-tw-", iface, 28)
    assert name == expected("cali-tw-", iface or "_", 28)
    assert len(name) <= 28


def test_literal_goldens() -> None:
    assert endpoint_chain_name("cali-tw-", "cali1234567890123456789", 28) == "cali-tw-_JfKvYDkCYbU_Dud1BPm"
    assert endpoint_chain_name("cali-tw-", "_abcdefghijklmnopqrst", 28) == "cali-tw-_bdUt1kQqftbM-IM84G2"
    assert endpoint_chain_name("cali-fh-", ALL_INTERFACES, 28) == "cali-fh-any-interface-at-all"
    assert endpoint_chain_name("cali-thfw-", ALL_INTERFACES, 28) == "cali-thfw-_Nqh4HyA73udmyanQI"
    pol = PolicyID("my-very-long-policy-name", kind="GlobalNetworkPolicy")
    assert policy_chain_name(POLICY_INBOUND_PFX, pol, 28) == "cali-pi-_5cXH7HnqEtmvEVfnV96"


def test_nftables_limit_keeps_long_names() -> None:
    iface = "c" * 100
    assert endpoint_chain_name("cali-tw-", iface, 256) == "cali-tw-" + iface
    long_ = "c" * 249
    assert endpoint_chain_name("cali-tw-", long_, 256) == expected("cali-tw-", long_, 256)
    assert len(endpoint_chain_name("cali-tw-", long_, 256)) == len("cali-tw-_") + 43  # the whole hash fits


def test_length_limited_id_rejects_impossible_limits() -> None:
    with pytest.raises(ValueError):
        length_limited_id("cali-tw-", "x" * 40, 9)


@pytest.mark.parametrize(("kind", "ns", "ident"), [
    ("GlobalNetworkPolicy", "", "gnp/p"),
    ("NetworkPolicy", "ns1", "np/ns1/p"),
    ("StagedNetworkPolicy", "ns1", "snp/ns1/p"),
    ("StagedGlobalNetworkPolicy", "", "sgnp/p"),
    ("StagedKubernetesNetworkPolicy", "ns", "sknp/ns/p"),
    ("KubernetesNetworkPolicy", "ns", "knp/ns/p"),
    ("KubernetesClusterNetworkPolicy", "", "kcnp/p"),
    ("SomethingNew", "", "SomethingNew/p"),
])
def test_policy_ids(kind: str, ns: str, ident: str) -> None:
    p = PolicyID("p", ns, kind)
    assert p.id() == ident
    assert policy_chain_name(POLICY_INBOUND_PFX, p, 28) == expected("cali-pi-", ident, 28)
    assert p.staged == kind.startswith("Staged")


def test_policy_id_strings() -> None:
    p = PolicyID("web", "prod", "NetworkPolicy")
    assert p.go_string() == "{Name: web, Namespace: prod, Kind: NetworkPolicy}"
    assert p.describe() == "NetworkPolicy prod/web"
    assert PolicyID("x", kind="GlobalNetworkPolicy").describe() == "GlobalNetworkPolicy x"


def test_profile_chain_names() -> None:
    assert profile_chain_name(PROFILE_OUTBOUND_PFX, ProfileID("kns.default"), 28) == "cali-pro-kns.default"
    long_ = "ksa.kube-system.some-service-account"
    assert profile_chain_name(PROFILE_OUTBOUND_PFX, long_, 28) == expected("cali-pro-", long_, 28)


def test_nflog_prefixes() -> None:
    assert nflog.rule_prefix("A", "P", "I", 0, "gnp/policy-1.2.3") == "API0|gnp/policy-1.2.3"
    assert nflog.rule_prefix("D", "R", "E", 3, "profile-1") == "DRE3|profile-1"
    assert nflog.end_of_tier_drop_prefix("I", "default") == "DPI|default"
    assert nflog.end_of_tier_pass_prefix("E", "t1") == "PPE|t1"
    assert nflog.no_profile_match_prefix("E") == "DRE"


@pytest.mark.parametrize("length", [62, 63, 64, 100])
def test_nflog_prefix_hashing(length: int) -> None:
    raw = "API12|" + "n" * (length - 6)
    assert len(raw) == length
    out = nflog.maybe_hash(raw)
    if length < 63:
        assert out == raw
    else:
        # hash part = GetLengthLimitedID("", raw, 63-10-10-1=42) = "_" + 41 hash chars
        h = "_" + b64sha256(raw)[:41]
        assert out == raw[:10] + h + "_" + raw[-10:]
        assert len(out) == 63


def test_ipset_names() -> None:
    assert main_ipset_name("this-host", 4) == "cali40this-host"
    assert main_ipset_name("s:abc", 6) == "cali60s:abc"
    long_id = "s:qMt7iLlGDhvLnCjM0l9nzxbabcdefghijklmn"
    assert main_ipset_name(long_id, 4) == "cali40s:qMt7iLlGDhvLnCjM0l9nzxb"
    assert len(main_ipset_name(long_id, 4)) == 31
    assert temp_ipset_name(3, 6) == "cali6t3"
    assert owns_ipset("felix-masq-ipam-pools", 4) and not owns_ipset("felix-masq-ipam-pools", 6)
    assert owns_ipset("cali60x", 6) and not owns_ipset("calico-x", 4)
    with pytest.raises(ValueError):
        main_ipset_name("x", 5)


def test_ipset_names_agree_with_the_ipset_driver() -> None:
    for v in (4, 6):
        cfg = IPVersionConfig(v)
        for set_id in ("this-host", "s:" + "q" * 40, "svc:abc", "n:x"):
            assert cfg.name_for_main(set_id) == main_ipset_name(set_id, v)
        for name in ("cali40a", "cali60a", "felix-4x", "felix-6x", "felix-masq-ipam-pools", "calico", "cali4t1"):
            assert cfg.owns(name) == owns_ipset(name, v)
