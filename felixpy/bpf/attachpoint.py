"""Per-attach-point configuration: the globals the preamble reads, and log-path selection.

An :class:`AttachPoint` is one (interface, kernel hook).  :func:`configure` loads the variants
it needs (cached), builds the v4 and v6 halves of its globals (jump layout + the interface's
policy entry slot + addresses and flags) and writes them to ``cali_ap_glob[(ifindex, hook)]``
(TC) or ``xdp_cali_glob[ifindex]`` (XDP), and makes sure the interface's counters entry exists.
It must run before the preamble is attached: a preamble that finds no globals drops (TC).

Log paths follow Felix's ``BPFLogLevel`` rules (:func:`log_path`): below debug only the fast
objects are loaded; at debug both are, and a log filter is installed -- a match-all filter when
no ``BPFLogFilters`` are configured, the configured expression otherwise; an interface no filter
applies to runs the fast path.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Mapping
from dataclasses import dataclass

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.build import EpType
from felixpy.bpf.hook import Layout, ProgramsMap
from felixpy.bpf.maps import MapSet, ensure_counters


@dataclass(frozen=True, slots=True)
class LogPath:
    debug: bool  # load the debug objects too
    filter_expr: str | None  # None: no filter (fast path only); "": match everything


def log_path(log_level: str, filters: Mapping[str, str], iface: str, *, is_wep: bool) -> LogPath:
    """Felix's apLogFilter: which path(s) an interface runs for a BPFLogLevel/BPFLogFilters."""
    if log_level.lower() != "debug":  # "info" is treated as off
        return LogPath(False, None)
    if not filters:
        return LogPath(True, "")
    for key in (iface, "weps" if is_wep else "heps", "all"):
        if key in filters:
            return LogPath(True, filters[key])
    return LogPath(False, None)


@dataclass(slots=True)  # the endpoint driver keeps the last one written per interface and hook
class AttachPoint:
    iface: str
    ifindex: int
    hook: int  # defs.HOOK_TC_INGRESS / HOOK_TC_EGRESS / HOOK_XDP
    ep: EpType = EpType.WEP
    ipv4: bool = True
    ipv6: bool = False
    debug: bool = False
    policy_idx_v4: int = -1  # entry slot in the hook's policy map
    policy_idx_v6: int = -1
    log_filter_idx: int = -1  # slot of the log filter in the policy map, -1 = none
    host_ip_v4: str | None = None
    host_ip_v6: str | None = None
    intf_ip_v4: str | None = None
    intf_ip_v6: str | None = None
    flags: int = 0  # enum cali_globals_flags
    vxlan_port: int = 4789
    tunnel_mtu: int = 1410
    dscp: int = -1  # egress DSCP the programs set (on a workload's from-WEP or a HEP's to-HEP hook), -1 = none


def _fill_ip(dst: ctypes.Array[ctypes.c_uint8], ip: str | None, v6: bool) -> None:
    if ip:
        raw = mt.addr_bytes(ip, v6)
        ctypes.memmove(dst, raw, len(raw))


def tc_global_data(ap: AttachPoint, layout: Layout | None, v6: bool) -> mt.TcGlobalData:
    g = mt.empty_tc_globals()
    if layout is None:
        return g  # family not loaded: jumps[MAIN] stays unused
    for idx, slot in layout.slots:
        g.jumps[idx] = slot
    pol = ap.policy_idx_v6 if v6 else ap.policy_idx_v4
    if pol >= 0:
        g.jumps[defs.ProgIndex.POLICY] = pol
    g.log_filter_jmp = ap.log_filter_idx if ap.log_filter_idx >= 0 else defs.JUMP_UNUSED
    _fill_ip(g.host_ip, ap.host_ip_v6 if v6 else ap.host_ip_v4, v6)
    _fill_ip(g.intf_ip, (ap.intf_ip_v6 if v6 else ap.intf_ip_v4) or
             (ap.host_ip_v6 if v6 else ap.host_ip_v4), v6)
    g.flags = ap.flags
    g.vxlan_port = ap.vxlan_port
    g.tunnel_mtu = ap.tunnel_mtu
    g.dscp = ap.dscp
    g.iface_name = ap.iface.encode()[:15].ljust(15, b"-")
    return g


def xdp_global_data(ap: AttachPoint, layout: Layout | None, v6: bool) -> mt.XdpGlobals:
    g = mt.empty_xdp_globals()
    g.iface_name = ap.iface.encode()[:15]
    if layout is None:
        return g
    for idx, slot in layout.slots:
        if idx < 16:
            g.jumps[idx] = slot
    pol = ap.policy_idx_v6 if v6 else ap.policy_idx_v4
    if pol >= 0:
        g.jumps[defs.ProgIndex.POLICY] = pol
    return g


def configure(ap: AttachPoint, programs: ProgramsMap, maps: MapSet, *, counters: bool = True) -> dict[bool, Layout]:
    """Load what ``ap`` needs and write its globals and (unless the caller has: *counters* False)
    its counters entry.  Returns the layout per family (key: v6)."""
    layouts: dict[bool, Layout] = {}
    for v6, on in ((False, ap.ipv4), (True, ap.ipv6)):
        if not on:
            continue
        if ap.hook == defs.HOOK_XDP:
            layouts[v6] = programs.xdp_layout(v6, ap.debug)
        else:
            layouts[v6] = programs.tc_layout(ap.hook, ap.ep, v6, ap.debug)
    if ap.hook == defs.HOOK_XDP:
        xg = mt.XdpPreambleGlobals()
        xg.v4 = xdp_global_data(ap, layouts.get(False), False)
        xg.v6 = xdp_global_data(ap, layouts.get(True), True)
        maps.xdp_globals.set(ctypes.c_uint32(ap.ifindex), xg)
    else:
        pg = mt.TcPreambleGlobals()
        pg.v4 = tc_global_data(ap, layouts.get(False), False)
        pg.v6 = tc_global_data(ap, layouts.get(True), True)
        maps.ap_globals.set(mt.ApKey(ap.ifindex, ap.hook), pg)
    if counters:
        ensure_counters(maps.counters, ap.ifindex, ap.hook)
    return layouts


def unconfigure(ap: AttachPoint, maps: MapSet) -> None:
    """Remove the globals entry (do this only after detaching the preamble)."""
    with contextlib.suppress(Exception):
        if ap.hook == defs.HOOK_XDP:
            maps.xdp_globals.delete(ctypes.c_uint32(ap.ifindex))
        else:
            maps.ap_globals.delete(mt.ApKey(ap.ifindex, ap.hook))
