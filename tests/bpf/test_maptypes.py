"""Struct mirrors: sizes/offsets are asserted at import; here the key builders."""

from __future__ import annotations

import ctypes

import pytest

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt


def test_ct_key_ordering_matches_c() -> None:
    # src < dst (raw little-endian word compare of network-order bytes): src goes in A.
    k = mt.ct_key(6, "10.0.0.1", 1000, "10.0.0.2", 80)
    assert bytes(k.addr_a) == bytes([10, 0, 0, 1]) and (k.port_a, k.port_b) == (1000, 80)
    k2 = mt.ct_key(6, "10.0.0.2", 80, "10.0.0.1", 1000)
    assert bytes(k2) == bytes(k)  # both directions share one key
    # word compare is little-endian: 1.0.0.10 < 10.0.0.1 as LE words? 0x0a000001 vs 0x0100000a
    k3 = mt.ct_key(17, "1.0.0.10", 1, "10.0.0.1", 2)
    assert bytes(k3.addr_a) == bytes([10, 0, 0, 1])
    # equal addresses: ports decide
    k4 = mt.ct_key(17, "10.0.0.1", 9, "10.0.0.1", 3)
    assert (k4.port_a, k4.port_b) == (3, 9)
    k6 = mt.ct_key(6, "fd00::2", 1, "fd00::1", 2, v6=True)
    assert ctypes.sizeof(k6) == 40 and bytes(k6.addr_a)[-1] == 1


def test_ipset_key_encoding() -> None:
    k = mt.ipset_key(0x0102030405060708, "10.1.0.0", 16)
    raw = bytes(k)
    assert raw[:4] == (64 + 16).to_bytes(4, "little")
    assert raw[4:12] == bytes(range(1, 9))  # big-endian set id
    assert raw[12:16] == bytes([10, 1, 0, 0])
    n = mt.ipset_key(5, "10.1.2.3", port=8080, protocol=6)
    assert n.prefixlen == 64 + 32 + 16 + 8 and n.port == 8080 and n.protocol == 6
    n6 = mt.ipset_key(5, "fd00::1", port=53, protocol=17, v6=True)
    assert n6.prefixlen == 64 + 128 + 24 and ctypes.sizeof(n6) == 32


def test_route_ifstate_failsafe_helpers() -> None:
    k = mt.route_key("10.65.0.0/26")
    assert k.prefixlen == 26 and bytes(k.addr) == bytes([10, 65, 0, 0])
    v = mt.route_value(defs.RT_WORKLOAD | defs.RT_LOCAL, ifindex=7)
    assert v.if_index == 7
    s = mt.ifstate_value(defs.IFACE_STATE_WEP, "cali1234", ingress_policy_v4=3)
    assert s.name == b"cali1234" and s.ingress_policy_v4 == 3 and s.egress_policy_v6 == -1
    f = mt.failsafe_key(6, 22, "0.0.0.0/0", outbound=True)
    assert f.prefixlen == 32 and f.flags == defs.FSAFE_OUT


def test_globals_defaults() -> None:
    g = mt.empty_tc_globals()
    assert list(g.jumps) == [defs.JUMP_UNUSED] * defs.JUMPS_LEN
    assert g.log_filter_jmp == defs.JUMP_UNUSED and g.dscp == -1 and g.istio_dscp == -1
    assert bytes(g) == bytes(mt.empty_tc_globals()) and not any(bytes(g.host_ip))
    g.jumps[0], g.flags = 7, 1  # each call is its own copy of the template
    fresh = mt.empty_tc_globals()
    assert fresh.jumps[0] == defs.JUMP_UNUSED and fresh.flags == 0


@pytest.mark.parametrize("cidr", ["10.65.0.7/32", "10.65.0.7/24", "0.0.0.0/0", "fd00:65::9/128", "fd00:65::9/64"])
def test_a_route_key_from_a_parsed_network_is_the_same_bytes(cidr: str) -> None:
    import ipaddress

    from felixpy.drivers.bpfroutes.driver import _norm

    net = ipaddress.ip_network(cidr, strict=False)
    assert bytes(mt.route_key_of(net)) == bytes(mt.route_key(cidr)) == _norm(cidr)[2]
    assert _norm(cidr)[:2] == (str(net), net.version)
