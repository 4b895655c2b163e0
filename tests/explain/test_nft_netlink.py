"""The netlink decompiler on messages built byte by byte (the kernel round trip is in test_roundtrip_kernel).

Each rule is the register program nft writes for a felixpy criterion (as ``nft --debug=netlink``
shows it); decoding must give the criterion nft's JSON gives, and anything else must be declared
undecodable (so explain lists that chain with nft) rather than guessed.
"""

from __future__ import annotations

import ipaddress
import struct
import sys

import pytest

from felixpy.drivers.generictables import model as m
from felixpy.explain.nft_netlink import NFT_SET_ELEM_INTERVAL_END, Undecodable, _attr, _intervals, attrs, decode_rule

NESTED = 0x8000
HOST = sys.byteorder


def be32(v: int) -> bytes:
    return struct.pack(">I", v & 0xFFFFFFFF)


def data(value: bytes) -> bytes:
    return _attr(1, value)                                # NFTA_DATA_VALUE


def expr(name: str, *fields: tuple[int, bytes]) -> bytes:
    body = b"".join(_attr(t, v) for t, v in fields)
    return _attr(1 | NESTED, _attr(1, name.encode() + b"\0") + _attr(2 | NESTED, body))


def meta_load(key: int, reg: int = 1) -> bytes:
    return expr("meta", (1, be32(reg)), (2, be32(key)))


def cmp(value: bytes, op: int = 0, reg: int = 1) -> bytes:
    return expr("cmp", (1, be32(reg)), (2, be32(op)), (3 | NESTED, data(value)))


def bitwise(mask: bytes, xor: bytes, reg: int = 1) -> bytes:
    return expr("bitwise", (1, be32(reg)), (2, be32(reg)), (3, be32(len(mask))),
                (4 | NESTED, data(mask)), (5 | NESTED, data(xor)))


def verdict(code: int, chain: str = "") -> bytes:
    v = _attr(1, be32(code)) + (_attr(2, chain.encode() + b"\0") if chain else b"")
    return expr("immediate", (1, be32(0)), (2 | NESTED, _attr(2 | NESTED, v)))


def rule(*exprs: bytes, comment: str = "") -> dict[int, bytes]:
    msg = _attr(4 | NESTED, b"".join(exprs))
    if comment:
        raw = comment.encode() + b"\0"
        msg += _attr(7, bytes([0, len(raw)]) + raw)
    return attrs(msg)


def host32(v: int) -> bytes:
    return v.to_bytes(4, HOST)


def test_masked_mark_match_jump_and_comment() -> None:
    r = decode_rule(rule(meta_load(3), bitwise(host32(0x30000), host32(0)), cmp(host32(0x10000)),
                         expr("counter"), verdict(-3, "filter-cali-x"), comment="cali:abc123; Start of tier t"),
                    4, 7)
    assert r.position == 7 and r.hash == "abc123" and r.comments == ("Start of tier t",)
    assert r.criteria == (m.MarkMatchesWithMask(0x10000, 0x30000, False),)
    assert r.action == m.Jump("filter-cali-x")


def test_interface_prefix_and_exact_name() -> None:
    prefix = decode_rule(rule(meta_load(6), cmp(b"cali"), verdict(-4, "d")), 4, 1)
    exact = decode_rule(rule(meta_load(7), cmp(b"eth0".ljust(16, b"\0"), op=1), verdict(0)), 4, 1)
    assert prefix.criteria == (m.InInterface("cali+", False),) and prefix.action == m.Goto("d")
    assert exact.criteria == (m.OutInterface("eth0", True),) and exact.action == m.Drop()


def test_mark_set_is_a_masked_set() -> None:
    set_bits = expr("meta", (2, be32(3)), (3, be32(1)))   # meta mark set reg 1
    r = decode_rule(rule(meta_load(3), bitwise(host32(~0x10000 & 0xFFFFFFFF), host32(0x10000)), set_bits), 4, 1)
    assert r.action == m.SetMaskedMark(0x10000, 0x10000)


def test_address_prefix_loaded_as_its_bytes_and_port_range_as_two_compares() -> None:
    payload = expr("payload", (1, be32(1)), (2, be32(1)), (3, be32(12)), (4, be32(2)))   # 2 bytes of saddr
    dport = expr("payload", (1, be32(1)), (2, be32(2)), (3, be32(2)), (4, be32(2)))
    r = decode_rule(rule(payload, cmp(bytes([10, 65])), meta_load(16), cmp(bytes([6])),
                         dport, cmp(struct.pack(">H", 8000), op=5), cmp(struct.pack(">H", 8010), op=3),
                         verdict(1)), 4, 1)
    assert r.criteria == (m.SourceNet("10.65.0.0/16", False), m.ProtocolNum(6, False),
                          m.DestPorts((m.PortRange(8000, 65535),), False), m.DestPorts((m.PortRange(0, 8010),), False))
    assert r.action == m.Accept()


@pytest.mark.parametrize("statement", [expr("log"), expr("reject"), expr("limit"), expr("notrack")])
def test_statements_it_does_not_know_are_undecodable(statement: bytes) -> None:
    with pytest.raises(Undecodable):
        decode_rule(rule(statement, verdict(1)), 4, 1)


def test_lookup_in_an_anonymous_set_is_undecodable() -> None:
    payload = expr("payload", (1, be32(1)), (2, be32(2)), (3, be32(2)), (4, be32(2)))
    lookup = expr("lookup", (1, b"__set0\0"), (2, be32(1)))
    with pytest.raises(Undecodable):
        decode_rule(rule(meta_load(16), cmp(bytes([6])), payload, lookup, verdict(1)), 4, 1)


def k(ip: str) -> bytes:
    return ipaddress.ip_address(ip).packed


def test_intervals_adjacent_open_ended_and_the_zero_end() -> None:
    end = NFT_SET_ELEM_INTERVAL_END
    keys = [(k("0.0.0.0"), end), (k("10.0.0.0"), 0), (k("10.0.0.64"), end), (k("10.0.0.64"), 0),
            (k("10.0.0.128"), end), (k("10.0.0.200"), 0), (k("10.0.0.201"), end), (k("250.0.0.0"), 0)]
    got = [str(n) for n in _intervals(keys, 4)]
    assert got == ["10.0.0.0/26", "10.0.0.64/26", "10.0.0.200/32", "250.0.0.0/7", "252.0.0.0/6"]


def test_a_start_inside_an_open_interval_is_undecodable() -> None:
    with pytest.raises(Undecodable):
        _intervals([(k("10.0.0.0"), 0), (k("10.0.0.5"), 0), (k("10.0.0.9"), NFT_SET_ELEM_INTERVAL_END)], 4)
