"""Member validation and canonical forms (pure)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from felixpy.drivers.ipsets.fake import _Fail, kernel_member
from felixpy.drivers.ipsets.members import canonicalise_members, member_ip_version
from felixpy.drivers.ipsets_api import IPSetType

IP, NET, IPPORT = IPSetType.HASH_IP, IPSetType.HASH_NET, IPSetType.HASH_IP_PORT


@pytest.mark.parametrize(("set_type", "version", "member", "expected"), [
    (IP, 4, "10.0.0.1", ["10.0.0.1"]),
    (IP, 4, "10.0.0.1/32", ["10.0.0.1"]),
    (IP, 6, "2001:DB8:0:0:0:0:0:1", ["2001:db8::1"]),
    (IP, 6, "2001:db8::1/128", ["2001:db8::1"]),
    (IP, 6, "::ffff:1.2.3.4", ["::ffff:1.2.3.4"]),
    (NET, 4, "10.0.1.0/24", ["10.0.1.0/24"]),
    (NET, 4, "10.0.2.5/24", ["10.0.2.0/24"]),
    (NET, 4, "10.0.0.1/32", ["10.0.0.1"]),
    (NET, 4, "10.0.0.1", ["10.0.0.1"]),
    (NET, 4, "0.0.0.0/0", ["0.0.0.0/1", "128.0.0.0/1"]),
    (NET, 6, "::/0", ["::/1", "8000::/1"]),
    (NET, 6, "2001:db8::1/64", ["2001:db8::/64"]),
    (NET, 6, "2001:DB8::/64", ["2001:db8::/64"]),
    (NET, 6, "2001:db8::1/128", ["2001:db8::1"]),
    (IPPORT, 4, "10.0.0.1,tcp:80", ["10.0.0.1,tcp:80"]),
    (IPPORT, 4, "10.0.0.1,UDP:053", ["10.0.0.1,udp:53"]),
    (IPPORT, 4, "10.0.0.1,sctp:65535", ["10.0.0.1,sctp:65535"]),
    (IPPORT, 6, "fd00:0::1,tcp:443", ["fd00::1,tcp:443"]),
])
def test_canonical_forms(set_type: IPSetType, version: int, member: str, expected: list[str]) -> None:
    canon, bad = canonicalise_members(set_type, version, [member])
    assert bad == []
    assert canon == expected


@pytest.mark.parametrize(("set_type", "version", "member", "reason"), [
    (IP, 4, "fd00::1", "IPv6 address in an IPv4 set"),
    (IP, 6, "10.0.0.1", "IPv4 address in an IPv6 set"),
    (IP, 4, "bogus", "not an IPv4 address"),
    (IP, 4, "localhost", "not an IPv4 address"),  # ipset would resolve it!
    (IP, 4, "010.0.0.1", "not an IPv4 address"),
    (IP, 4, "10.0.0.0/24", "prefix in a hash:ip"),
    (IP, 4, "", "not an IPv4 address"),
    (NET, 4, "10.0.0.0/33", "out of range"),
    (NET, 4, "10.0.0.0/x", "bad prefix"),
    (NET, 4, "10.0.0.0/", "bad prefix"),
    (NET, 6, "fe80::1%eth0/64", "not an IPv6 address"),
    (IPPORT, 4, "10.0.0.1", "expected <ip>,<proto>:<port>"),
    (IPPORT, 4, "10.0.0.1,tcp", "expected <ip>,(tcp|udp|sctp)"),
    (IPPORT, 4, "10.0.0.1,icmp:8", "expected <ip>,(tcp|udp|sctp)"),
    (IPPORT, 4, "10.0.0.1,tcp:65536", "bad port"),
    (IPPORT, 4, "10.0.0.1,tcp:http", "bad port"),
    (IPPORT, 4, "10.0.0.1,tcp:-1", "bad port"),
    (IPPORT, 4, "fd00::1,tcp:80", "IPv6 address in an IPv4 set"),
    (IPPORT, 6, "[fd00::1],tcp:80", "not an IPv6 address"),
])
def test_bad_members_are_reported_with_a_reason(set_type: IPSetType, version: int, member: str,
                                                 reason: str) -> None:
    canon, bad = canonicalise_members(set_type, version, [member])
    assert canon == []
    assert len(bad) == 1 and bad[0][0] == member
    assert reason in bad[0][1]


def test_good_members_survive_bad_neighbours() -> None:
    canon, bad = canonicalise_members(IP, 4, ["10.0.0.1", "nope", "10.0.0.2", "fd00::1"])
    assert canon == ["10.0.0.1", "10.0.0.2"]
    assert [m for m, _ in bad] == ["nope", "fd00::1"]


@pytest.mark.parametrize(("member", "version"), [
    ("10.0.0.1", 4), ("10.0.0.0/8", 4), ("fd00::1", 6), ("10.0.0.1,tcp:80", 4), ("fd00::1,udp:53", 6),
    ("::ffff:1.2.3.4", 6),
])
def test_member_ip_version(member: str, version: int) -> None:
    assert member_ip_version(member) == version


# ----------------------------------------------------------------- properties
v4_addrs = st.integers(0, 2**32 - 1).map(lambda i: str(ipaddress.IPv4Address(i)))
# Addresses with runs of zero groups exercise the "::" compression rules.
v6_groups = st.lists(st.sampled_from([0, 0, 0, 1, 0xffff, 0xdb8, 0x2001]), min_size=8, max_size=8)
v6_addrs = v6_groups.map(lambda g: ":".join(f"{x:x}" for x in g))


@settings(max_examples=300)
@given(addr=v4_addrs, plen=st.integers(1, 32))
def test_v4_net_agrees_with_independent_model(addr: str, plen: int) -> None:
    member = f"{addr}/{plen}"
    canon, bad = canonicalise_members(NET, 4, [member])
    assert bad == []
    assert canon == [kernel_member("hash:net", "inet", member)]
    assert canonicalise_members(NET, 4, canon)[0] == canon  # a fixed point


@settings(max_examples=300)
@given(addr=v6_addrs, plen=st.integers(1, 128))
def test_v6_net_agrees_with_independent_model(addr: str, plen: int) -> None:
    member = f"{addr}/{plen}"
    canon, bad = canonicalise_members(NET, 6, [member])
    assert bad == []
    assert canon == [kernel_member("hash:net", "inet6", member)]
    assert canonicalise_members(NET, 6, canon)[0] == canon


@settings(max_examples=300)
@given(addr=v6_addrs, port=st.integers(0, 65535), proto=st.sampled_from(["tcp", "udp", "sctp", "TCP"]))
def test_v6_ip_port_agrees_with_independent_model(addr: str, port: int, proto: str) -> None:
    member = f"{addr},{proto}:{port}"
    canon, bad = canonicalise_members(IPPORT, 6, [member])
    assert bad == []
    assert canon == [kernel_member("hash:ip,port", "inet6", member)]


@settings(max_examples=200)
@given(st.text(max_size=20))
def test_arbitrary_text_never_raises(text: str) -> None:
    for t in IPSetType:
        for v in (4, 6):
            canon, bad = canonicalise_members(t, v, [text])
            assert len(canon) + len(bad) >= 1
            for c in canon:  # anything accepted is something the kernel accepts as-is
                try:
                    assert kernel_member(t.value, "inet" if v == 4 else "inet6", c) == c
                except _Fail:
                    pytest.fail(f"accepted {text!r} as {c!r}, which the kernel model refuses")
