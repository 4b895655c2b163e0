"""ctypes mirrors of the C map key/value structs in ``bpf-gpl/*_types.h``.

One class per C struct, field for field, with the size asserted at import time (and the
offsets the policy programs depend on).  Byte order follows the C comments: addresses are
network order (stored as raw bytes here), every other field is host (little-endian) order.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
from ctypes import (
    c_char,
    c_int8,
    c_int16,
    c_int32,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
)

from felixpy.bpf import defs

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def addr_bytes(ip: str | IPAddress, v6: bool) -> bytes:
    """Network-order bytes of an address (4 for v4, 16 for v6)."""
    return socket.inet_pton(socket.AF_INET6 if v6 else socket.AF_INET, str(ip))


def _check(cls: type[ctypes.Structure], size: int, **offsets: int) -> None:
    got = ctypes.sizeof(cls)
    assert got == size, f"{cls.__name__}: sizeof {got} != {size} (C layout)"
    for name, off in offsets.items():
        actual = getattr(cls, name).offset
        assert actual == off, f"{cls.__name__}.{name}: offset {actual} != {off}"


# --- ip_addr.h ----------------------------------------------------------------------------------


class Ipv6Addr(ctypes.Structure):
    _fields_ = [("raw", c_uint8 * 16)]


_check(Ipv6Addr, 16)


def _ipbuf(n: int) -> type[ctypes.Array[c_uint8]]:
    return c_uint8 * n


# --- conntrack_types.h ----------------------------------------------------------------------------


def _ct_key(addr_len: int) -> type[ctypes.Structure]:
    class CtKey(ctypes.Structure):
        _fields_ = [
            ("protocol", c_uint32),
            ("addr_a", _ipbuf(addr_len)),  # NBO
            ("addr_b", _ipbuf(addr_len)),  # NBO
            ("port_a", c_uint16),  # host order
            ("port_b", c_uint16),
        ]

    return CtKey


CtKey4 = _ct_key(4)
CtKey6 = _ct_key(16)
CtKey4.__name__ = "CtKey4"
CtKey6.__name__ = "CtKey6"
_check(CtKey4, 16)
_check(CtKey6, 40)


class CtLeg(ctypes.Structure):
    _fields_ = [
        ("bytes", c_uint64),
        ("packets", c_uint32),
        ("seqno", c_uint32),  # NBO
        ("syn_seen", c_uint32, 1),
        ("ack_seen", c_uint32, 1),
        ("fin_seen", c_uint32, 1),
        ("rst_seen", c_uint32, 1),
        ("approved", c_uint32, 1),
        ("opener", c_uint32, 1),
        ("workload", c_uint32, 1),
        ("ifindex", c_uint32),
    ]


_check(CtLeg, 24, ifindex=20)


def _ct_value(addr_len: int, size: int) -> type[ctypes.Structure]:
    class CtLegs(ctypes.Structure):
        _fields_ = [
            ("a_to_b", CtLeg),
            ("b_to_a", CtLeg),
            ("tun_ip", _ipbuf(addr_len)),
            ("orig_ip", _ipbuf(addr_len)),
            ("orig_port", c_uint16),
            ("orig_sport", c_uint16),
            ("orig_sip", _ipbuf(addr_len)),
        ]

    key_t = CtKey6 if addr_len == 16 else CtKey4

    class CtNatFwd(ctypes.Structure):
        _fields_ = [
            ("nat_rev_key", key_t),
            ("nat_sport", c_uint16),
            ("pad2", c_uint8 * (60 if addr_len == 16 else 46)),
        ]

    class CtUnion(ctypes.Union):
        _anonymous_ = ("legs", "fwd")
        _fields_ = [("legs", CtLegs), ("fwd", CtNatFwd)]

    class CtValue(ctypes.Structure):
        _anonymous_ = ("u",)
        _fields_ = [
            ("rst_seen", c_uint64),
            ("last_seen", c_uint64),
            ("type", c_uint8),
            ("flags", c_uint8),
            ("flags3", c_uint8),
            ("flags4", c_uint8),
            ("pad0", c_uint8 * 3),
            ("flags2", c_uint8),
            ("u", CtUnion),
        ]

        @property
        def all_flags(self) -> int:
            return int(self.flags | self.flags2 << 8 | self.flags3 << 16 | self.flags4 << 24)

    _check(CtValue, size, type=16, flags2=23, u=24)
    return CtValue


CtValue4 = _ct_value(4, 88)
CtValue6 = _ct_value(16, 128)
assert CtValue4.orig_ip.offset == 76 and CtValue6.orig_ip.offset == 88


def _ct_result(addr_len: int, size: int) -> type[ctypes.Structure]:
    class CtResult(ctypes.Structure):
        _fields_ = [
            ("rc", c_int16),
            ("pad", c_uint16),
            ("flags", c_uint32),
            ("nat_ip", _ipbuf(addr_len)),
            ("nat_sip", _ipbuf(addr_len)),
            ("nat_port", c_uint16),
            ("nat_sport", c_uint16),
            ("tun_ip", _ipbuf(addr_len)),
            ("ifindex_fwd", c_uint32),
            ("ifindex_created", c_uint32),
        ]

    _check(CtResult, size)
    return CtResult


CtResult4 = _ct_result(4, 32)
CtResult6 = _ct_result(16, 68)


def ct_key(proto: int, src: str, sport: int, dst: str, dport: int, v6: bool = False) -> ctypes.Structure:
    """The conntrack key for a flow, ordered as the C ``fill_ct_key`` orders it."""
    sb, db = addr_bytes(src, v6), addr_bytes(dst, v6)
    # Raw 32-bit word compare (words read little-endian, as the program loads them).
    sw = [int.from_bytes(sb[i:i + 4], "little") for i in range(0, len(sb), 4)]
    dw = [int.from_bytes(db[i:i + 4], "little") for i in range(0, len(db), 4)]
    src_lt = (sw, sport) < (dw, dport)
    k = (CtKey6 if v6 else CtKey4)()
    k.protocol = proto
    a, b, pa, pb = (sb, db, sport, dport) if src_lt else (db, sb, dport, sport)
    ctypes.memmove(k.addr_a, a, len(a))
    ctypes.memmove(k.addr_b, b, len(b))
    k.port_a, k.port_b = pa, pb
    return k


# --- policy_types.h ---------------------------------------------------------------------------------


class IPSetKey4(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("prefixlen", c_uint32),
        ("set_id", c_uint8 * 8),  # big-endian u64
        ("addr", c_uint8 * 4),  # NBO
        ("port", c_uint16),
        ("protocol", c_uint8),
        ("pad", c_uint8),
    ]


class IPSetKey6(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("prefixlen", c_uint32),
        ("set_id", c_uint8 * 8),
        ("addr", c_uint8 * 16),
        ("port", c_uint16),
        ("protocol", c_uint8),
        ("pad", c_uint8),
    ]


_check(IPSetKey4, 20, set_id=4, addr=12, port=16, protocol=18)
_check(IPSetKey6, 32, set_id=4, addr=12, port=28, protocol=30)

IPSET_ID_BITS = 64
IPSET_FULL_PREFIX_V4 = 128
IPSET_FULL_PREFIX_V6 = 224


def ipset_key(set_id: int, addr: str, prefix: int | None = None, *, port: int = 0,
              protocol: int = 0, v6: bool = False) -> ctypes.Structure:
    """An IP-set map key.  ``prefix`` is the CIDR length of a plain member; named-port members
    (port/protocol given) use the full address plus port and protocol bits."""
    k = (IPSetKey6 if v6 else IPSetKey4)()
    addr_bits = 128 if v6 else 32
    if port or protocol:
        k.prefixlen = IPSET_ID_BITS + addr_bits + 16 + 8
    else:
        k.prefixlen = IPSET_ID_BITS + (addr_bits if prefix is None else prefix)
    ctypes.memmove(k.set_id, set_id.to_bytes(8, "big"), 8)
    raw = addr_bytes(addr, v6)
    ctypes.memmove(k.addr, raw, len(raw))
    k.port = port
    k.protocol = protocol
    return k


# --- routes_types.h -----------------------------------------------------------------------------------


def _rt(addr_len: int) -> tuple[type[ctypes.Structure], type[ctypes.Structure]]:
    class RouteKey(ctypes.Structure):
        _fields_ = [("prefixlen", c_uint32), ("addr", _ipbuf(addr_len))]

    class RouteNh(ctypes.Union):
        _fields_ = [("next_hop", _ipbuf(addr_len)), ("if_index", c_uint32)]

    class RouteValue(ctypes.Structure):
        _anonymous_ = ("u",)
        _fields_ = [("flags", c_uint32), ("u", RouteNh)]

    return RouteKey, RouteValue


RouteKey4, RouteValue4 = _rt(4)
RouteKey6, RouteValue6 = _rt(16)
_check(RouteKey4, 8)
_check(RouteValue4, 8)
_check(RouteKey6, 20)
_check(RouteValue6, 20)


def route_key(cidr: str) -> ctypes.Structure:
    return route_key_of(ipaddress.ip_network(cidr, strict=False))


def route_key_of(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> ctypes.Structure:
    """:func:`route_key` of a network already parsed."""
    v6 = net.version == 6
    k = (RouteKey6 if v6 else RouteKey4)()
    k.prefixlen = net.prefixlen
    raw = net.network_address.packed
    ctypes.memmove(k.addr, raw, len(raw))
    return k


def route_value(flags: int, *, ifindex: int = 0, next_hop: str | None = None,
                v6: bool = False) -> ctypes.Structure:
    v = (RouteValue6 if v6 else RouteValue4)()
    v.flags = flags
    if next_hop is not None:
        raw = addr_bytes(next_hop, v6)
        ctypes.memmove(v.next_hop, raw, len(raw))
    else:
        v.if_index = ifindex
    return v


# --- ifstate_types.h ---------------------------------------------------------------------------------


class IfStateValue(ctypes.Structure):
    _fields_ = [
        ("flags", c_uint32),
        ("name", c_char * 16),
        ("xdp_policy_v4", c_int32),
        ("ingress_policy_v4", c_int32),
        ("egress_policy_v4", c_int32),
        ("xdp_policy_v6", c_int32),
        ("ingress_policy_v6", c_int32),
        ("egress_policy_v6", c_int32),
        ("tc_filter_ingress", c_int32),
        ("tc_filter_egress", c_int32),
    ]


_check(IfStateValue, 52, name=4, xdp_policy_v4=20, tc_filter_egress=48)


def ifstate_value(flags: int, name: str = "", **indices: int) -> IfStateValue:
    v = IfStateValue()
    v.flags = flags
    v.name = name.encode()[:16]
    for fld in IfStateValue._fields_[2:]:
        setattr(v, fld[0], indices.get(fld[0], -1))
    return v


# --- failsafe_types.h ----------------------------------------------------------------------------------


def _fsafe(addr_len: int) -> type[ctypes.Structure]:
    class FailsafeKey(ctypes.Structure):
        _fields_ = [
            ("prefixlen", c_uint32),
            ("port", c_uint16),
            ("ip_proto", c_uint8),
            ("flags", c_uint8),
            ("addr", _ipbuf(addr_len)),
        ]

    return FailsafeKey


FailsafeKey4 = _fsafe(4)
FailsafeKey6 = _fsafe(16)
_check(FailsafeKey4, 12)
_check(FailsafeKey6, 24)


class FailsafeValue(ctypes.Structure):
    _fields_ = [("unused", c_uint32)]


def failsafe_key(proto: int, port: int, cidr: str, *, outbound: bool = False) -> ctypes.Structure:
    net = ipaddress.ip_network(cidr, strict=False)
    v6 = net.version == 6
    k = (FailsafeKey6 if v6 else FailsafeKey4)()
    k.prefixlen = 32 + net.prefixlen
    k.port = port
    k.ip_proto = proto
    k.flags = defs.FSAFE_OUT if outbound else 0
    raw = net.network_address.packed
    ctypes.memmove(k.addr, raw, len(raw))
    return k


# --- counters.h ------------------------------------------------------------------------------------


class CountersKey(ctypes.Structure):
    _fields_ = [("ifindex", c_uint32), ("hook", c_uint32)]


class CountersValue(ctypes.Structure):
    _fields_ = [("c", c_uint64 * defs.MAX_COUNTERS)]


_check(CountersKey, 8)
_check(CountersValue, 216)


# --- globals_types.h -------------------------------------------------------------------------------


class TcGlobalData(ctypes.Structure):
    _fields_ = [
        ("host_ip", c_uint8 * 16),
        ("tunnel_mtu", c_uint16),
        ("vxlan_port", c_uint16),
        ("intf_ip", c_uint8 * 16),
        ("ext_to_svc_mark", c_uint32),
        ("psnat_start", c_uint16),
        ("psnat_len", c_uint16),
        ("host_tunnel_ip", c_uint8 * 16),
        ("flags", c_uint32),
        ("wg_port", c_uint16),
        ("profiling", c_uint16),
        ("natin_idx", c_uint32),
        ("natout_idx", c_uint32),
        ("overlay_tunnel_id", c_uint32),
        ("iface_name", c_char * 16),
        ("log_filter_jmp", c_uint32),
        ("jumps", c_uint32 * defs.JUMPS_LEN),
        ("dscp", c_int8),
        ("istio_dscp", c_int8),
        ("_pad", c_uint8 * 2),
        ("maglev_lut_size", c_uint32),
        ("ipfrag_timeout", c_uint32),
        ("host_ifindex", c_uint32),
    ]


_check(TcGlobalData, 276, intf_ip=20, flags=60, natin_idx=68, iface_name=80, log_filter_jmp=96,
       jumps=100, dscp=260, maglev_lut_size=264, host_ifindex=272)


class TcPreambleGlobals(ctypes.Structure):
    _fields_ = [("v4", TcGlobalData), ("v6", TcGlobalData)]


_check(TcPreambleGlobals, 552)


class ApKey(ctypes.Structure):
    _fields_ = [("ifindex", c_uint32), ("hook", c_uint32)]


class XdpGlobals(ctypes.Structure):
    _fields_ = [("iface_name", c_char * 16), ("jumps", c_uint32 * 16)]


class XdpPreambleGlobals(ctypes.Structure):
    _fields_ = [("v4", XdpGlobals), ("v6", XdpGlobals)]


_check(XdpGlobals, 80)
_check(XdpPreambleGlobals, 160)


def _empty_tc_globals() -> bytes:
    g = TcGlobalData()
    g.log_filter_jmp = defs.JUMP_UNUSED
    for i in range(defs.JUMPS_LEN):
        g.jumps[i] = defs.JUMP_UNUSED
    g.dscp = -1
    g.istio_dscp = -1
    return bytes(g)


_EMPTY_TC_GLOBALS = _empty_tc_globals()


def empty_tc_globals() -> TcGlobalData:
    """Every jump unused, no DSCP: a copy of one template (filling the ctypes array element by
    element cost ~23 us, 4,000 times at 1,000 dual-stack interfaces)."""
    return TcGlobalData.from_buffer_copy(_EMPTY_TC_GLOBALS)


def empty_xdp_globals() -> XdpGlobals:
    g = XdpGlobals()
    for i in range(16):
        g.jumps[i] = defs.JUMP_UNUSED
    return g


# --- types.h: struct cali_tc_state (the policy programs' view) -------------------------------------

STATE_BLOB_SIZE = 512


def _tc_state(addr_len: int) -> type[ctypes.Structure]:
    res_t = CtResult6 if addr_len == 16 else CtResult4

    class TcState(ctypes.Structure):
        _fields_ = [
            ("eventhdr_type", c_uint32),
            ("eventhdr_len", c_uint32),
            ("ip_src", c_uint8 * 16),
            ("ip_dst", c_uint8 * 16),
            ("pre_nat_ip_dst", c_uint8 * 16),
            ("post_nat_ip_dst", c_uint8 * 16),
            ("tun_ip", c_uint8 * 16),
            ("ihl", c_uint16),
            ("icmp_id", c_uint16),  # ICMP echo identifier (felixpy; Felix: unused)
            ("pol_rc", c_int32),
            ("sport", c_uint16),
            ("dport", c_uint16),  # icmp_type = low byte, icmp_code = high byte
            ("pre_nat_dport", c_uint16),
            ("post_nat_dport", c_uint16),
            ("ip_proto", c_uint8),
            ("tcp_flags", c_uint8),
            ("ip_size", c_uint16),
            ("rules_hit", c_uint32),
            ("rule_ids", c_uint64 * 32),
            ("flags", c_uint64),
            ("ct_result", res_t),
            ("l4_off", c_uint32),
            ("_pad_end", c_uint32),
        ]

    return TcState


TcState4 = _tc_state(4)
TcState6 = _tc_state(16)
for _st in (TcState4, TcState6):
    assert ctypes.sizeof(_st) <= STATE_BLOB_SIZE
    _check(_st, ctypes.sizeof(_st), ip_src=8, ip_dst=24, pre_nat_ip_dst=40, post_nat_ip_dst=56,
           tun_ip=72, pol_rc=92, sport=96, dport=98, pre_nat_dport=100, post_nat_dport=102,
           ip_proto=104, ip_size=106, rules_hit=108, rule_ids=112, flags=368, ct_result=376)

# Offsets the generated policy programs use (Felix's pol_prog_builder constants).
STATE_OFF_IP_SRC = 8
STATE_OFF_IP_DST = 24
STATE_OFF_PRE_NAT_IP_DST = 40
STATE_OFF_POST_NAT_IP_DST = 56
STATE_OFF_POL_RC = 92
STATE_OFF_SPORT = 96
STATE_OFF_DPORT = 98
STATE_OFF_ICMP_TYPE = 98
STATE_OFF_PRE_NAT_DPORT = 100
STATE_OFF_POST_NAT_DPORT = 102
STATE_OFF_IP_PROTO = 104
STATE_OFF_RULES_HIT = 108
STATE_OFF_RULE_IDS = 112
STATE_OFF_FLAGS = 368


# --- the __sk_buff context used with BPF_PROG_TEST_RUN ------------------------------------------------------


class SkBuff(ctypes.Structure):
    """The leading part of ``struct __sk_buff`` (uapi); TEST_RUN accepts a prefix."""

    _fields_ = [
        ("len", c_uint32),
        ("pkt_type", c_uint32),
        ("mark", c_uint32),
        ("queue_mapping", c_uint32),
        ("protocol", c_uint32),
        ("vlan_present", c_uint32),
        ("vlan_tci", c_uint32),
        ("vlan_proto", c_uint32),
        ("priority", c_uint32),
        ("ingress_ifindex", c_uint32),
        ("ifindex", c_uint32),
        ("tc_index", c_uint32),
        ("cb", c_uint32 * 5),
        ("hash", c_uint32),
    ]


_check(SkBuff, 72, mark=8, ifindex=40, cb=48)
SKB_CB_OFFSET = 48
