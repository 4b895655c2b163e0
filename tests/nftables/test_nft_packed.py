"""Packed set members (``nftables/packed.py``, issue #17), pinned on what the table relies on: a key decodes to
the canonical string a manager's spelling stands for (``ipaddress`` as the independent judge), equal sets are
equal bytes however they were built, the set operators answer as frozenset's do (a model test on random sets,
each operator on both of its paths: runs of keys merged in order, and sets of keys for operands that
interleave), and the wire form round trips."""

from __future__ import annotations

import ipaddress
import random
from collections import Counter
from typing import Any

import pytest

from felixpy.drivers.ipsets_api import IPSetType
from felixpy.drivers.nftables import packed as packed_mod
from felixpy.drivers.nftables.members import KeyCodec, codec_for
from felixpy.drivers.nftables.packed import PackedMembers, pack_members, reduce_nets

IP, NET, IPP = IPSetType.HASH_IP, IPSetType.HASH_NET, IPSetType.HASH_IP_PORT
KINDS = [(t, v) for t in (IP, NET, IPP) for v in (4, 6)]
PROTOS = ["tcp", "udp", "sctp", "6", "17", "132", "47", "1", "58", "0", "255"]
PROTO_NAMES = {"6": "tcp", "17": "udp", "132": "sctp", "1": "icmp", "58": "ipv6-icmp"}


def pack(t: IPSetType, v: int, members: list[str]) -> PackedMembers:
    packed, bad = pack_members(codec_for(t, v), members)
    assert bad == []
    return packed


@pytest.mark.parametrize("t,v,width", [(IP, 4, 4), (IP, 6, 16), (NET, 4, 5), (NET, 6, 17), (IPP, 4, 7), (IPP, 6, 19)])
def test_key_widths(t: IPSetType, v: int, width: int) -> None:
    assert codec_for(t, v).width == width


@pytest.mark.parametrize("t,v,member,canon,key", [
    (IP, 4, "10.0.0.1", "10.0.0.1", "0a000001"),
    (IP, 4, " 10.0.0.1/32\n", "10.0.0.1", "0a000001"),
    (IP, 6, "FD00:0::1/128", "fd00::1", "fd00" + "00" * 13 + "01"),
    (NET, 4, "10.1.2.3/16", "10.1.0.0/16", "0a01000010"),
    (NET, 4, "10.1.2.3/32", "10.1.2.3", "0a01020320"),
    (NET, 4, "10.1.2.3", "10.1.2.3", "0a01020320"),
    (NET, 4, "0.0.0.0/0", "0.0.0.0/0", "0000000000"),
    (NET, 6, "fd00:1::5/64", "fd00:1::/64", "fd000001" + "00" * 12 + "40"),
    (NET, 6, "fd00::5/128", "fd00::5", "fd00" + "00" * 13 + "0580"),
    (IPP, 4, "10.0.0.1,tcp:80", "10.0.0.1,tcp:80", "0a000001060050"),
    (IPP, 4, "10.0.0.1/32,6:80", "10.0.0.1,tcp:80", "0a000001060050"),
    (IPP, 4, "10.0.0.1,UDP:53", "10.0.0.1,udp:53", "0a000001110035"),
    (IPP, 4, "10.0.0.1,SCTP:9", "10.0.0.1,sctp:9", "0a000001840009"),
    (IPP, 4, "10.0.0.1,47:0", "10.0.0.1,47:0", "0a0000012f0000"),
    (IPP, 6, "fd00::1/128,udp:65535", "fd00::1,udp:65535", "fd00" + "00" * 13 + "0111ffff"),
])
def test_a_member_packs_to_its_key_and_decodes_to_its_canonical_string(t: IPSetType, v: int, member: str,
                                                                      canon: str, key: str) -> None:
    codec = codec_for(t, v)
    assert codec.key(member).hex() == key
    assert codec.text(codec.key(member)) == canon
    assert codec.key(canon).hex() == key                    # the canonical string is a fixed point


def _address(rng: random.Random, v: int) -> str:
    bits = 32 if v == 4 else 128
    value = rng.getrandbits(bits) if rng.random() < 0.5 else rng.randrange(4) << (bits - 8)  # some zero tails
    return str(ipaddress.IPv4Address(value) if v == 4 else ipaddress.IPv6Address(value))


@pytest.mark.parametrize("t,v", KINDS)
def test_keys_decode_as_ipaddress_canonicalises(t: IPSetType, v: int) -> None:
    """A random member, as a manager may spell it, decodes to what ``ipaddress`` makes of it."""
    rng = random.Random(1700 + v)
    codec = codec_for(t, v)
    bits = 32 if v == 4 else 128
    for _ in range(500):
        addr = _address(rng, v)
        if t is IP:
            member, want = (f"{addr}/{bits}" if rng.random() < 0.2 else addr), addr
        elif t is NET and rng.random() < 0.2:
            member = want = addr
        elif t is NET:
            plen = rng.choice([0, 1, bits // 2, bits - 1, bits, rng.randrange(bits + 1)])
            net = ipaddress.ip_network(f"{addr}/{plen}", strict=False)
            member, want = f"{addr}/{plen}", str(net.network_address) if plen == bits else str(net)
        else:
            proto, port = rng.choice(PROTOS), rng.choice([0, 1, 80, 443, 65535, rng.randrange(65536)])
            member = f"{addr},{proto}:{port}"
            want = f"{addr},{PROTO_NAMES.get(proto, proto)}:{port}"
        key = codec.key(member)
        assert len(key) == codec.width and codec.text(key) == want, member
        assert codec.key(want) == key


@pytest.mark.parametrize("t,v", KINDS)
def test_equal_sets_built_in_any_order_are_equal_bytes(t: IPSetType, v: int) -> None:
    rng = random.Random(3 + v)
    codec = codec_for(t, v)
    members = _members(rng, codec, 300)
    shuffled = members * 2
    rng.shuffle(shuffled)
    a, b = pack(t, v, members), pack(t, v, shuffled)
    assert a.data == b.data and a == b and hash(a) == hash(b) == hash(frozenset(a))
    keys = list(a.iter_keys())
    assert keys == sorted(set(keys)) and len(a) == len(set(members))
    # Built key by key through the operators, or from a listing's keys: the same bytes again.
    grown = PackedMembers(codec)
    for member in shuffled:
        grown = grown | pack(t, v, [member])
    assert grown.data == a.data
    assert PackedMembers.from_keys(codec, reversed(keys)).data == a.data


def _members(rng: random.Random, codec: KeyCodec, n: int) -> list[str]:
    """*n* canonical members drawn from a small universe, so that random sets overlap and nets nest."""
    v, bits = codec.ip_version, codec.bits
    base = 0x0A000000 if v == 4 else 0xFD00 << 112
    out = []
    for _ in range(n):
        value = base + (rng.randrange(512) << 8)
        addr = str(ipaddress.IPv4Address(value) if v == 4 else ipaddress.IPv6Address(value))
        if codec.set_type is NET:
            plen = bits - rng.choice([16, 12, 8, 4, 0])
            out.append(str(ipaddress.ip_network(f"{addr}/{plen}", strict=False)))
        elif codec.set_type is IPP:
            out.append(f"{addr},{rng.choice(['tcp', 'udp', '47'])}:{rng.choice([53, 80, 8080])}")
        else:
            out.append(addr)
    return [codec.text(codec.key(m)) for m in out]


SIZES = [0, 1, 3, 40, 400]


@pytest.mark.parametrize("t,v", KINDS)
def test_set_algebra_matches_frozensets(t: IPSetType, v: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(42 * v + len(t.value))
    codec = codec_for(t, v)
    paths: Counter[str] = Counter()
    merged = packed_mod._runs

    def counted(*args: Any) -> Any:
        runs = merged(*args)
        paths["sets" if runs is None else "runs"] += 1
        return runs

    monkeypatch.setattr(packed_mod, "_runs", counted)
    for trial in range(60):
        na, nb = rng.choice(SIZES), rng.choice(SIZES)
        fa, fb = frozenset(_members(rng, codec, na)), frozenset(_members(rng, codec, nb))
        if trial % 5 == 0:
            fb = fa - frozenset(list(fa)[:2]) | frozenset(_members(rng, codec, 2))   # nearly equal
        a, b = pack(t, v, list(fa)), pack(t, v, list(fb))
        for got, want in [(a - b, fa - fb), (b - a, fb - fa), (a & b, fa & fb), (a | b, fa | fb),
                          (a ^ b, fa ^ fb)]:
            assert isinstance(got, PackedMembers) and got.codec is codec
            assert got.data == pack(t, v, list(want)).data, (trial, sorted(fa), sorted(fb))
        assert (a == b) == (fa == fb) and (a != b) == (fa != fb)
        assert len(a) == len(fa) and set(a) == fa and list(a) == [codec.text(k) for k in a.iter_keys()]
        for m in list(fb)[:5]:
            assert (m in a) == (m in fa)
    assert paths["runs"] and paths["sets"], paths


@pytest.mark.parametrize("t,v", KINDS)
def test_operators_with_plain_sets_and_the_other_family_answer_as_frozensets(t: IPSetType, v: int) -> None:
    rng = random.Random(7)
    codec = codec_for(t, v)
    fa = frozenset(_members(rng, codec, 30))
    fb = frozenset(list(fa)[:10]) | {"10.0.0.1-10.0.0.9"}      # a listing's strings, with a foreign range
    a = pack(t, v, list(fa))
    assert a - fb == fa - fb and fb - a == fb - fa and a & fb == fa & fb and fb & a == fa & fb
    assert a | fb == fa | fb and fb | a == fa | fb and a ^ fb == fa ^ fb and fb ^ a == fa ^ fb
    assert a != fb and fb != a and a == set(fa) and set(fa) == a
    assert isinstance(a - fb, PackedMembers) and isinstance(a & fb, PackedMembers)
    other = codec_for(t, 10 - v)
    fo = frozenset(_members(rng, other, 5))
    o = pack(t, 10 - v, list(fo))
    assert a | o == fa | fo and (a | o) - o == fa and a & o == frozenset() and a - o == a


def test_membership_is_of_canonical_strings_only() -> None:
    a = pack(NET, 4, ["10.0.0.0/24", "10.0.0.7"])
    assert "10.0.0.0/24" in a and "10.0.0.7" in a
    assert "10.0.0.5/24" not in a and "10.0.0.7/32" not in a and " 10.0.0.7" not in a
    assert "junk" not in a and 7 not in a and "10.0.0.8" not in a


def test_invalid_members_are_returned_not_packed() -> None:
    packed, bad = pack_members(codec_for(IP, 4), ["10.0.0.1", "fd00::1", "10.0.0.0/24", "junk", "10.0.0.1"])
    assert list(packed) == ["10.0.0.1"] and bad == ["fd00::1", "10.0.0.0/24", "junk"]
    packed, bad = pack_members(codec_for(IPP, 6), (m for m in ["fd00::1,tcp:80", "fd00::1,tcp:99999"]))
    assert list(packed) == ["fd00::1,tcp:80"] and bad == ["fd00::1,tcp:99999"]


def _covered(members: frozenset[str]) -> frozenset[str]:
    nets = {m: ipaddress.ip_network(m) for m in members}
    return frozenset(m for m, n in nets.items()
                     if any(o != n and n.subnet_of(o) for o in nets.values()))


@pytest.mark.parametrize("v", [4, 6])
def test_reduce_nets_drops_exactly_the_covered_members(v: int) -> None:
    rng = random.Random(11 + v)
    codec = codec_for(NET, v)
    for _ in range(40):
        members = frozenset(_members(rng, codec, rng.choice([1, 5, 30, 100])))
        packed = pack(NET, v, list(members))
        reduced = reduce_nets(packed)
        assert reduced.data == pack(NET, v, list(members - _covered(members))).data
    bare = pack(NET, v, _members(random.Random(1), codec_for(IP, v), 20))
    assert reduce_nets(bare) is bare                           # nothing covered: the very object


def test_reduce_nets_examples() -> None:
    members = ["10.0.0.0/24", "10.0.0.5", "10.0.0.128/25", "10.0.1.0/24", "10.0.2.1", "0.0.0.0/1"]
    assert reduce_nets(pack(NET, 4, members)) == {"0.0.0.0/1"}
    assert reduce_nets(pack(NET, 4, members[:-1])) == {"10.0.0.0/24", "10.0.1.0/24", "10.0.2.1"}
    assert reduce_nets(pack(NET, 6, ["fd00::/64", "fd00::1", "fd01::1"])) == {"fd00::/64", "fd01::1"}


@pytest.mark.parametrize("t,v", KINDS)
def test_wire_form_round_trips(t: IPSetType, v: int) -> None:
    codec = codec_for(t, v)
    for n in (0, 1, 50):
        a = pack(t, v, _members(random.Random(n), codec, n))
        text = a.to_wire()
        assert isinstance(text, str) and PackedMembers.from_wire(codec, text).data == a.data


def test_a_torn_wire_form_is_refused() -> None:
    codec = codec_for(IP, 4)
    whole = pack(IP, 4, ["10.0.0.1", "10.0.0.2"]).to_wire()
    for torn in (whole[:-4], whole + "!", "not base64", whole[:5]):
        with pytest.raises(ValueError):
            PackedMembers.from_wire(codec, torn)
