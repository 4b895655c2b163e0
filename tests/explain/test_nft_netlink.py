"""The netlink decompiler on rule messages built by hand (the kernel round trip is in test_roundtrip_kernel).

Each rule is the register program nft writes for a felixpy criterion (as ``nft --debug=netlink``
shows it), encoded and decoded by pyroute2 as the kernel's answer is; decoding must give the
criterion nft's JSON gives, and anything else must be declared undecodable (so explain lists
that chain with nft) rather than guessed.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pyroute2.netlink.nfnetlink.nftsocket import nft_rule_msg  # type: ignore[import-untyped]

from felixpy.drivers.generictables import model as m
from felixpy.explain.nft_netlink import NFT_SET_ELEM_INTERVAL_END, NftNetlink, Undecodable, _intervals, decode_rule
from felixpy.testing import netns as nsmod

HOST = sys.byteorder
Attrs = dict[str, Any]


def data(value: bytes) -> Attrs:
    return {"attrs": [("NFTA_DATA_VALUE", value)]}


def expr(name: str, *fields: tuple[str, Any]) -> Attrs:
    body = [("NFTA_EXPR_DATA", {"attrs": list(fields)})] if fields else []   # notrack has no data at all
    return {"attrs": [("NFTA_EXPR_NAME", name), *body]}


def meta_load(key: int, reg: int = 1) -> Attrs:
    return expr("meta", ("NFTA_META_DREG", reg), ("NFTA_META_KEY", key))


def cmp(value: bytes, op: int = 0, reg: int = 1) -> Attrs:
    return expr("cmp", ("NFTA_CMP_SREG", reg), ("NFTA_CMP_OP", op), ("NFTA_CMP_DATA", data(value)))


def bitwise(mask: bytes, xor: bytes, reg: int = 1) -> Attrs:
    return expr("bitwise", ("NFTA_BITWISE_SREG", reg), ("NFTA_BITWISE_DREG", reg), ("NFTA_BITWISE_LEN", len(mask)),
                ("NFTA_BITWISE_MASK", data(mask)), ("NFTA_BITWISE_XOR", data(xor)))


def payload(base: int, offset: int, ln: int, reg: int = 1) -> Attrs:
    return expr("payload", ("NFTA_PAYLOAD_DREG", reg), ("NFTA_PAYLOAD_BASE", base), ("NFTA_PAYLOAD_OFFSET", offset),
                ("NFTA_PAYLOAD_LEN", ln))


def verdict(code: int, chain: str = "") -> Attrs:
    v: list[tuple[str, Any]] = [("NFTA_VERDICT_CODE", code)] + ([("NFTA_VERDICT_CHAIN", chain)] if chain else [])
    return expr("immediate", ("NFTA_IMMEDIATE_DREG", 0),
                ("NFTA_IMMEDIATE_DATA", {"attrs": [("NFTA_DATA_VERDICT", {"attrs": v})]}))


def rule(*exprs: Attrs, comment: str = "") -> Any:
    """The message as the kernel would send it: encoded by pyroute2, then decoded from the bytes."""
    out = nft_rule_msg()
    out["attrs"] = [("NFTA_RULE_EXPRESSIONS", list(exprs))] + ([("NFTA_RULE_USERDATA", comment)] if comment else [])
    out.encode()
    msg = nft_rule_msg(bytes(out.data))
    msg.decode()
    return msg


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
    set_bits = expr("meta", ("NFTA_META_KEY", 3), ("NFTA_META_SREG", 1))   # meta mark set reg 1
    r = decode_rule(rule(meta_load(3), bitwise(host32(~0x10000 & 0xFFFFFFFF), host32(0x10000)), set_bits), 4, 1)
    assert r.action == m.SetMaskedMark(0x10000, 0x10000)


def test_address_prefix_loaded_as_its_bytes_and_port_range_as_two_compares() -> None:
    saddr = payload(1, 12, 2)   # 2 bytes of saddr
    dport = payload(2, 2, 2)
    r = decode_rule(rule(saddr, cmp(bytes([10, 65])), meta_load(16), cmp(bytes([6])),
                         dport, cmp(struct.pack(">H", 8000), op=5), cmp(struct.pack(">H", 8010), op=3),
                         verdict(1)), 4, 1)
    assert r.criteria == (m.SourceNet("10.65.0.0/16", False), m.ProtocolNum(6, False),
                          m.DestPorts((m.PortRange(8000, 65535),), False), m.DestPorts((m.PortRange(0, 8010),), False))
    assert r.action == m.Accept()


@pytest.mark.parametrize("statement", [expr("log"), expr("reject"), expr("limit"), expr("notrack")])
def test_statements_it_does_not_know_are_undecodable(statement: Attrs) -> None:
    with pytest.raises(Undecodable):
        decode_rule(rule(statement, verdict(1)), 4, 1)


def test_lookup_in_an_anonymous_set_is_undecodable() -> None:
    lookup = expr("lookup", ("NFTA_LOOKUP_SET", "__set0"), ("NFTA_LOOKUP_SREG", 1))
    with pytest.raises(Undecodable):
        decode_rule(rule(meta_load(16), cmp(bytes([6])), payload(2, 2, 2), lookup, verdict(1)), 4, 1)


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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a throwaway namespace)")
def test_a_reader_opened_on_one_thread_reads_the_namespace_from_another(netns: str) -> None:
    """explain opens the reader on a worker thread and evaluates on the main one; pyroute2 keeps a
    socket per thread, and one opened implicitly on the main thread would read the *root* namespace."""
    nsmod.run_in(netns, "nft", "-f", "-", input="table ip calico { chain filter-x { accept; }; }\n")
    nl = ThreadPoolExecutor(1).submit(lambda: NftNetlink(netns, 4)).result()
    try:
        got = nl.chain("filter-x")
    finally:
        nl.close()
    assert got is not None and [r.action for r in got[1]] == [m.Accept()]
