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
:class:`RouteSocket`: one pyroute2 ``IPRoute`` kept open across calls, for the link-kind query,
qdiscs and filter dumps (a driver attaching to 1,000 interfaces opened ~5,000 sockets before, and the
kind alone cost 9.8 s of a 44.7 s apply); without one, each call opens and closes its own socket.
The bulk TC attach does not use it: it hands ``tc -force -batch`` the lines :func:`clsact_line`
and :func:`filter_line` spell (the preamble taken from its pin, :func:`preamble_pin_path`), so its
filters are named ``cali_tc_preambl:[*fsobj]`` -- :func:`is_preamble_filter` recognises that, the
bare name :func:`replace_tc_filter` sets and libbpf's ``cali_tc_preambl:[<id>]`` (Felix's).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import os
import re
import socket
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
    from pyroute2.iproute.linux import IPRoute  # type: ignore[import-untyped]

    return IPRoute()


def _netlink_error() -> type[Exception]:
    from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]

    return NetlinkError  # type: ignore[no-any-return]


def _link_get(ipr: Any, **key: Any) -> list[Any]:
    """``RTM_GETLINK`` of one interface (by ``index`` or ``ifname``); [] when it does not exist."""
    try:
        return list(ipr.link("get", **key))
    except _netlink_error() as e:
        if getattr(e, "code", None) == errno.ENODEV:
            return []
        raise


def _netns_id() -> tuple[int, int]:
    """Identity of the calling thread's network namespace (device and inode of its nsfs file)."""
    st = os.stat("/proc/thread-self/ns/net")
    return st.st_dev, st.st_ino


class RouteSocket:
    """One rtnetlink socket (a pyroute2 ``IPRoute``) reused by every call that is given it.

    A netlink socket belongs to the namespace it was opened in, so the calling thread's namespace
    is checked on each use and a socket of another namespace is replaced (a test or bench that
    moves a thread between namespaces gets the right one).  A kernel error reply
    (``NetlinkError``: ENODEV, EEXIST, ...) leaves the socket in step and it is kept; any other
    exception while it is in use (a socket error, a reply that could not be decoded, an interrupt
    mid-dump) may leave unread replies behind, so the socket is closed and the next use opens a
    fresh one.  Not thread-safe: one owner (the BPF endpoint driver's apply) uses it at a time.
    """

    def __init__(self, opener: Callable[[], Any] = _ipr,
                 netns_id: Callable[[], tuple[int, int]] = _netns_id) -> None:
        self._opener = opener
        self._netns_id = netns_id
        self._ipr: Any = None
        self._ns: tuple[int, int] | None = None
        self.opened = 0  # sockets opened so far (tests and benches read it)

    def _same_netns(self) -> None:
        ns = self._netns_id()
        if self._ns != ns:
            self.close()
            self._ns = ns

    @contextlib.contextmanager
    def use(self) -> Iterator[Any]:
        """The pyroute2 ``IPRoute`` (links, TC qdiscs and filters)."""
        self._same_netns()
        if self._ipr is None:
            self._ipr = self._opener()
            self.opened += 1
        try:
            yield self._ipr
        except _netlink_error():
            raise
        except BaseException:
            self.close_socket()
            raise

    def link_kind(self, ifname: str) -> str | None:
        """IFLA_INFO_KIND of *ifname* (None: no kind, or no such interface).  pyroute2 decodes the
        whole link (~1.3 ms); callers ask once per interface (the attacher caches the mode)."""
        with self.use() as ipr:
            links = _link_get(ipr, ifname=ifname)
        for link in links:
            info = link.get_attr("IFLA_LINKINFO")
            if info is not None:
                kind = info.get_attr("IFLA_INFO_KIND")
                return str(kind) if kind else None
        return None

    def close_socket(self) -> None:
        ipr, self._ipr = self._ipr, None
        if ipr is not None:
            with contextlib.suppress(Exception):
                ipr.close()

    def close(self) -> None:
        self.close_socket()
        self._ns = None


# ---------------------------------------------------------------------------------------------
# clsact / TC as ``tc -batch`` lines (the bulk path, :meth:`KernelAttacher.attach_many
# <felixpy.drivers.bpfendpoints.attacher.KernelAttacher.attach_many>`)

PREAMBLE_PIN_DIR = "felixpy-preamble"  # under the pin root: <dir>/<ingress|egress>/cali_tc_preambl
HOOK_NAMES = {defs.HOOK_TC_INGRESS: "ingress", defs.HOOK_TC_EGRESS: "egress"}
_SAFE_PATH = re.compile(r"\A[A-Za-z0-9_./@+=-]+\Z")


def preamble_pin_path(pin_dir: str, hook: int) -> str:
    """Where the hook's preamble is pinned for ``tc ... bpf da pinned``.  The file is named
    :data:`PREAMBLE_NAME` because ``tc`` names the filter ``<file name>:[*fsobj]``."""
    return os.path.join(pin_dir, HOOK_NAMES[hook], PREAMBLE_NAME)


def filter_prog_name(filter_name: str) -> str:
    """The program part of a BPF filter's name: ``tc`` names a filter of a pinned program
    ``<pin file>:[*fsobj]`` and libbpf (Felix) ``<program>:[<id>]``; pyroute2 sets the bare name."""
    return filter_name.partition(":[")[0]


def is_preamble_filter(filter_name: str) -> bool:
    """Whether a clsact filter name is our preamble's, in any of the spellings above."""
    return filter_prog_name(filter_name) == PREAMBLE_NAME


def clsact_line(dev: str) -> str:
    """Make sure *dev* has a clsact qdisc: ``replace`` leaves an existing one (and its filters)
    as it is, so the line can go before every interface's filters."""
    return f"qdisc replace dev {dev} clsact"


def filter_line(dev: str, hook: int, pin: str, *, prio: int = TC_PRIO) -> str:
    """The preamble filter :func:`replace_tc_filter` makes, as a ``tc -batch`` line: the same
    priority, handle, protocol, class id and direct action, the program taken from its pin."""
    if not _SAFE_PATH.match(pin):
        raise ValueError(f"pin path {pin!r} cannot be passed to tc -batch")
    return (f"filter replace dev {dev} {HOOK_NAMES[hook]} prio {prio} handle {TC_HANDLE:#x} protocol all "
            f"bpf da pinned {pin} classid :1")


def parse_qdisc_dump(text: str) -> set[str]:
    """``tc -j qdisc show`` -> the devices with a clsact (or ``ingress``) qdisc: the only ones
    whose TC hooks can carry a filter at all."""
    import json

    data = json.loads(text.strip() or "[]")
    if not isinstance(data, list):
        raise ValueError("expected a JSON list")
    return {str(q["dev"]) for q in data if isinstance(q, dict) and q.get("kind") in ("clsact", "ingress")
            and q.get("dev")}


def _filter_args(hook: int, prog_fd: int, prio: int) -> tuple[tuple[str, Any], ...]:
    return (("handle", f":{TC_HANDLE}"), ("fd", prog_fd), ("name", PREAMBLE_NAME), ("parent", _PARENT[hook]),
            ("classid", 1), ("direct_action", True), ("prio", prio), ("protocol", ETH_P_ALL))


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
        ipr.tc("replace-filter", "bpf", ifindex, **dict(_filter_args(hook, prog_fd, prio)))


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


# ---------------------------------------------------------------------------------------------
# XDP (netlink IFLA_XDP, as Felix's libbpf ``bpf_xdp_attach``: no link, no pin)

XDP_PREAMBLE_NAME = "cali_xdp_preamb"  # the kernel's 15-character cut of cali_xdp_preamble
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
XDP_FLAGS_HW_MODE = 1 << 3
XDP_FLAGS_REPLACE = 1 << 4
# Felix's order in BPF mode (bpf_ep_mgr.go: offload, driver, generic -- generic is always allowed there,
# because untracked ingress policy has no other implementation in BPF mode).  Offload needs a program
# loaded for the device, which ours never is, so it is not tried.
XDP_MODES = (XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE)
_XDP_ATTACHED_FLAGS = {"xdp": XDP_FLAGS_DRV_MODE, "xdpgeneric": XDP_FLAGS_SKB_MODE, "xdpoffload": XDP_FLAGS_HW_MODE}
XDP_MODE_NAMES = {XDP_FLAGS_DRV_MODE: "driver", XDP_FLAGS_SKB_MODE: "generic", XDP_FLAGS_HW_MODE: "offload"}


def xdp_attached(ifindex: int, *, nl: RouteSocket | None = None) -> tuple[int, int] | None:
    """(program id, mode flag) of the XDP program on *ifindex*, or None when it has none (or the
    interface is gone).  A multi-program attachment reports no single id and is returned as (0, 0)."""
    with _route(nl) as ipr:
        links = _link_get(ipr, index=ifindex)
    for link in links:
        xdp = link.get_attr("IFLA_XDP")
        if xdp is None:
            return None
        mode = xdp.get_attr("IFLA_XDP_ATTACHED")
        if not mode:
            return None
        return int(xdp.get_attr("IFLA_XDP_PROG_ID") or 0), _XDP_ATTACHED_FLAGS.get(str(mode), 0)
    return None


def attach_xdp(ifindex: int, prog_fd: int, *, nl: RouteSocket | None = None,
               modes: tuple[int, ...] = XDP_MODES) -> int:
    """Attach *prog_fd* to *ifindex*'s XDP hook; returns the mode flag it runs in.

    An XDP program already there is replaced atomically in its own mode (``XDP_FLAGS_REPLACE`` with
    the expected program, so a concurrent change is refused rather than overwritten); otherwise each
    of *modes* is tried in turn.  The caller decides whether the program there may be replaced."""
    NetlinkError = _netlink_error()
    have = xdp_attached(ifindex, nl=nl)
    if have is not None and have[0] and have[1]:
        old = sc.prog_get_fd_by_id(have[0])
        try:
            with _route(nl) as ipr:
                ipr.link("set", index=ifindex, xdp={"attrs": [
                    ("IFLA_XDP_FD", prog_fd), ("IFLA_XDP_FLAGS", have[1] | XDP_FLAGS_REPLACE),
                    ("IFLA_XDP_EXPECTED_FD", old)]})
        finally:
            os.close(old)
        return have[1]
    errors: list[str] = []
    for mode in modes:
        try:
            with _route(nl) as ipr:
                ipr.link("set", index=ifindex, xdp={"attrs": [("IFLA_XDP_FD", prog_fd), ("IFLA_XDP_FLAGS", mode)]})
            return mode
        except NetlinkError as e:
            errors.append(f"{XDP_MODE_NAMES.get(mode, mode)}: {e}")
    raise OSError(errno.EOPNOTSUPP, f"XDP attach refused in every mode ({'; '.join(errors)})")


def detach_xdp(ifindex: int, *, nl: RouteSocket | None = None) -> None:
    """Remove the XDP program from *ifindex* (in the mode it runs in).  Absent: not an error."""
    NetlinkError = _netlink_error()
    have = xdp_attached(ifindex, nl=nl)
    if have is None:
        return
    with _route(nl) as ipr:
        try:
            ipr.link("set", index=ifindex, xdp={"attrs": [("IFLA_XDP_FD", -1), ("IFLA_XDP_FLAGS", have[1])]})
        except NetlinkError as e:
            if getattr(e, "code", None) != errno.ENODEV:  # the interface went: so did its program
                raise
