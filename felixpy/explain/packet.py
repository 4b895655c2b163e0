"""The packet being explained, and the protocol / ICMP names the kernel tools print."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

PROTOCOLS: dict[str, int] = {
    "icmp": 1, "igmp": 2, "ipencap": 4, "ipip": 4, "tcp": 6, "udp": 17, "gre": 47, "esp": 50, "ah": 51,
    "icmpv6": 58, "ipv6-icmp": 58, "icmp6": 58, "sctp": 132, "udplite": 136, "dccp": 33,
}
PORT_PROTOCOLS = frozenset({6, 17, 132, 136, 33})
PROTOCOL_NAMES = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6", 132: "sctp", 136: "udplite", 33: "dccp"}

# nft prints well-known ICMP types by name.
ICMP_TYPES: dict[str, int] = {
    "echo-reply": 0, "destination-unreachable": 3, "source-quench": 4, "redirect": 5, "echo-request": 8,
    "router-advertisement": 9, "router-solicitation": 10, "time-exceeded": 11, "parameter-problem": 12,
    "timestamp-request": 13, "timestamp-reply": 14, "info-request": 15, "info-reply": 16,
    "address-mask-request": 17, "address-mask-reply": 18,
}
ICMPV6_TYPES: dict[str, int] = {
    "destination-unreachable": 1, "packet-too-big": 2, "time-exceeded": 3, "parameter-problem": 4,
    "echo-request": 128, "echo-reply": 129, "mld-listener-query": 130, "mld-listener-report": 131,
    "mld-listener-done": 132, "mld-listener-reduction": 132, "nd-router-solicit": 133, "nd-router-advert": 134,
    "nd-neighbor-solicit": 135, "nd-neighbor-advert": 136, "nd-redirect": 137, "router-renumbering": 138,
    "ind-neighbor-solicit": 141, "ind-neighbor-advert": 142, "mld2-listener-report": 143,
}

# nft prints ICMP codes by these names (its icmp_code / icmpv6_code symbol tables).
ICMP_CODES: dict[str, int] = {
    "net-unreachable": 0, "host-unreachable": 1, "prot-unreachable": 2, "port-unreachable": 3,
    "frag-needed": 4, "net-prohibited": 9, "host-prohibited": 10, "admin-prohibited": 13,
}
ICMPV6_CODES: dict[str, int] = {
    "no-route": 0, "admin-prohibited": 1, "addr-unreachable": 3, "port-unreachable": 4, "policy-fail": 5,
    "reject-route": 6,
}


def protocol_number(name: str) -> int | None:
    """``tcp`` → 6, ``"17"`` → 17; None for a name we don't know."""
    name = name.lower()
    if name.isdigit():
        return int(name)
    return PROTOCOLS.get(name)


@dataclass(frozen=True, slots=True)
class Packet:
    """One packet of a NEW connection (conntrack state NEW unless ``ct_state`` says otherwise).

    ``iif``/``oif`` are ``None`` where the hook has none (no input interface for locally
    generated packets, no output interface for packets to this host).
    """

    src: IPAddress
    dst: IPAddress
    proto: int
    sport: int = 0
    dport: int = 0
    icmp_type: int | None = None
    icmp_code: int | None = None
    iif: str | None = None
    oif: str | None = None
    mark: int = 0
    ct_state: str = "NEW"

    @property
    def ip_version(self) -> int:
        return self.src.version

    @property
    def has_ports(self) -> bool:
        return self.proto in PORT_PROTOCOLS

    def with_mark(self, mark: int) -> Packet:
        return replace(self, mark=mark & 0xFFFFFFFF)

    def describe(self) -> str:
        proto = PROTOCOL_NAMES.get(self.proto, str(self.proto))
        if self.has_ports:
            what = f"{proto} {self.src}:{self.sport} -> {self.dst}:{self.dport}"
        elif self.icmp_type is not None:
            code = f"/{self.icmp_code}" if self.icmp_code is not None else ""
            what = f"{proto} type {self.icmp_type}{code} {self.src} -> {self.dst}"
        else:
            what = f"{proto} {self.src} -> {self.dst}"
        return f"{what} (in {self.iif or '-'}, out {self.oif or '-'}, conntrack {self.ct_state})"


def make_packet(src: str, dst: str, proto: str, *, sport: int | None = None, dport: int | None = None,
                icmp_type: int | None = None, icmp_code: int | None = None) -> Packet:
    """A packet from CLI-style arguments; ValueError with a plain message for bad input.

    Defaults: an ephemeral source port 40000, and an echo request for ICMP without a type.
    """
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    if s.version != d.version:
        raise ValueError(f"--src {src} and --dst {dst} are of different IP versions")
    num = protocol_number(proto)
    if num is None or not 0 <= num <= 255:
        raise ValueError(f"unknown protocol {proto!r} (use tcp, udp, icmp, icmpv6 or a number 0-255)")
    if num in (1, 58) and num != (1 if s.version == 4 else 58):
        raise ValueError(f"protocol {proto} does not go with IPv{s.version}")
    for port, what in ((sport, "--sport"), (dport, "--dport")):
        if port is not None and not 0 <= port <= 65535:
            raise ValueError(f"{what} {port} is not a port")
    if num in (1, 58):
        if icmp_type is None:
            icmp_type = 8 if num == 1 else 128
        return Packet(s, d, num, icmp_type=icmp_type, icmp_code=icmp_code if icmp_code is not None else 0)
    if num in PORT_PROTOCOLS:
        return Packet(s, d, num, sport=40000 if sport is None else sport, dport=dport or 0)
    return Packet(s, d, num)
