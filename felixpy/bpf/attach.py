"""Attaching the preambles: clsact/TC filters, TCX links, XDP.  Netkit is reported unsupported.

What it owns: the direct-action BPF filter named ``cali_tc_preambl`` (the kernel's 15-character
cut of ``cali_tc_preamble``) at priority :data:`TC_PRIO` on each hook's clsact, TCX links
(optionally pinned as ``<pin dir>/<iface without dots>_<ingress|egress>``, Felix's naming), and
XDP programs named ``cali_xdp_preamb``.  A restarted process recognises its objects by those
names and pin paths and replaces them atomically (TC ``replace``, ``BPF_LINK_UPDATE``).

The attach mechanism is chosen in exactly one place, :func:`resolve_attach_mode` (Felix's
``ResolveAttachType``/``useNetkitAttach``): ``BPFAttachType`` Netkit (Felix's default) means the
netkit API on netkit workload devices and TCX elsewhere; TCX falls back to TC where the kernel
lacks it.  This kernel has no netkit (``CONFIG_NETKIT`` off), so a netkit device, or an explicit
request to attach with netkit, raises :class:`~felixpy.bpf.errors.UnsupportedAttachType`.

Only the calling thread's network namespace is touched.  The netlink calls take an optional
:class:`RouteSocket`, kept open across calls: a pyroute2 ``IPRoute`` for qdiscs and filters and a
plain netlink socket for the link-kind query (a driver attaching to 1,000 interfaces opened ~5,000
pyroute2 sockets before, and the kind alone cost 9.8 s of a 44.7 s apply); without one, each call
opens and closes its own socket.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import os
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from felixpy.bpf import defs
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError, UnsupportedAttachType

log = structlog.get_logger(__name__)

TC_PRIO = 1
TC_HANDLE = 1
PREAMBLE_NAME = "cali_tc_preambl"
ETH_P_ALL = 3
_PARENT = {defs.HOOK_TC_INGRESS: "ffff:fff2", defs.HOOK_TC_EGRESS: "ffff:fff3"}
_TCX_TYPE = {defs.HOOK_TC_INGRESS: sc.ATTACH_TCX_INGRESS, defs.HOOK_TC_EGRESS: sc.ATTACH_TCX_EGRESS}


def _ipr() -> Any:
    """A pyroute2 IPRoute in the calling thread's namespace (imported lazily: pyroute2 is only
    needed by processes that attach)."""
    from pyroute2 import IPRoute  # type: ignore[import-untyped]

    return IPRoute()


def _netlink_error() -> type[Exception]:
    from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]

    return NetlinkError  # type: ignore[no-any-return]


def _netns_id() -> tuple[int, int]:
    """Identity of the calling thread's network namespace (device and inode of its nsfs file)."""
    st = os.stat("/proc/thread-self/ns/net")
    return st.st_dev, st.st_ino


# rtnetlink constants for the one request made without pyroute2 (the link kind).
_NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_IFINFOMSG = struct.Struct("=BxHiII")  # family, pad, type, index, flags, change
_RTA = struct.Struct("=HH")  # len, type
_NLMSG_ERROR, _RTM_NEWLINK, _RTM_GETLINK = 2, 16, 18
_NLM_F_REQUEST = 1
_IFLA_IFNAME, _IFLA_LINKINFO, _IFLA_EXT_MASK, _IFLA_INFO_KIND = 3, 18, 29, 1
_RTEXT_FILTER_SKIP_STATS = 1 << 3
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER


def _rta(kind: int, payload: bytes) -> bytes:
    raw = _RTA.pack(_RTA.size + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _attrs(buf: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each netlink attribute in *buf* (a truncated tail is ignored)."""
    off = 0
    while off + _RTA.size <= len(buf):
        length, kind = _RTA.unpack_from(buf, off)
        if length < _RTA.size or off + length > len(buf):
            return
        yield kind & _NLA_TYPE_MASK, buf[off + _RTA.size:off + length]
        off += (length + 3) & ~3


def getlink_request(seq: int, ifname: str) -> bytes:
    """An RTM_GETLINK for one interface by name, stats skipped (the reply is then ~1 KiB)."""
    body = (_IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _rta(_IFLA_IFNAME, ifname.encode() + b"\0")
            + _rta(_IFLA_EXT_MASK, struct.pack("=I", _RTEXT_FILTER_SKIP_STATS)))
    return _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), _RTM_GETLINK, _NLM_F_REQUEST, seq, 0) + body


def parse_getlink_reply(buf: bytes, seq: int) -> tuple[bool, str | None]:
    """(answered, kind) from one recv of replies: answered is False when no message of *buf* answers
    request *seq* (a late reply to an earlier one).  ENODEV answers "no kind"; any other error
    reply raises :class:`LinkQueryError` with its errno."""
    off = 0
    while off + _NLMSG_HDR.size <= len(buf):
        length, mtype, _flags, mseq, _pid = _NLMSG_HDR.unpack_from(buf, off)
        if length < _NLMSG_HDR.size:
            raise ValueError(f"netlink message of length {length}")
        msg = buf[off + _NLMSG_HDR.size:off + length]
        off += (length + 3) & ~3
        if mseq != seq:
            continue
        if mtype == _NLMSG_ERROR:
            err = -struct.unpack_from("=i", msg)[0]
            if err in (0, errno.ENODEV):
                return True, None
            raise LinkQueryError(err, f"RTM_GETLINK: {os.strerror(err)}")
        if mtype == _RTM_NEWLINK:
            for kind, payload in _attrs(msg[_IFINFOMSG.size:]):
                if kind == _IFLA_LINKINFO:
                    for sub, value in _attrs(payload):
                        if sub == _IFLA_INFO_KIND:
                            return True, value.split(b"\0", 1)[0].decode() or None
            return True, None
    return False, None


class LinkQueryError(OSError):
    """The kernel answered the link query with an error (other than ENODEV)."""


def _raw_route_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    sock.settimeout(5.0)
    sock.bind((0, 0))
    return sock


class RouteSocket:
    """The rtnetlink sockets reused by every call that is given this object: a pyroute2 ``IPRoute``
    (:meth:`use`: clsact and filters) and a plain ``AF_NETLINK`` socket (:meth:`link_kind`), each
    opened on first use.

    A netlink socket belongs to the namespace it was opened in, so the calling thread's namespace
    is checked on each use and a socket of another namespace is replaced (a test or bench that
    moves a thread between namespaces gets the right one).  A kernel error reply
    (``NetlinkError``, :class:`LinkQueryError`: ENODEV, EEXIST, ...) leaves the socket in step and
    it is kept; any other exception while it is in use (a socket error or timeout, a reply that
    could not be decoded, an interrupt mid-dump) may leave unread replies behind, so that socket is
    closed and the next use opens a fresh one.  Not thread-safe: one owner (the BPF endpoint driver's apply) uses it at a time.
    """

    def __init__(self, opener: Callable[[], Any] = _ipr,
                 netns_id: Callable[[], tuple[int, int]] = _netns_id,
                 raw_opener: Callable[[], socket.socket] = _raw_route_socket) -> None:
        self._opener = opener
        self._raw_opener = raw_opener
        self._netns_id = netns_id
        self._ipr: Any = None
        self._raw: socket.socket | None = None
        self._ns: tuple[int, int] | None = None
        self._seq = 0
        self.opened = 0  # sockets opened so far (tests and benches read it)

    def _same_netns(self) -> None:
        ns = self._netns_id()
        if self._ns != ns:
            self.close()
            self._ns = ns

    @contextlib.contextmanager
    def use(self) -> Iterator[Any]:
        """The pyroute2 ``IPRoute`` (TC qdiscs and filters)."""
        self._same_netns()
        if self._ipr is None:
            self._ipr = self._opener()
            self.opened += 1
        try:
            yield self._ipr
        except _netlink_error():
            raise
        except BaseException:
            self._close_ipr()
            raise

    def link_kind(self, ifname: str) -> str | None:
        """IFLA_INFO_KIND of *ifname* (None: no kind, or no such interface).

        One RTM_GETLINK on a plain netlink socket, only the kind decoded: pyroute2 decoded every
        attribute of the reply, ~1.3 ms an interface even over one socket."""
        self._same_netns()
        if self._raw is None:
            self._raw = self._raw_opener()
            self.opened += 1
        self._seq = self._seq % 0x7FFFFFFF + 1
        try:
            self._raw.send(getlink_request(self._seq, ifname))
            while True:
                answered, kind = parse_getlink_reply(self._raw.recv(65536), self._seq)
                if answered:
                    return kind
        except LinkQueryError:
            raise  # the kernel's answer: the socket is in step
        except BaseException:
            self._close_raw()  # no answer, or one not understood: start the next query afresh
            raise

    def _close_ipr(self) -> None:
        ipr, self._ipr = self._ipr, None
        if ipr is not None:
            with contextlib.suppress(Exception):
                ipr.close()

    def _close_raw(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            raw.close()

    def close(self) -> None:
        self._close_ipr()
        self._close_raw()
        self._ns = None


@contextlib.contextmanager
def _route(nl: RouteSocket | None) -> Iterator[Any]:
    """*nl*'s socket, or (no *nl*) a socket of this call alone."""
    if nl is not None:
        with nl.use() as ipr:
            yield ipr
    else:
        with _ipr() as ipr:
            yield ipr


class AttachMode(enum.Enum):
    TC = "tc"
    TCX = "tcx"
    NETKIT = "netkit"


def iface_kind(ifname: str, *, nl: RouteSocket | None = None) -> str | None:
    """IFLA_INFO_KIND of an interface in the caller's namespace ("veth", "netkit", ...); None when
    it has none or no longer exists (an interface monitor's view may lag its deletion)."""
    if nl is not None:
        return nl.link_kind(ifname)
    with contextlib.closing(RouteSocket()) as own:
        return own.link_kind(ifname)


@functools.cache
def netkit_supported() -> bool:
    """The running kernel's netkit support.  felixpy has no netkit attach path yet, and this
    kernel is built without CONFIG_NETKIT, so this is a fixed answer rather than a probe."""
    return False


@functools.cache
def tcx_supported() -> bool:
    """Probe: a TCX program query on loopback succeeds on kernels with TCX (6.6+)."""
    try:
        sc.prog_query(1, sc.ATTACH_TCX_INGRESS, max_ids=0)
    except BPFSyscallError as e:
        return e.errno not in (errno.EINVAL, errno.EOPNOTSUPP)
    return True


def resolve_attach_mode(requested: str, kind: str | None) -> AttachMode:
    """Choose the mechanism for one interface.  ``requested`` is BPFAttachType
    ("Netkit"/"TCX"/"TC", case-insensitive); ``kind`` the device's link kind."""
    req = requested.lower()
    if req not in ("netkit", "tcx", "tc"):
        raise ValueError(f"unknown BPFAttachType {requested!r}")
    if kind == "netkit":
        if not netkit_supported():
            raise UnsupportedAttachType(
                "netkit devices are not supported: this kernel lacks netkit (CONFIG_NETKIT) "
                "and felixpy has no netkit attach path")
        return AttachMode.NETKIT
    if req == "tc":
        return AttachMode.TC
    # "netkit" means netkit only for netkit devices; TCX for everything else.
    return AttachMode.TCX if tcx_supported() else AttachMode.TC


def attach(mode: AttachMode, ifindex: int, hook: int, prog_fd: int, *,
           link_pin: str | None = None, nl: RouteSocket | None = None) -> int | None:
    """Attach ``prog_fd`` with ``mode``; returns the TCX link fd (None for TC)."""
    if mode is AttachMode.TC:
        attach_tc(ifindex, hook, prog_fd, nl=nl)
        return None
    if mode is AttachMode.TCX:
        return attach_tcx(ifindex, hook, prog_fd, pin_path=link_pin)
    raise UnsupportedAttachType("netkit attach is not supported on this kernel")


# ---------------------------------------------------------------------------------------------
# clsact / TC


def ensure_clsact(ifindex: int, *, nl: RouteSocket | None = None) -> None:
    NetlinkError = _netlink_error()

    with _route(nl) as ipr:
        try:
            ipr.tc("add", "clsact", ifindex)
        except NetlinkError as e:
            if getattr(e, "code", None) != errno.EEXIST:
                raise


def attach_tc(ifindex: int, hook: int, prog_fd: int, *, prio: int = TC_PRIO,
              nl: RouteSocket | None = None) -> None:
    """Attach (or atomically replace) the preamble filter on a clsact hook."""

    ensure_clsact(ifindex, nl=nl)
    replace_tc_filter(ifindex, hook, prog_fd, prio=prio, nl=nl)


def replace_tc_filter(ifindex: int, hook: int, prog_fd: int, *, prio: int = TC_PRIO,
                      nl: RouteSocket | None = None) -> None:
    """The filter half of :func:`attach_tc`: the clsact qdisc must be there (NetlinkError if not)."""
    with _route(nl) as ipr:
        ipr.tc("replace-filter", "bpf", ifindex, f":{TC_HANDLE}", fd=prog_fd, name=PREAMBLE_NAME,
               parent=_PARENT[hook], classid=1, direct_action=True, prio=prio,
               protocol=ETH_P_ALL)


def tc_filters(ifindex: int, hook: int, *, nl: RouteSocket | None = None) -> list[str]:
    """Names of the BPF filters on a clsact hook (only entries that carry options)."""

    out = []
    with _route(nl) as ipr:
        try:
            msgs = ipr.get_filters(index=ifindex, parent=int(_PARENT[hook].replace(":", ""), 16))
        except Exception as e:  # no clsact, no interface, ...: nothing of ours there
            if nl is not None and not isinstance(e, _netlink_error()):
                nl.close()  # the dump may not have been read to its end
            return []
        for m in msgs:
            opts = m.get_attr("TCA_OPTIONS")
            if opts is not None:
                name = opts.get_attr("TCA_BPF_NAME")
                if name:
                    out.append(str(name))
    return out


def detach_tc(ifindex: int, *, nl: RouteSocket | None = None) -> None:
    """Remove the clsact qdisc (and so every filter on it).  Absent: not an error."""
    NetlinkError = _netlink_error()

    with _route(nl) as ipr, contextlib.suppress(NetlinkError):
        ipr.tc("del", "clsact", ifindex)


# ---------------------------------------------------------------------------------------------
# TCX


def tcx_pin_path(pin_dir: str, ifname: str, hook: int) -> str:
    return os.path.join(pin_dir, f"{ifname.replace('.', '')}_"
                        f"{'ingress' if hook == defs.HOOK_TC_INGRESS else 'egress'}")


def attach_tcx(ifindex: int, hook: int, prog_fd: int, *, pin_path: str | None = None) -> int:
    """Attach through a TCX link; with ``pin_path`` an existing pinned link is updated in place
    (atomic).  Returns the link fd (the caller owns it)."""
    if pin_path and os.path.exists(pin_path):
        link = sc.obj_get(pin_path)
        try:
            sc.link_update(link, prog_fd)
            return link
        except BPFSyscallError as e:
            os.close(link)
            if e.errno != errno.ENOLINK:
                raise
            os.unlink(pin_path)  # the link was detached under us: make a new one
    link = sc.link_create(prog_fd, ifindex, _TCX_TYPE[hook])
    if pin_path:
        Path(pin_path).parent.mkdir(parents=True, exist_ok=True)
        sc.obj_pin(link, pin_path)
    return link


def detach_tcx(link_fd: int | None = None, *, pin_path: str | None = None) -> None:
    """Detach explicitly (closing the last reference is not relied on), then unlink the pin."""
    fd = link_fd
    if fd is None and pin_path and os.path.exists(pin_path):
        fd = sc.obj_get(pin_path)
    if fd is not None:
        with contextlib.suppress(BPFSyscallError):
            sc.link_detach(fd)
        if link_fd is None:
            os.close(fd)
    if pin_path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pin_path)


def tcx_programs(ifindex: int, hook: int) -> list[int]:
    return sc.prog_query_tcx(ifindex, _TCX_TYPE[hook])


def ifindex_of(ifname: str) -> int:
    return socket.if_nametoindex(ifname)
