"""Build test packets (Ethernet + IPv4/IPv6 + TCP/UDP/ICMP) with correct checksums.

Used by the TEST_RUN harness and the benchmarks; pure ``struct``, no scapy.
"""

from __future__ import annotations

import socket
import struct

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_ARP = 0x0806

TCP_FIN, TCP_SYN, TCP_RST, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x04, 0x08, 0x10

SRC_MAC = bytes.fromhex("020000000001")
DST_MAC = bytes.fromhex("020000000002")


def csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = int(sum(struct.unpack(f"!{len(data) // 2}H", data)))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def eth(ethertype: int, payload: bytes, src: bytes = SRC_MAC, dst: bytes = DST_MAC) -> bytes:
    return dst + src + struct.pack("!H", ethertype) + payload


def _is_v6(addr: str) -> bool:
    return ":" in addr


def tcp(sport: int, dport: int, flags: int = TCP_SYN, seq: int = 1000, ack: int = 0,
        payload: bytes = b"") -> tuple[int, bytes]:
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0)
    return 6, hdr + payload


def udp(sport: int, dport: int, payload: bytes = b"hello") -> tuple[int, bytes]:
    return 17, struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def icmp(icmp_type: int = 8, code: int = 0, ident: int = 1, seq: int = 1, v6: bool = False,
         payload: bytes = b"ping") -> tuple[int, bytes]:
    body = struct.pack("!BBHHH", icmp_type, code, 0, ident, seq) + payload
    if not v6:
        c = csum(body)
        body = body[:2] + struct.pack("!H", c) + body[4:]
    return (58 if v6 else 1), body


def _l4_csum(proto: int, src: bytes, dst: bytes, l4: bytes) -> bytes:
    if proto not in (6, 17, 58):
        return l4
    if len(src) == 4:
        pseudo = src + dst + struct.pack("!BBH", 0, proto, len(l4))
    else:
        pseudo = src + dst + struct.pack("!I3xB", len(l4), proto)
    off = {6: 16, 17: 6, 58: 2}[proto]
    l4 = l4[:off] + b"\0\0" + l4[off + 2:]
    c = csum(pseudo + l4)
    if proto == 17 and c == 0:
        c = 0xFFFF
    return l4[:off] + struct.pack("!H", c) + l4[off + 2:]


def ipv4(src: str, dst: str, l4: tuple[int, bytes], *, ttl: int = 64, ident: int = 1,
         frag_off: int = 0, options: bytes = b"", tot_len: int | None = None,
         ihl: int | None = None, version: int = 4, tos: int = 0) -> bytes:
    proto, body = l4
    s, d = socket.inet_aton(src), socket.inet_aton(dst)
    body = _l4_csum(proto, s, d, body)
    hl = 20 + len(options)
    vihl = (version << 4) | (ihl if ihl is not None else hl // 4)
    total = tot_len if tot_len is not None else hl + len(body)
    hdr = struct.pack("!BBHHHBBH4s4s", vihl, tos, total, ident, frag_off, ttl, proto, 0, s, d)
    hdr += options
    c = csum(hdr)
    hdr = hdr[:10] + struct.pack("!H", c) + hdr[12:]
    return hdr + body


def ipv6(src: str, dst: str, l4: tuple[int, bytes], *, hop_limit: int = 64,
         ext_headers: list[tuple[int, bytes]] | None = None,
         payload_len: int | None = None, tclass: int = 0, flow: int = 0) -> bytes:
    """``ext_headers``: list of (header type, body) where body excludes the next-header byte;
    e.g. (0, b"\\x00" + 5 pad bytes) for hop-by-hop."""
    proto, body = l4
    s = socket.inet_pton(socket.AF_INET6, src)
    d = socket.inet_pton(socket.AF_INET6, dst)
    body = _l4_csum(proto, s, d, body)
    ext = b""
    first = proto
    if ext_headers:
        types = [t for t, _ in ext_headers]
        first = types[0]
        nexts = types[1:] + [proto]
        for (_t, b), nh in zip(ext_headers, nexts, strict=True):
            ext += bytes([nh]) + b
    plen = payload_len if payload_len is not None else len(ext) + len(body)
    hdr = struct.pack("!IHBB16s16s", (6 << 28) | (tclass << 20) | flow, plen, first, hop_limit, s, d)
    return hdr + ext + body


def packet(src: str, dst: str, l4: tuple[int, bytes], **kw: object) -> bytes:
    """Ethernet frame for the right family."""
    if _is_v6(src):
        return eth(ETH_P_IPV6, ipv6(src, dst, l4, **kw))  # type: ignore[arg-type]
    return eth(ETH_P_IP, ipv4(src, dst, l4, **kw))  # type: ignore[arg-type]


def tcp_pkt(src: str, sport: int, dst: str, dport: int, flags: int = TCP_SYN, *, seq: int = 1000,
            ack: int = 0) -> bytes:
    return packet(src, dst, tcp(sport, dport, flags, seq=seq, ack=ack))


def udp_pkt(src: str, sport: int, dst: str, dport: int) -> bytes:
    return packet(src, dst, udp(sport, dport))


def icmp_pkt(src: str, dst: str, icmp_type: int | None = None, code: int = 0) -> bytes:
    v6 = _is_v6(src)
    t = icmp_type if icmp_type is not None else (128 if v6 else 8)
    return packet(src, dst, icmp(t, code, v6=v6))


def arp_pkt() -> bytes:
    body = struct.pack("!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, 1, SRC_MAC, socket.inet_aton("10.0.0.1"),
                       b"\0" * 6, socket.inet_aton("10.0.0.2"))
    return eth(ETH_P_ARP, body, dst=b"\xff" * 6)


def traffic_class_of(frame: bytes) -> int:
    """The IPv4 TOS byte or the IPv6 traffic class (DSCP << 2 | ECN)."""
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    if ethertype == ETH_P_IP:
        return frame[14 + 1]
    return (int(struct.unpack_from("!I", frame, 14)[0]) >> 20) & 0xFF


def ttl_of(frame: bytes) -> int:
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    return frame[14 + 8] if ethertype == ETH_P_IP else frame[14 + 7]
