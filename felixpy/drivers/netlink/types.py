"""Frozen values for the kernel objects the routing drivers read and write.

These are what the netlink shim hands out and accepts; pyroute2's dict-like
messages (and ``ip -j`` output) are converted to and from them at the
shim boundary and never travel further.  Addresses are canonical strings
(``ipaddress`` formatting: ``10.0.0.1``, ``fd00::1``), CIDRs are canonical
network strings (``10.0.0.0/26``), MACs are lower-case ``aa:bb:cc:dd:ee:ff``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass, field

# Plain ints, as the kernel and ``ip -j`` give them (not ``socket.AddressFamily``): every
# ``family`` field and key below is an ``int``.
AF_INET: int = socket.AF_INET
AF_INET6: int = socket.AF_INET6
AF_BRIDGE = 7

RT_TABLE_MAIN = 254

# Route types (rtm_type).
RTN_UNICAST = 1
RTN_LOCAL = 2
RTN_BLACKHOLE = 6
RTN_UNREACHABLE = 7
RTN_PROHIBIT = 8
RTN_THROW = 9
SPECIAL_ROUTE_TYPES = frozenset({RTN_LOCAL, RTN_BLACKHOLE, RTN_UNREACHABLE, RTN_PROHIBIT, RTN_THROW})

# Route scopes (rtm_scope).
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
RT_SCOPE_HOST = 254
RT_SCOPE_NOWHERE = 255

# Route protocols (rtm_protocol).
RTPROT_UNSPEC = 0
RTPROT_KERNEL = 2
RTPROT_BOOT = 3
RTPROT_BIRD = 12
DEFAULT_ROUTE_PROTO = 80  # Felix's dataplanedefs.DefaultRouteProto

RTNH_F_ONLINK = 4

# Neighbour states/flags.
NUD_PERMANENT = 0x80
NTF_SELF = 0x02

# Link flags.
IFF_UP = 0x1
IFF_RUNNING = 0x40


def family_of(ip_version: int) -> int:
    if ip_version == 4:
        return AF_INET
    if ip_version == 6:
        return AF_INET6
    raise ValueError(f"unknown IP version {ip_version}")


_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# An IPv4 address exactly as ``ipaddress`` prints it (four decimal octets, no leading zeros): its own
# canonical form.  One match is ~10x cheaper than a parse, and the feed's addresses (5,000 VTEPs, two
# each, at a large cluster's start of day) are nearly all like that.
_CANONICAL_QUAD = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
_V4_PREFIX_LEN = re.compile(r"3[0-2]|[12]?[0-9]")  # 0-32 as ipaddress prints it (no sign, no leading zero)


def canon_cidr(cidr: str) -> str:
    """``10.0.0.1`` -> ``10.0.0.1/32``; host bits are masked off.

    An IPv4 CIDR already spelled as ``ipaddress`` spells one (a canonical quad, a plain prefix length)
    is masked with integer arithmetic: the 5,000 VXLAN routes of a large cluster's start of day are
    all like that, and a parse each was ~10 µs on the loop's thread (now ~4 µs, ~1 µs for a /32).
    Anything else, IPv6 included, goes through ``ipaddress`` (which also raises the ``ValueError`` for
    what is not a CIDR)."""
    addr, slash, plen = cidr.partition("/")
    if _CANONICAL_QUAD.fullmatch(addr) and (not slash or _V4_PREFIX_LEN.fullmatch(plen)):
        n = int(plen) if slash else 32
        if n == 32:
            return f"{addr}/32"
        net = int.from_bytes(socket.inet_aton(addr), "big") & ~((1 << (32 - n)) - 1)
        return f"{socket.inet_ntoa(net.to_bytes(4, 'big'))}/{n}"
    return str(ipaddress.ip_network(cidr, strict=False))


def canon_ip(addr: str) -> str:
    addr = addr.split("/", 1)[0]
    if _CANONICAL_QUAD.fullmatch(addr):
        return addr
    return str(ipaddress.ip_address(addr))


_CANONICAL_MAC = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}")


def canon_mac(mac: str) -> str:
    if _CANONICAL_MAC.fullmatch(mac):
        return mac
    parts = mac.replace("-", ":").split(":")
    if len(parts) != 6:
        raise ValueError(f"not a MAC address: {mac!r}")
    return ":".join(f"{int(p, 16):02x}" for p in parts)


@dataclass(frozen=True, slots=True)
class VXLANInfo:
    vni: int
    port: int
    local: str | None = None  # source (parent) address
    parent_index: int = 0  # IFLA_VXLAN_LINK
    learning: bool = False
    gbp: bool = False
    l2miss: bool = False


@dataclass(frozen=True, slots=True)
class Link:
    index: int
    name: str
    kind: str = ""  # "veth", "vxlan", "ipip", "wireguard", "" (unknown/none)
    mtu: int = 1500
    mac: str | None = None
    admin_up: bool = False
    oper_up: bool = False  # IFF_RUNNING, as Felix's ifacemonitor.LinkIsOperUp
    vxlan: VXLANInfo | None = None


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """What to create with ``link_add``."""

    name: str
    kind: str
    mtu: int | None = None
    mac: str | None = None
    vxlan: VXLANInfo | None = None


@dataclass(frozen=True, slots=True)
class Addr:
    index: int
    family: int
    address: str
    prefixlen: int
    scope: int = RT_SCOPE_UNIVERSE


@dataclass(frozen=True, slots=True)
class Route:
    """One kernel route.  ``oif`` 0 means none (v6 special routes report 1, ``lo``)."""

    family: int
    dst: str  # canonical CIDR
    table: int = RT_TABLE_MAIN
    tos: int = 0
    priority: int = 0
    type: int = RTN_UNICAST
    scope: int = RT_SCOPE_UNIVERSE
    protocol: int = RTPROT_BOOT
    oif: int = 0
    gateway: str | None = None
    src: str | None = None
    onlink: bool = False
    mtu: int | None = None

    @property
    def key(self) -> tuple[str, int, int]:
        """The kernel's FIB key within a (family, table): destination, TOS, metric."""
        return (self.dst, self.tos, self.priority)


@dataclass(frozen=True, slots=True)
class Rule:
    """A routing policy rule (``ip rule``); only the fields Felix matches on."""

    family: int
    priority: int
    table: int
    invert: bool = False
    mark: int = 0
    mask: int | None = None
    src: str | None = None  # canonical CIDR

    def describe(self) -> str:
        parts = [f"prio {self.priority}"]
        if self.invert:
            parts.append("not")
        if self.mask is not None or self.mark:
            parts.append(f"fwmark {self.mark:#x}/{(self.mask or 0):#x}")
        if self.src:
            parts.append(f"from {self.src}")
        parts.append(f"lookup {self.table}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Neigh:
    """An ARP/NDP entry (``family`` AF_INET/AF_INET6)."""

    family: int
    ifindex: int
    dst: str
    lladdr: str | None
    state: int = NUD_PERMANENT


@dataclass(frozen=True, slots=True)
class FDBEntry:
    """A bridge FDB entry on a VXLAN device: inner MAC -> outer (host) IP."""

    ifindex: int
    mac: str
    dst: str | None
    state: int = NUD_PERMANENT
    flags: int = NTF_SELF


@dataclass(frozen=True, slots=True)
class WireguardPeer:
    public_key: str
    endpoint: str | None = None  # "ip:port" / "[ip6]:port"
    allowed_ips: tuple[str, ...] = ()
    keepalive: int = 0


@dataclass(frozen=True, slots=True)
class WireguardDevice:
    private_key: str | None
    listen_port: int
    fwmark: int
    peers: tuple[WireguardPeer, ...] = field(default=())
