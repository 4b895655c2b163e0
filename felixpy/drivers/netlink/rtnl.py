"""A minimal raw rtnetlink codec for the hot path: routes and neighbours.

Why not pyroute2 here: pyroute2 0.9.7 costs ~0.3 ms per route add (one
blocking round trip plus Python encoding) and ~60-90 us per route decoded in a
dump.  Workload routes come in thousands, so the route table uses this module
instead: requests are packed with :mod:`struct` (a few microseconds each) and
*pipelined* — written back to back without ``NLM_F_ACK`` (the kernel still
reports every failure as an ``NLMSG_ERROR`` carrying the request's sequence
number), followed by one acknowledged ``NLMSG_NOOP`` as a barrier.  Dumps are
decoded with ``struct.unpack_from`` and filtered in the kernel
(``NETLINK_GET_STRICT_CHK``: by table and, for per-interface resyncs, by
output interface).  Measurements are in ``docs/routing.md``.

Only the attributes Felix programs are encoded or decoded: destination, TOS,
metric, type, scope, protocol, table, output interface, gateway, preferred
source, the onlink flag and the MTU metric.  Anything else in a dumped route is
ignored (multipath routes decode with ``oif`` 0).
"""

from __future__ import annotations

import errno as _errno
import ipaddress
import socket
import struct
from collections.abc import Iterator, Sequence

from felixpy.drivers.netlink.errors import ConnectFailed, NetlinkCallError
from felixpy.drivers.netlink.nsutil import call_in_netns
from felixpy.drivers.netlink.types import (
    AF_INET,
    AF_INET6,
    IFF_RUNNING,
    IFF_UP,
    Link,
    VXLANInfo,
    RT_SCOPE_NOWHERE,
    RTNH_F_ONLINK,
    RTPROT_UNSPEC,
    Neigh,
    Route,
)

NETLINK_ROUTE = 0
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_GET_STRICT_CHK = 12
SO_RCVBUFFORCE = 33

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWROUTE = 24
RTM_DELROUTE = 25
RTM_GETROUTE = 26
RTM_NEWNEIGH = 28
RTM_NEWLINK = 16
RTM_GETLINK = 18
IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINKINFO = 18
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
IFLA_VXLAN_ID = 1
IFLA_VXLAN_LINK = 3
IFLA_VXLAN_LOCAL = 4
IFLA_VXLAN_LEARNING = 7
IFLA_VXLAN_L2MISS = 13
IFLA_VXLAN_PORT = 15
IFLA_VXLAN_LOCAL6 = 17
IFLA_VXLAN_GBP = 23

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP_INTR = 0x10
NLM_F_REPLACE = 0x100
NLM_F_DUMP = 0x300
NLM_F_CREATE = 0x400

RTA_DST = 1
RTA_OIF = 4
RTA_GATEWAY = 5
RTA_PRIORITY = 6
RTA_PREFSRC = 7
RTA_METRICS = 8
RTA_TABLE = 15
RTAX_MTU = 2
NDA_DST = 1
NDA_LLADDR = 2
NLA_TYPE_MASK = 0x3FFF

_IFINFO = struct.Struct("=BxHiII")  # family type index flags change
_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_RTMSG = struct.Struct("=BBBBBBBBI")  # family dst_len src_len tos table protocol scope type flags
_NDMSG = struct.Struct("=BxxxiHBB")  # family ifindex state flags type
_RTA = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")

_MAX_BATCH_BYTES = 256 * 1024


def _attr(rta_type: int, data: bytes) -> bytes:
    length = 4 + len(data)
    return _RTA.pack(length, rta_type) + data + b"\0" * ((4 - length % 4) % 4)


def _ip_bytes(addr: str) -> bytes:
    return socket.inet_pton(AF_INET6 if ":" in addr else AF_INET, addr)


def _cidr_parts(cidr: str) -> tuple[bytes, int]:
    addr, _, plen = cidr.partition("/")
    raw = _ip_bytes(addr)
    return raw, int(plen) if plen else len(raw) * 8


def _msg(msg_type: int, flags: int, seq: int, body: bytes) -> bytes:
    return _HDR.pack(16 + len(body), msg_type, flags, seq, 0) + body


def encode_route(route: Route, seq: int, *, delete: bool = False, ack: bool = False) -> bytes:
    dst_raw, dst_len = _cidr_parts(route.dst)
    table_byte = route.table if route.table < 256 else 252  # RT_TABLE_COMPAT
    if delete:
        # Match on (family, table, dst, tos, metric) only; the rest are wildcards.
        body = _RTMSG.pack(route.family, dst_len, 0, route.tos, table_byte, RTPROT_UNSPEC,
                           RT_SCOPE_NOWHERE, 0, 0)
        attrs = [_attr(RTA_TABLE, _U32.pack(route.table)), _attr(RTA_DST, dst_raw)]
        if route.priority:
            attrs.append(_attr(RTA_PRIORITY, _U32.pack(route.priority)))
        flags = NLM_F_REQUEST | (NLM_F_ACK if ack else 0)
        return _msg(RTM_DELROUTE, flags, seq, body + b"".join(attrs))
    body = _RTMSG.pack(route.family, dst_len, 0, route.tos, table_byte, route.protocol, route.scope,
                       route.type, RTNH_F_ONLINK if route.onlink else 0)
    attrs = [_attr(RTA_TABLE, _U32.pack(route.table)), _attr(RTA_DST, dst_raw)]
    if route.priority:
        attrs.append(_attr(RTA_PRIORITY, _U32.pack(route.priority)))
    if route.oif:
        attrs.append(_attr(RTA_OIF, _U32.pack(route.oif)))
    if route.gateway:
        attrs.append(_attr(RTA_GATEWAY, _ip_bytes(route.gateway)))
    if route.src:
        attrs.append(_attr(RTA_PREFSRC, _ip_bytes(route.src)))
    if route.mtu:
        attrs.append(_attr(RTA_METRICS, _attr(RTAX_MTU, _U32.pack(route.mtu))))
    flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE | (NLM_F_ACK if ack else 0)
    return _msg(RTM_NEWROUTE, flags, seq, body + b"".join(attrs))


def encode_neigh_replace(neigh: Neigh, seq: int) -> bytes:
    body = _NDMSG.pack(neigh.family, neigh.ifindex, neigh.state, 0, 1)  # type RTN_UNICAST
    attrs = _attr(NDA_DST, _ip_bytes(neigh.dst))
    if neigh.lladdr:
        attrs += _attr(NDA_LLADDR, bytes.fromhex(neigh.lladdr.replace(":", "")))
    return _msg(RTM_NEWNEIGH, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE, seq, body + attrs)


def encode_route_dump(family: int, table: int, oif: int | None = None, seq: int = 0) -> bytes:
    body = _RTMSG.pack(family, 0, 0, 0, table if table < 256 else 0, 0, 0, 0, 0)
    attrs = _attr(RTA_TABLE, _U32.pack(table))
    if oif:
        attrs += _attr(RTA_OIF, _U32.pack(oif))
    return _msg(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, seq, body + attrs)


def decode_route(buf: bytes | memoryview, off: int, end: int) -> Route:
    """Decode one RTM_NEWROUTE payload (``off`` points just past the nlmsghdr)."""
    family, dst_len, _src_len, tos, table, proto, scope, rtype, flags = _RTMSG.unpack_from(buf, off)
    addr_len = 4 if family == AF_INET else 16
    dst_raw = b"\0" * addr_len
    oif = 0
    priority = 0
    gateway = src = None
    mtu = None
    pos = off + _RTMSG.size
    while pos + 4 <= end:
        rta_len, rta_type = _RTA.unpack_from(buf, pos)
        if rta_len < 4:
            break
        dpos = pos + 4
        rta_type &= NLA_TYPE_MASK
        if rta_type == RTA_DST:
            dst_raw = bytes(buf[dpos:dpos + addr_len])
        elif rta_type == RTA_OIF:
            (oif,) = _U32.unpack_from(buf, dpos)
        elif rta_type == RTA_PRIORITY:
            (priority,) = _U32.unpack_from(buf, dpos)
        elif rta_type == RTA_TABLE:
            (table,) = _U32.unpack_from(buf, dpos)
        elif rta_type == RTA_GATEWAY:
            gateway = str(ipaddress.ip_address(bytes(buf[dpos:dpos + addr_len])))
        elif rta_type == RTA_PREFSRC:
            src = str(ipaddress.ip_address(bytes(buf[dpos:dpos + addr_len])))
        elif rta_type == RTA_METRICS:
            mpos, mend = dpos, pos + rta_len
            while mpos + 4 <= mend:
                m_len, m_type = _RTA.unpack_from(buf, mpos)
                if m_len < 4:
                    break
                if m_type & NLA_TYPE_MASK == RTAX_MTU:
                    (mtu,) = _U32.unpack_from(buf, mpos + 4)
                mpos += (m_len + 3) & ~3
        pos += (rta_len + 3) & ~3
    if family == AF_INET:
        dst = f"{socket.inet_ntop(AF_INET, dst_raw)}/{dst_len}"
    else:
        dst = str(ipaddress.IPv6Network((dst_raw, dst_len)))
    return Route(family=family, dst=dst, table=table, tos=tos, priority=priority, type=rtype, scope=scope,
                 protocol=proto, oif=oif, gateway=gateway, src=src, onlink=bool(flags & RTNH_F_ONLINK), mtu=mtu)


def iter_messages(buf: bytes | memoryview, length: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield (type, flags, seq, payload_offset, message_end) for each message."""
    off = 0
    while off + 16 <= length:
        msg_len, msg_type, flags, seq, _pid = _HDR.unpack_from(buf, off)
        if msg_len < 16:
            break
        yield msg_type, flags, seq, off + 16, off + msg_len
        off += (msg_len + 3) & ~3


class RtnlSocket:
    """One NETLINK_ROUTE socket, opened in ``netns`` (or the thread's namespace)."""

    def __init__(self, netns: str | None = None, rcvbuf: int = 8 << 20) -> None:
        def _open() -> socket.socket:
            s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
            try:
                try:
                    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
                except PermissionError:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                s.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
                s.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
                s.bind((0, 0))
            except BaseException:
                s.close()
                raise
            return s

        try:
            self._sock = call_in_netns(netns, _open)
        except OSError as exc:
            raise ConnectFailed(f"cannot open rtnetlink socket (netns={netns}): {exc}") from exc
        self._seq = 0
        self._buf = bytearray(1 << 18)

    def close(self) -> None:
        self._sock.close()

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0x7FFFFFFF or 1
        return self._seq

    def _recv(self) -> int:
        try:
            return self._sock.recv_into(self._buf)
        except OSError as exc:
            raise NetlinkCallError("recv", exc.errno or _errno.EIO) from exc

    # -- pipelined writes ---------------------------------------------------
    def batch(self, encoded: Sequence[tuple[int, bytes]]) -> dict[int, int]:
        """Send pre-encoded requests ``(seq, bytes)``; return ``{seq: errno}`` for failures.

        The requests must carry no NLM_F_ACK; one acknowledged NOOP closes the
        batch.  If the socket reports ENOBUFS (error reports were lost) every
        request in the batch is reported failed with ENOBUFS, so the caller
        resyncs rather than trusting a partial picture.
        """
        failures: dict[int, int] = {}
        if not encoded:
            return failures
        chunk: list[bytes] = []
        size = 0
        try:
            for _seq, data in encoded:
                chunk.append(data)
                size += len(data)
                if size >= _MAX_BATCH_BYTES:
                    self._sock.send(b"".join(chunk))
                    chunk, size = [], 0
            barrier = self._next_seq()
            chunk.append(_msg(NLMSG_NOOP, NLM_F_REQUEST | NLM_F_ACK, barrier, b""))
            self._sock.send(b"".join(chunk))
        except OSError as exc:
            raise NetlinkCallError("send", exc.errno or _errno.EIO) from exc
        done = False
        try:
            while not done:
                n = self._recv()
                view = memoryview(self._buf)
                for msg_type, _flags, seq, pay, _end in iter_messages(view, n):
                    if msg_type != NLMSG_ERROR:
                        continue
                    (err,) = _I32.unpack_from(view, pay)
                    if seq == barrier:
                        done = True
                    elif err:
                        failures[seq] = -err
        except NetlinkCallError as exc:
            if exc.errno != _errno.ENOBUFS:
                raise
            return {seq: _errno.ENOBUFS for seq, _ in encoded}
        return failures

    def new_seq(self) -> int:
        return self._next_seq()

    # -- dumps ----------------------------------------------------------------
    def dump_routes(self, family: int, table: int, oif: int | None = None) -> list[Route]:
        """All routes of ``family`` in ``table`` (optionally only via ``oif``).

        Retries (up to 5 times) when the kernel flags the dump as interrupted
        by concurrent changes, as Felix does.
        """
        for _attempt in range(5):
            routes, interrupted = self._dump_routes_once(family, table, oif)
            if not interrupted:
                return routes
        raise NetlinkCallError("route dump", _errno.EINTR, "dump kept being interrupted")

    def _dump_routes_once(self, family: int, table: int, oif: int | None) -> tuple[list[Route], bool]:
        seq = self._next_seq()
        try:
            self._sock.send(encode_route_dump(family, table, oif, seq))
        except OSError as exc:
            raise NetlinkCallError("route dump", exc.errno or _errno.EIO) from exc
        routes: list[Route] = []
        interrupted = False
        while True:
            n = self._recv()
            view = memoryview(self._buf)
            for msg_type, flags, mseq, pay, end in iter_messages(view, n):
                if mseq != seq:
                    continue
                if flags & NLM_F_DUMP_INTR:
                    interrupted = True
                if msg_type == NLMSG_DONE:
                    return routes, interrupted
                if msg_type == NLMSG_ERROR:
                    (err,) = _I32.unpack_from(view, pay)
                    if err == -_errno.ENOENT:
                        return routes, interrupted  # table does not exist yet: empty
                    raise NetlinkCallError("route dump", -err)
                if msg_type == RTM_NEWROUTE:
                    route = decode_route(view, pay, end)
                    if route.table == table and (not oif or route.oif == oif):
                        routes.append(route)




def _attrs(buf: bytes | memoryview, pos: int, end: int) -> Iterator[tuple[int, int, int]]:
    """Yield (type, data_offset, data_end) for each attribute in [pos, end)."""
    while pos + 4 <= end:
        rta_len, rta_type = _RTA.unpack_from(buf, pos)
        if rta_len < 4:
            return
        yield rta_type & NLA_TYPE_MASK, pos + 4, pos + rta_len
        pos += (rta_len + 3) & ~3


def decode_link(buf: bytes | memoryview, off: int, end: int) -> Link:
    _family, _type, index, flags, _change = _IFINFO.unpack_from(buf, off)
    name = ""
    mtu = 0
    mac = None
    kind = ""
    vx = None
    for t, d, e in _attrs(buf, off + _IFINFO.size, end):
        if t == IFLA_IFNAME:
            name = bytes(buf[d:e]).rstrip(b"\0").decode()
        elif t == IFLA_MTU:
            (mtu,) = _U32.unpack_from(buf, d)
        elif t == IFLA_ADDRESS and e - d == 6:
            mac = bytes(buf[d:e]).hex(":")
        elif t == IFLA_LINKINFO:
            data = None
            for it, idd, ie in _attrs(buf, d, e):
                if it == IFLA_INFO_KIND:
                    kind = bytes(buf[idd:ie]).rstrip(b"\0").decode()
                elif it == IFLA_INFO_DATA:
                    data = (idd, ie)
            if kind == "vxlan" and data is not None:
                vals: dict[str, object] = {"vni": 0, "port": 0, "local": None, "parent_index": 0,
                                           "learning": False, "gbp": False, "l2miss": False}
                for vt, vd, ve in _attrs(buf, data[0], data[1]):
                    if vt == IFLA_VXLAN_ID:
                        vals["vni"] = _U32.unpack_from(buf, vd)[0]
                    elif vt == IFLA_VXLAN_LINK:
                        vals["parent_index"] = _U32.unpack_from(buf, vd)[0]
                    elif vt == IFLA_VXLAN_LOCAL:
                        vals["local"] = socket.inet_ntop(AF_INET, bytes(buf[vd:vd + 4]))
                    elif vt == IFLA_VXLAN_LOCAL6:
                        vals["local"] = socket.inet_ntop(AF_INET6, bytes(buf[vd:vd + 16]))
                    elif vt == IFLA_VXLAN_LEARNING:
                        vals["learning"] = bool(buf[vd])
                    elif vt == IFLA_VXLAN_L2MISS:
                        vals["l2miss"] = bool(buf[vd])
                    elif vt == IFLA_VXLAN_PORT:
                        vals["port"] = struct.unpack_from("!H", buf, vd)[0]
                    elif vt == IFLA_VXLAN_GBP:
                        vals["gbp"] = True
                vx = VXLANInfo(**vals)  # type: ignore[arg-type]
    return Link(index=index, name=name, kind=kind, mtu=mtu, mac=mac, admin_up=bool(flags & IFF_UP),
                oper_up=bool(flags & IFF_RUNNING), vxlan=vx)


def _links_request(seq: int, name: str | None) -> bytes:
    body = _IFINFO.pack(0, 0, 0, 0, 0)
    if name is None:
        return _msg(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, body)
    return _msg(RTM_GETLINK, NLM_F_REQUEST, seq, body + _attr(IFLA_IFNAME, name.encode() + b"\0"))


def _links(sock: "RtnlSocket", name: str | None) -> list[Link]:
    seq = sock.new_seq()
    try:
        sock._sock.send(_links_request(seq, name))
    except OSError as exc:
        raise NetlinkCallError("link dump", exc.errno or _errno.EIO) from exc
    links: list[Link] = []
    while True:
        n = sock._recv()
        view = memoryview(sock._buf)
        for msg_type, flags, mseq, pay, end in iter_messages(view, n):
            if mseq != seq:
                continue
            if msg_type == NLMSG_DONE:
                return links
            if msg_type == NLMSG_ERROR:
                (err,) = _I32.unpack_from(view, pay)
                if err:
                    raise NetlinkCallError(f"link get {name}" if name else "link dump", -err)
                return links
            if msg_type == RTM_NEWLINK:
                links.append(decode_link(view, pay, end))
                if name is not None and not flags & NLM_F_MULTI:
                    return links


def dump_links(sock: "RtnlSocket") -> list[Link]:
    return _links(sock, None)


def get_link(sock: "RtnlSocket", name: str) -> Link:
    links = _links(sock, name)
    if not links:
        raise NetlinkCallError(f"link get {name}", _errno.ENODEV)
    return links[0]
