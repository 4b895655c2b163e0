"""Pure tests: set member canonicalisation, element JSON, read-back; table parsing (net reduction: test_nft_packed)."""

from __future__ import annotations

from typing import Any

import pytest

from felixpy.drivers.ipsets_api import IPSetType
from felixpy.drivers.nftables.members import BadMember, SetKind, codec_for, element_json, kind_for, member_from_element
from felixpy.drivers.nftables.names import BaseChainSpec, namespaced, set_name_for_id
from felixpy.drivers.nftables.packed import PackedMembers
from felixpy.drivers.nftables.readback import parse_table

IP, NET, IPP = IPSetType.HASH_IP, IPSetType.HASH_NET, IPSetType.HASH_IP_PORT


def canonicalise(typ: IPSetType, v: int, member: str) -> str:
    """A member as the table holds it: its key, decoded."""
    codec = codec_for(typ, v)
    return codec.text(codec.key(member))


@pytest.mark.parametrize("typ,v,member,canon", [
    (IP, 4, "10.0.0.1", "10.0.0.1"),
    (IP, 4, "10.0.0.1/32", "10.0.0.1"),
    (IP, 6, "FD00:0::1", "fd00::1"),
    (IP, 6, "fd00::1/128", "fd00::1"),
    (NET, 4, "10.1.2.3/16", "10.1.0.0/16"),
    (NET, 4, "10.1.2.3/32", "10.1.2.3"),
    (NET, 4, "10.1.2.3", "10.1.2.3"),
    (NET, 6, "fd00:1::5/64", "fd00:1::/64"),
    (NET, 4, "0.0.0.0/0", "0.0.0.0/0"),
    (IPP, 4, "10.0.0.1,tcp:80", "10.0.0.1,tcp:80"),
    (IPP, 4, "10.0.0.1,6:80", "10.0.0.1,tcp:80"),
    (IPP, 4, "10.0.0.1,SCTP:9", "10.0.0.1,sctp:9"),
    (IPP, 6, "fd00::1,udp:53", "fd00::1,udp:53"),
])
def test_canonicalise(typ: IPSetType, v: int, member: str, canon: str) -> None:
    assert canonicalise(typ, v, member) == canon


@pytest.mark.parametrize("typ,v,member", [
    (IP, 4, "fd00::1"), (IP, 6, "10.0.0.1"), (IP, 4, "10.0.0.0/24"), (IP, 4, "banana"),
    (NET, 4, "10.0.0.0/33"), (NET, 4, "10.0.0.0/x"), (NET, 6, "10.0.0.0/8"),
    (IPP, 4, "10.0.0.1"), (IPP, 4, "10.0.0.1,tcp"), (IPP, 4, "10.0.0.1,tcp:99999"),
    (IPP, 4, "10.0.0.1,nosuchproto:80"), (IPP, 4, "fd00::1,tcp:80"),
])
def test_bad_members(typ: IPSetType, v: int, member: str) -> None:
    with pytest.raises(BadMember):
        canonicalise(typ, v, member)


def test_kinds() -> None:
    assert kind_for(IP, 4) == SetKind(("ipv4_addr",), False)
    assert kind_for(NET, 6) == SetKind(("ipv6_addr",), True)
    assert kind_for(IPP, 4) == SetKind(("ipv4_addr", "inet_proto", "inet_service"), False)


@pytest.mark.parametrize("member", ["10.0.0.1", "10.0.0.0/24", "10.0.0.1,tcp:80", "10.0.0.1,47:0"])
def test_element_round_trip(member: str) -> None:
    assert member_from_element(element_json(member), 4) == member


def test_listed_elements_as_the_kernel_prints_them() -> None:
    assert member_from_element({"concat": ["10.0.0.2", "sctp", 9]}, 4) == "10.0.0.2,sctp:9"
    assert member_from_element({"prefix": {"addr": "fd00::", "len": 64}}, 6) == "fd00::/64"
    assert member_from_element({"range": ["10.0.0.1", "10.0.0.9"]}, 4) == "10.0.0.1-10.0.0.9"
    assert element_json("10.0.0.1-10.0.0.9") == {"range": ["10.0.0.1", "10.0.0.9"]}
    assert member_from_element({"elem": {"val": "10.0.0.1", "timeout": 5}}, 4) is None
    assert member_from_element(42, 4) is None


def test_names() -> None:
    assert set_name_for_id("s:qMt7iLlGDhvLnCjM0l9nzxbabcd", 4) == "cali40s-qMt7iLlGDhvLnCjM0l9nzxb"
    assert set_name_for_id("this-host", 6) == "cali60this-host"
    assert namespaced("filter", "cali-x") == "filter-cali-x"
    assert namespaced("filter", "filter-cali-x") == "filter-cali-x"


# A listing captured from the kernel (nft 1.0.6), trimmed.
LISTING = [
    {"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
    {"table": {"family": "ip", "name": "calico", "handle": 1}},
    {"set": {"family": "ip", "name": "s1", "table": "calico", "type": "ipv4_addr", "handle": 1,
             "flags": ["interval"], "elem": [{"prefix": {"addr": "10.0.0.0", "len": 24}}]}},
    {"set": {"family": "ip", "name": "s2", "table": "calico", "type": "ipv4_addr", "handle": 2,
             "flags": ["interval"], "elem": [{"prefix": {"addr": "10.0.1.0", "len": 25}}, "10.0.2.7"]}},
    {"set": {"family": "ip", "name": "s3", "table": "calico", "type": ["ipv4_addr", "inet_proto", "inet_service"],
             "handle": 3, "elem": [{"concat": ["10.0.0.2", "sctp", 9]}, {"concat": ["10.0.0.1", "tcp", 80]}]}},
    {"set": {"family": "ip", "name": "s4", "table": "calico", "type": "ipv4_addr", "handle": 4,
             "flags": ["timeout"]}},
    {"map": {"family": "ip", "name": "m1", "table": "calico", "type": "ifname", "handle": 5, "map": "verdict",
             "elem": [["eth0", {"return": None}], ["cali1234", {"goto": {"target": "c1"}}]]}},
    {"flowtable": {"family": "ip", "name": "ft", "table": "calico", "handle": 9, "hook": "ingress", "prio": 0}},
    {"chain": {"family": "ip", "table": "calico", "name": "filter-INPUT", "handle": 1, "type": "filter",
               "hook": "input", "prio": 0, "policy": "accept"}},
    {"chain": {"family": "ip", "table": "calico", "name": "c1", "handle": 3}},
    {"chain": {"family": "ip", "table": "calico", "name": "empty", "handle": 7}},
    {"rule": {"family": "ip", "table": "calico", "chain": "filter-INPUT", "handle": 5,
              "expr": [{"jump": {"target": "c1"}}]}},
    {"rule": {"family": "ip", "table": "calico", "chain": "c1", "handle": 4, "comment": "cali:x123;",
              "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"accept": None}]}},
    {"rule": {"family": "ip", "table": "calico", "chain": "c1", "handle": 6, "comment": "cali:y456; hello",
              "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"drop": None}]}},
]


def test_parse_table() -> None:
    snap = parse_table(LISTING, 4)
    assert snap.chains["filter-INPUT"].base == BaseChainSpec("filter", "input", 0)
    assert snap.chains["filter-INPUT"].hashes == [""]
    assert snap.chains["c1"].base is None and snap.chains["c1"].hashes == ["x123", "y456"]
    assert snap.chains["empty"].hashes == []
    assert snap.sets["s1"].kind == SetKind(("ipv4_addr",), True) and snap.sets["s1"].members == {"10.0.0.0/24"}
    assert snap.sets["s2"].members == {"10.0.1.0/25", "10.0.2.7"}
    assert snap.sets["s3"].kind == SetKind(("ipv4_addr", "inet_proto", "inet_service"), False)
    assert snap.sets["s3"].members == {"10.0.0.2,sctp:9", "10.0.0.1,tcp:80"}
    assert snap.sets["s4"].kind is None   # flags we never write
    assert snap.maps["m1"].elements == {"eth0": ("return",), "cali1234": ("goto", "c1")}
    assert snap.others == [("flowtable", "ft")]
    assert snap.num_rules == 3


def test_parse_table_packs_the_sets_we_write_and_keeps_strings_for_the_rest() -> None:
    """Packed when a set is of a kind we write and every element of a shape we write; otherwise today's
    canonical strings (a range as ``a-b``), which never equal a packed set: the set is rewritten."""
    def listed(name: str, typ: Any, elems: list[Any], flags: tuple[str, ...] = ()) -> dict[str, Any]:
        return {"set": {"family": "ip", "name": name, "table": "calico", "type": typ, "elem": elems,
                        **({"flags": list(flags)} if flags else {})}}

    snap = parse_table(LISTING + [
        listed("r", "ipv4_addr", ["10.0.0.1", {"range": ["10.0.1.1", "10.0.1.9"]}], ("interval",)),
        listed("bad", "ipv4_addr", ["10.0.0.1", {"elem": {"val": "10.0.0.2", "timeout": 5}}]),
        listed("v6", "ipv6_addr", ["fd00::1"]),
        listed("empty", "ipv4_addr", []),
    ], 4)
    for name, codec in [("s1", codec_for(NET, 4)), ("s2", codec_for(NET, 4)), ("s3", codec_for(IPP, 4)),
                        ("empty", codec_for(IP, 4))]:
        members = snap.sets[name].members
        assert isinstance(members, PackedMembers) and members.codec is codec, name
    assert snap.sets["s3"].members.data.hex() == "0a000001060050" + "0a000002840009"   # type: ignore[attr-defined]
    assert snap.sets["r"].members == frozenset({"10.0.0.1", "10.0.1.1-10.0.1.9"}) and snap.sets["r"].unparsed == 0
    assert not isinstance(snap.sets["r"].members, PackedMembers)
    assert snap.sets["r"].members != PackedMembers(codec_for(NET, 4))
    assert snap.sets["bad"].members == {"10.0.0.1"} and snap.sets["bad"].unparsed == 1
    assert snap.sets["v6"].members == frozenset() and snap.sets["v6"].unparsed == 1   # not of this table's family
    assert snap.sets["s4"].kind is None and not isinstance(snap.sets["s4"].members, PackedMembers)
