"""The netlink shim of the interface monitor: sockets in, :mod:`.events` values out.

What it owns
    Two ``NETLINK_ROUTE`` sockets, opened in the watched namespace (the
    calling thread's, or a named one for tests; a missing namespace is an
    error, never created): one subscribed to ``RTMGRP_LINK`` and
    ``RTMGRP_IPV4_IFADDR``/``RTMGRP_IPV6_IFADDR``, non-blocking and pollable
    (:meth:`RtnlSource.fileno`); one for request/response dumps of links and
    addresses, with a timeout.

Why raw sockets and not ``IPRoute.bind()``/``get()``
    In pyroute2 0.9 the sync ``IPRoute`` drives an asyncio loop of its own:
    ``get()`` blocks with no timeout (so ``stop()`` could not be prompt), and
    it may pull more from the socket than it returns, so polling its
    ``fileno()`` misses messages that sit in its queue (seen on this kernel).
    We need a descriptor we can ``poll()`` next to a wake-up pipe and the
    damping timers, and to see ``ENOBUFS`` (events lost) to trigger a resync.
    pyroute2 still decodes the events (:class:`MarshalRtnl`); its message
    objects never leave this module.  The dumps' messages are decoded here,
    from their bytes, one at a time (:func:`_link_from_payload`,
    :func:`_addr_from_payload`): pyroute2 took ~1.1 ms and ~30 KB a link,
    which at 10,000 links was ~11 s and ~300 MB at every resync.

Addresses
    Felix derives addresses from local unicast routes (table local, type
    local).  We read addresses (``RTM_NEWADDR``/``RTM_DELADDR``) instead:
    subscribing to route groups would make this process decode every route
    felixpy's own route tables program (thousands per resync), while address
    events are few.  To keep Felix's meaning, an address counts only while it
    is usable — an IPv6 address that is tentative (DAD running, unless
    optimistic) or has failed DAD has no local route, so it is reported
    absent; it appears when the kernel announces DAD complete.  Differences
    left: Felix would also list the network address of a local *prefix* route
    (``127.0.0.0`` on ``lo``) and AnyIP local routes; we list only addresses.
"""

from __future__ import annotations

import errno as _errno
import ipaddress
import itertools
import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import structlog
# No types or stubs for pyroute2; its parsed messages are converted to our events in this module.
from pyroute2.netlink.rtnl.marshal import MarshalRtnl  # type: ignore[import-untyped]

from felixpy.drivers.netlink.nsutil import call_in_netns
from felixpy.errors import NetlinkError
from felixpy.ifacemonitor.events import AddrEvent, Event, Link, LinkEvent

log = structlog.get_logger(__name__)

NETLINK_ROUTE = 0
SOL_NETLINK = 270
NETLINK_GET_STRICT_CHK = 12
SO_RCVBUFFORCE = 33

RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100

NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_NEWADDR = 20
RTM_DELADDR = 21
RTM_GETADDR = 22
NLM_F_REQUEST = 0x1
NLM_F_DUMP_INTR = 0x10
NLM_F_DUMP = 0x300

IFF_RUNNING = 0x40
IFA_F_OPTIMISTIC = 0x04
IFA_F_DADFAILED = 0x08
IFA_F_TENTATIVE = 0x40

_NLMSGHDR = struct.Struct("=LHHLL")
_IFINFOMSG = struct.Struct("=BxHiII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RECV_SIZE = 256 * 1024
_RTA_U32 = struct.Struct("=HHI")  # an rtattr carrying a u32
IFLA_EXT_MASK = 29
RTEXT_FILTER_SKIP_STATS = 1 << 3
_T = TypeVar("_T")
_DUMP_ATTEMPTS = 5


class SubscribeFailed(NetlinkError):
    """The netlink event subscription could not be opened (the daemon restarts)."""


class EventsLost(NetlinkError):
    """The kernel dropped events (ENOBUFS): only a full resync can tell what changed."""


class DumpFailed(NetlinkError):
    """A link or address dump failed or timed out."""


class NetlinkSource(Protocol):
    """What the monitor needs from netlink; :class:`RtnlSource` is the real one."""

    def fileno(self) -> int: ...

    def read_events(self) -> list[Event]:
        """Events waiting now (never blocks); raises :class:`EventsLost` on overflow."""
        ...

    def list_links(self) -> list[Link]: ...

    def list_addrs(self, index: int | None = None) -> dict[int, frozenset[str]]:
        """Usable local addresses by interface index (one interface's, or all)."""
        ...

    def close(self) -> None: ...


def _open(netns: str | None, groups: int, rcvbuf: int) -> socket.socket:
    def make() -> socket.socket:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)

    sock = call_in_netns(netns, make)
    try:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((0, groups))
    except BaseException:
        sock.close()
        raise
    return sock


def _canon_ip(raw: str) -> str:
    return ipaddress.ip_address(raw).compressed


def _usable(flags: int) -> bool:
    if flags & IFA_F_DADFAILED:
        return False
    return not (flags & IFA_F_TENTATIVE) or bool(flags & IFA_F_OPTIMISTIC)


def _link_from_msg(msg: Any) -> Link | None:
    if msg["family"] != socket.AF_UNSPEC:  # AF_BRIDGE port events are not link lifecycle
        return None
    name = msg.get_attr("IFLA_IFNAME")
    if not name:
        return None
    info = msg.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    return Link(int(msg["index"]), name, bool(int(msg["flags"]) & IFF_RUNNING), str(kind or ""))


# --- the dumps' messages, decoded from their bytes (the attributes the monitor reads, nothing else) ---
IFLA_IFNAME, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 18, 1
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
_RTA = struct.Struct("=HH")
_ERRCODE = struct.Struct("=i")
_U32 = struct.Struct("=I")


def _messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, sequence number, payload) of each netlink message in one receive."""
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        length, mtype, flags, seq, _pid = _NLMSGHDR.unpack_from(data, off)
        if length < _NLMSGHDR.size:
            return
        yield mtype, flags, seq, data[off + _NLMSGHDR.size:off + length]
        off += (length + 3) & ~3


def _attrs(buf: bytes, off: int) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each route attribute from *off* (the nested flag masked off)."""
    while off + _RTA.size <= len(buf):
        length, atype = _RTA.unpack_from(buf, off)
        if length < _RTA.size:
            return
        yield atype & 0x3FFF, buf[off + _RTA.size:off + length]
        off += (length + 3) & ~3


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _link_from_payload(p: bytes) -> Link | None:
    """:func:`_link_from_msg` of an RTM_NEWLINK payload (ifinfomsg + attributes)."""
    family, _type, index, flags, _change = _IFINFOMSG.unpack_from(p)
    if family != socket.AF_UNSPEC:
        return None
    name, kind = "", ""
    for atype, val in _attrs(p, _IFINFOMSG.size):
        if atype == IFLA_IFNAME:
            name = _cstr(val)
        elif atype == IFLA_LINKINFO:
            kind = next((_cstr(v) for t, v in _attrs(val, 0) if t == IFLA_INFO_KIND), "")
    return Link(index, name, bool(flags & IFF_RUNNING), kind) if name else None


def _addr_from_payload(p: bytes) -> tuple[int, str, bool] | None:
    """:func:`_addr_from_msg` of an RTM_NEWADDR payload (ifaddrmsg + attributes)."""
    family, _plen, flags, _scope, index = _IFADDRMSG.unpack_from(p)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    got: dict[int, bytes] = {t: v for t, v in _attrs(p, _IFADDRMSG.size) if t in (IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS)}
    raw = got.get(IFA_LOCAL) or got.get(IFA_ADDRESS)
    if not raw:
        return None
    if IFA_FLAGS in got:
        flags = _U32.unpack_from(got[IFA_FLAGS])[0]
    return index, _canon_ip(socket.inet_ntop(family, raw)), _usable(flags)


def _addr_from_msg(msg: Any) -> tuple[int, str, bool] | None:
    """(index, address, usable) of an ifaddrmsg, or None if it carries no address."""
    if msg["family"] not in (socket.AF_INET, socket.AF_INET6):
        return None
    raw = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
    if not raw:
        return None
    flags = msg.get_attr("IFA_FLAGS")
    if flags is None:
        flags = msg["flags"]
    return int(msg["index"]), _canon_ip(raw), _usable(int(flags))


class RtnlSource:
    def __init__(self, netns: str | None = None, *, rcvbuf: int = 8 * 1024 * 1024,
                 timeout: float = 10.0) -> None:
        self._marshal = MarshalRtnl()
        self._seq = itertools.count(1)
        groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
        try:
            self._sub = _open(netns, groups, rcvbuf)
        except OSError as exc:
            raise SubscribeFailed(f"netlink subscription failed (netns={netns}): {exc}") from exc
        try:
            self._req = _open(netns, 0, rcvbuf)
            # Kernel-side filtering of per-interface address dumps.
            self._req.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            self._req.settimeout(timeout)
        except OSError as exc:
            self._sub.close()
            raise SubscribeFailed(f"netlink request socket failed (netns={netns}): {exc}") from exc
        self._sub.setblocking(False)

    def fileno(self) -> int:
        return self._sub.fileno()

    def close(self) -> None:
        self._sub.close()
        self._req.close()

    # ------------------------------------------------------------------ events
    def read_events(self, max_reads: int = 64) -> list[Event]:
        events: list[Event] = []
        for _ in range(max_reads):
            try:
                data = self._sub.recv(_RECV_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == _errno.ENOBUFS:
                    raise EventsLost("netlink event socket overflowed (ENOBUFS)") from exc
                raise NetlinkError(f"netlink event socket: {exc}") from exc
            for msg in self._marshal.parse(data):
                ev = self._event_from_msg(msg)
                if ev is not None:
                    events.append(ev)
        return events

    @staticmethod
    def _event_from_msg(msg: Any) -> Event | None:
        kind = msg["header"]["type"]
        if kind in (RTM_NEWLINK, RTM_DELLINK):
            link = _link_from_msg(msg)
            return None if link is None else LinkEvent(link, kind == RTM_NEWLINK)
        if kind in (RTM_NEWADDR, RTM_DELADDR):
            got = _addr_from_msg(msg)
            if got is None:
                return None
            index, addr, usable = got
            return AddrEvent(index, addr, kind == RTM_NEWADDR and usable)
        return None

    # ------------------------------------------------------------------- dumps
    def list_links(self) -> list[Link]:
        # Without statistics (IFLA_EXT_MASK: RTEXT_FILTER_SKIP_STATS): the monitor needs name, flags and kind.
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _RTA_U32.pack(8, IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)
        return self._dump(RTM_GETLINK, body, _link_from_payload)

    def list_addrs(self, index: int | None = None) -> dict[int, frozenset[str]]:
        found: dict[int, set[str]] = {}
        for got in self._dump(RTM_GETADDR, _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, index or 0),
                              _addr_from_payload):
            if not got[2] or (index is not None and got[0] != index):
                continue
            found.setdefault(got[0], set()).add(got[1])
        return {i: frozenset(a) for i, a in found.items()}

    def _dump(self, msg_type: int, body: bytes, convert: Callable[[bytes], _T | None]) -> list[_T]:
        """The dump's messages, each converted from its payload as it is read (None: skipped; see
        the module doc for why not through pyroute2)."""
        got: list[_T] = []
        for attempt in range(_DUMP_ATTEMPTS):
            got, interrupted = self._dump_once(msg_type, body, convert)
            if not interrupted:
                return got
            log.debug("netlink dump interrupted by a concurrent change; retrying",
                      msg_type=msg_type, attempt=attempt + 1)
        # Still changing under us: use what we have; events and the next resync correct it.
        log.warning("netlink dump kept being interrupted; using the last attempt", msg_type=msg_type)
        return got

    def _dump_once(self, msg_type: int, body: bytes, convert: Callable[[bytes], _T | None]) -> tuple[list[_T], bool]:
        seq = next(self._seq)
        hdr = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
        msgs: list[_T] = []
        interrupted = False
        try:
            self._req.send(hdr + body)
            while True:
                data = self._req.recv(_RECV_SIZE)
                for mtype, flags, mseq, payload in _messages(data):
                    if mseq != seq:
                        continue
                    if flags & NLM_F_DUMP_INTR:
                        interrupted = True
                    if mtype == NLMSG_DONE:
                        return msgs, interrupted
                    if mtype == NLMSG_ERROR:
                        code = _ERRCODE.unpack_from(payload)[0] if len(payload) >= 4 else 0
                        raise DumpFailed(f"netlink dump {msg_type} failed: {_errno.errorcode.get(-code, code)}")
                    item = convert(payload)
                    if item is not None:
                        msgs.append(item)
        except OSError as exc:  # includes the socket timeout
            raise DumpFailed(f"netlink dump {msg_type} failed: {exc}") from exc
