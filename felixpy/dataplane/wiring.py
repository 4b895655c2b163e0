"""Building a dataplane for a config: which managers and drivers, per IP family and mode.

This is the one construction site (Felix's ``NewIntDataplaneDriver``): every
per-family manager and driver is created in :func:`build` — the IPv6 set when
``Ipv6Support`` is on — and registered with the loop in Felix's order
(IP sets, host IPs, policy, endpoints, masquerade, DSCP, then routing; v4 then
v6).  Cross-cutting components (the endpoint-status combiner) are registered
with *every* family here.  :func:`build` returns a :class:`BuiltDataplane`, a
typed record of what it made per family, so tests drive and inspect the very
graph the daemon runs (the daemon only needs :func:`build_dataplane`).

Kernel access is injected through :class:`KernelDeps`, a set of factories
(tables + IP-set dataplane per family, netlink handles, the main route table,
the ``/proc/sys`` writer); each default is the real thing in this process's
network namespace, and the test harness passes stateful fakes.

Per family, besides the managers, :func:`build` makes the drivers the loop
applies: the tables (four ``IptablesTable`` or one ``NftablesTable`` root with
four layer views), the IP-set dataplane (ipset, or the nft root), the
tunnel-device syncer (it owns ``vxlan.calico``/``vxlan-v6.calico``, ``tunl0``
and the WireGuard device: it keeps those whose feature is on and removes the
others at start of day), the interface-sysctls syncer, the main route table
(a :class:`~felixpy.drivers.routetable.DummyTable` with ``RouteSyncDisabled``)
and the VXLAN FDB.  A device (re)created by the tunnel syncer is announced to
the route tables and FDB that use it.

Routing (:func:`_build_routing`): the main route table is shared by the endpoint
manager and the VXLAN / no-encap / IPIP managers (the loop applies it once);
VXLAN per family that has it on, IPIP (v4) and WireGuard when configured (this
kernel lacks both: they report ``UnsupportedFeature`` once and the rest keeps
running), and no-encap when ``ProgramClusterRoutes`` asks for it and no
overlay is on for that family (Felix's conditions).

Encapsulation signal: Felix derives ``VXLANEnabled``/``VXLANEnabledV6`` from the
IP pools (``config.Encapsulation``) and also sends them to the dataplane in an
``Encapsulation`` message, which arrives after the ``ConfigUpdate`` we build
from.  felixpy reads the ``VXLANEnabled`` parameter (Felix's override, carried
in ``ConfigUpdate``): VXLAN for IPv4 when it is true, and for IPv6 when it is
true *and* ``Ipv6Support`` is on (:func:`vxlan_enabled`).  IPIP is
``IpInIpEnabled`` (IPv4 only); WireGuard ``WireguardEnabled[V6]``.  The same
decision feeds :func:`renderer_options`, so the static chains reference
``all-vxlan-net`` exactly when a manager creates it.

Start-of-day chains are handed to the tables here; tables only record them,
so nothing reaches the kernel before the first apply after ``InSync``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import structlog
from google.protobuf.message import Message

from felixpy.config import Config
from felixpy.dataplane.clock import Clock
from felixpy.dataplane.core import ApplyMetrics, InternalDataplane
from felixpy.drivers.cmdshim import CommandRunner, SubprocessRunner
from felixpy.drivers.generictables.table import MapsDataplane, Table
from felixpy.drivers.hostmtu import HostMTU, mtu_file_path
from felixpy.drivers.ipsets_api import IPSetsDataplane
from felixpy.drivers.ipsets_filter import FilteredIPSets
from felixpy.drivers.netlink.api import NetlinkFactory
from felixpy.drivers.nftables.shim import NftShim
from felixpy.drivers.procsys import InterfaceSysctls, ProcSys, SysctlWriter
from felixpy.drivers.routetable import DummyTable, RouteTableAPI
from felixpy.drivers.tunnels import KIND_IPIP, KIND_VXLAN, KIND_WIREGUARD, TunnelDevices, owned_devices
from felixpy.drivers.vxlanfdb import VXLANFDB
from felixpy.errors import ConfigError, UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceState
from felixpy.kernelnames import IPIP_DEVICE, MAIN_ROUTE_TABLE, vxlan_device_name
from felixpy.managers.base import EndpointStatus, Manager, NamedSyncer
from felixpy.managers.dscp import DSCPManager
from felixpy.managers.endpoints import EndpointManager
from felixpy.managers.floatingips import FloatingIPManager
from felixpy.managers.groupchains import PolicyGroupChains
from felixpy.managers.hostendpoints import HostEndpointManager
from felixpy.managers.hostips import HostIPManager
from felixpy.managers.ipsets import IPSetsManager
from felixpy.managers.masq import MasqManager
from felixpy.managers.policy import PolicyManager, RawEgressPolicyManager
from felixpy.managers.serviceloop import ServiceLoopManager
from felixpy.managers.status import EndpointStatusCombiner
from felixpy.rules import RendererOptions, RuleRenderer
from felixpy.rules.static import KernelHook

if TYPE_CHECKING:
    from felixpy.drivers.bpfendpoints import BPFEndpoints, BPFKernel
    from felixpy.drivers.bpfconntrack.scanner import ConntrackScanner
    from felixpy.drivers.bpfendpoints.ipsets import BPFIPSetsDataplane
    from felixpy.drivers.bpffailsafe.driver import BPFFailsafes
    from felixpy.drivers.bpfroutes.driver import BPFRoutes
    from felixpy.managers.bpf_endpoints import BPFEndpointManager
    from felixpy.managers.bpf_maps import BPFRouteManager

log = structlog.get_logger(__name__)

TABLE_NAMES = ("raw", "mangle", "filter", "nat")


class FeedSummaryManager:
    """Counts what the feed delivered and logs a summary per apply (observability only)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._since_apply: Counter[str] = Counter()

    def on_update(self, msg: object) -> None:
        name = type(msg).__name__
        self.counts[name] += 1
        self._since_apply[name] += 1

    def complete_deferred_work(self) -> None:
        if self._since_apply:
            log.info("Batch received", **{k: v for k, v in sorted(self._since_apply.items())})
            self._since_apply.clear()


@dataclass(frozen=True)
class FamilyTables:
    """One family's tables as the rules layer sees them, and what the loop applies."""

    tables: Mapping[str, Table]  # raw, mangle, filter, nat
    ipsets: IPSetsDataplane
    maps: MapsDataplane | None  # nftables verdict maps (None with iptables)
    to_apply: list[Table]  # the four iptables tables, or the one nftables root
    backend: str  # "legacy" | "nft" | "nftables"


TablesFactory = Callable[[Config, int], FamilyTables]
# The cleanup-only drivers for the backends a family is not using, given the active one.
CleanupFactory = Callable[[Config, int, str], list[NamedSyncer]]
RouteTableFactory = Callable[[Config, int], RouteTableAPI]


@dataclass
class KernelDeps:
    """How drivers reach the kernel.  Every default is the real thing in this process's netns.

    ``tables`` builds one family's tables and IP-set dataplane (default: by mode —
    iptables over ``iptables_runner``/``ipset_runner`` with ``iptables_backend`` or
    detection, or nftables over ``nft_shim_factory``); ``netlink_factory`` opens
    netlink handles; ``main_route_table`` builds the family's main route table
    (default: a :class:`~felixpy.drivers.routetable.RouteTable`, or a
    :class:`~felixpy.drivers.routetable.DummyTable` with ``RouteSyncDisabled``);
    ``sysctls`` writes ``/proc/sys``; ``mtu_file`` is where the pod MTU is written
    (the daemon's default: ``/var/lib/calico/mtu`` or ``FELIXPY_MTU_FILE``; unset,
    nothing is written); ``clock`` times device re-checks and route grace periods;
    ``cleanups`` builds the cleanup-only drivers of the backends not in use.
    """

    tables: TablesFactory | None = None
    # Default: by mode (:func:`_default_cleanups`) when ``tables`` is the default too, else none —
    # fake tables never get real cleanup drivers.
    cleanups: CleanupFactory | None = None
    netlink_factory: NetlinkFactory | None = None
    mtu_file: str | None = None  # Felix's MTU file for the CNI plugin; None: not managed (tests)
    main_route_table: RouteTableFactory | None = None
    sysctls: SysctlWriter = field(default_factory=ProcSys)
    clock: Callable[[], float] = time.monotonic
    # Inputs of the default factories.
    iptables_runner: CommandRunner = field(default_factory=SubprocessRunner)
    ipset_runner: CommandRunner = field(default_factory=SubprocessRunner)
    conntrack_runner: CommandRunner | None = None
    iptables_backend: str | None = None  # skip detection
    nft_shim_factory: Callable[[], NftShim] | None = None  # libnftables by default
    # BPF mode: the shared maps/programs/attach bundle (default: pinned under $FELIXPY_BPF_PIN_ROOT
    # or /sys/fs/bpf/tc/globals, compiled in the worker).
    bpf_kernel: Callable[[Config], BPFKernel] | None = None

    def netlink(self) -> NetlinkFactory:
        if self.netlink_factory is None:
            from felixpy.drivers.netlink.pyroute import PyrouteNetlink

            self.netlink_factory = PyrouteNetlink
        return self.netlink_factory


@dataclass
class FamilyParts:
    """What :func:`build` made for one IP family (tests read managers and drivers back from it)."""

    v: int
    renderer: RuleRenderer
    tables: FamilyTables
    main_route_table: RouteTableAPI
    devices: TunnelDevices
    sysctls: InterfaceSysctls
    ipsets_manager: IPSetsManager
    hostips: HostIPManager
    policy: PolicyManager
    endpoints: EndpointManager
    hostendpoints: HostEndpointManager
    floatingips: FloatingIPManager
    masq: MasqManager
    serviceloop: ServiceLoopManager
    dscp: DSCPManager
    routing: list[Manager] = field(default_factory=list)
    fdb: VXLANFDB | None = None
    bpf: BPFFamilyParts | None = None  # BPF mode only


@dataclass
class BPFFamilyParts:
    """BPF mode's per-family pieces (the endpoint driver is shared by both families)."""

    manager: BPFEndpointManager
    ipsets: BPFIPSetsDataplane
    driver: BPFEndpoints
    routes: BPFRoutes
    failsafes: BPFFailsafes
    conntrack: ConntrackScanner
    route_manager: BPFRouteManager
    raw_egress: RawEgressPolicyManager  # untracked egress policy's cali-po- chains, in the real raw table
    linux_ipsets: FilteredIPSets  # the family's Linux IP sets, filtered to what raw_egress names


@dataclass
class BuiltDataplane:
    dataplane: InternalDataplane
    families: dict[int, FamilyParts]
    status: EndpointStatusCombiner
    mode: str  # "iptables-legacy" | "iptables-nft" | "nftables"


def build(config: Config, *, clock: Clock, status_sink: Callable[[list[EndpointStatus]], None] | None = None,
          feed_sink: Callable[[list[Message]], None] | None = None,
          on_first_sync: Callable[[float], None] | None = None, metrics: ApplyMetrics | None = None,
          deps: KernelDeps | None = None) -> BuiltDataplane:
    """Every manager and driver for *config*, registered with a new loop (nothing touches the kernel)."""
    deps = deps or KernelDeps()
    dp = InternalDataplane(config, clock, status_sink=status_sink, feed_sink=feed_sink,
                           on_first_sync=on_first_sync, metrics=metrics)
    dp.register_manager(FeedSummaryManager())
    status = EndpointStatusCombiner()
    families = [4, 6] if config.Ipv6Support else [4]
    tables_factory = deps.tables or _default_tables(deps)
    cleanups = deps.cleanups or (_default_cleanups(deps) if deps.tables is None else None)
    if config.BPFEnabled:
        parts = _build_bpf(dp, config, families, tables_factory, deps, status)
    else:
        parts = {v: _build_family(dp, config, v, tables_factory(config, v), deps, status) for v in families}
    if cleanups is not None:
        for v in families:  # after every family's tables: registration order is apply order
            for driver in cleanups(config, v, parts[v].tables.backend):
                dp.register_cleanup(driver)
    if deps.mtu_file is not None:
        # The one node-level object: Felix's MTU file has no IP family.
        dp.register_device_syncer(HostMTU(new_handle=deps.netlink(), pattern=config.MTUIfacePattern,
                                          pod_mtu=lambda host: pod_mtu(config, host), path=deps.mtu_file,
                                          clock=deps.clock))
    dp.register_manager(status)
    backend = parts[4].tables.backend
    mode = backend if backend == "nftables" else f"iptables-{backend}"
    if config.BPFEnabled:
        mode = f"bpf+{mode}"
    log.info("Built dataplane", mode=mode, families=families)
    return BuiltDataplane(dp, parts, status, mode)


def build_dataplane(config: Config, *, clock: Clock,
                    status_sink: Callable[[list[EndpointStatus]], None] | None = None,
                    feed_sink: Callable[[list[Message]], None] | None = None,
                    on_first_sync: Callable[[float], None] | None = None, metrics: ApplyMetrics | None = None,
                    deps: KernelDeps | None = None) -> InternalDataplane:
    """The daemon's build function: :func:`build` with the real kernel (and Felix's MTU file), keeping
    only the loop."""
    deps = deps or KernelDeps(mtu_file=mtu_file_path())
    return build(config, clock=clock, status_sink=status_sink, feed_sink=feed_sink, on_first_sync=on_first_sync,
                 metrics=metrics, deps=deps).dataplane


# ------------------------------------------------------------------------------ tables
def _default_tables(deps: KernelDeps) -> TablesFactory:
    backends: dict[str, str] = {}  # detected once, shared by both families

    def make(config: Config, v: int) -> FamilyTables:
        if config.nftables_enabled:
            return _nftables_tables(config, v, deps)
        if "backend" not in backends:
            backends["backend"] = deps.iptables_backend or _detect_backend(config, deps)
        return _iptables_tables(config, v, backends["backend"], deps)

    return make


def _default_cleanups(deps: KernelDeps) -> CleanupFactory:
    """Felix's cleanup tables: what the other backends may hold from an earlier run with another mode.

    iptables modes clean the other iptables backend and the nftables ``calico`` table; nftables mode
    cleans both iptables backends and then the kernel ipsets their rules referenced.  BPF mode keeps
    its IP sets in maps, but over iptables its filtered ipset driver owns the kernel ipsets (it keeps
    those untracked egress policy uses and sweeps the rest itself), so only BPF over nftables destroys
    them here; the *tables modes remove what BPF mode left (attachments, TCX link pins, map pins:
    Felix's ``CleanUpProgramsAndPins``), once per node."""
    def make(config: Config, v: int, backend: str) -> list[NamedSyncer]:
        from felixpy.drivers.iptables.cleanup import BACKENDS, IptablesBackendCleanup

        out: list[NamedSyncer] = [IptablesBackendCleanup(v, b, runner=deps.iptables_runner)
                                    for b in BACKENDS if b != backend]
        if backend != "nftables":
            from felixpy.drivers.nftables.shim import NftChildProcess
            from felixpy.drivers.nftables.cleanup import NftablesTableCleanup

            out.append(NftablesTableCleanup(v, deps.nft_shim_factory or NftChildProcess))
        if backend == "nftables":
            from felixpy.drivers.ipsets.cleanup import IPSetsCleanup

            out.append(IPSetsCleanup(v, deps.ipset_runner))
        if not config.BPFEnabled and v == 4:
            from felixpy.drivers.bpfendpoints.cleanup import BPFCleanup
            from felixpy.drivers.bpfendpoints.kernel import configured_pin_root, default_tcx_pin_dir

            root = configured_pin_root()
            out.append(BPFCleanup(root, default_tcx_pin_dir(root)))
        return out

    return make


def _detect_backend(config: Config, deps: KernelDeps) -> str:
    from felixpy.drivers.iptables.detect import detect_backend

    return detect_backend(deps.iptables_runner, config.IptablesBackend)


def _iptables_tables(config: Config, v: int, backend: str, deps: KernelDeps) -> FamilyTables:
    from felixpy.drivers.ipsets.driver import IPSets
    from felixpy.drivers.iptables.detect import FeatureDetector
    from felixpy.drivers.iptables.sharedsave import SharedSave
    from felixpy.drivers.iptables.table import SAVE_WORKER_MIN_RULES, IptablesTable

    features = FeatureDetector(deps.iptables_runner, overrides=config.FeatureDetectOverride)
    shared = SharedSave(deps.iptables_runner) if backend == "nft" else None
    tables: dict[str, Table] = {
        name: IptablesTable(name, v, runner=deps.iptables_runner, backend=backend, features=features,
                            insert_mode=config.ChainInsertMode, refresh_interval=config.IptablesRefreshInterval,
                            post_write_interval=config.IptablesPostWriteCheckIntervalSecs,
                            lock_probe_interval=config.IptablesLockProbeIntervalMillis / 1000.0,
                            shared_save=shared, background_rechecks=True,
                            save_worker_min_rules=SAVE_WORKER_MIN_RULES)
        for name in TABLE_NAMES}
    return FamilyTables(tables, IPSets(v, deps.ipset_runner), None, list(tables.values()), backend)


def _nftables_tables(config: Config, v: int, deps: KernelDeps) -> FamilyTables:
    # One `calico` table per family: the root is the transaction, the IP-set dataplane and the
    # verdict-map owner; the rules layer sees per-layer views of it.
    from felixpy.drivers.nftables import new_nftables_tables
    from felixpy.drivers.nftables.shim import WORKER_BELOW_BYTES, NftChildProcess

    # Big transactions run nft as a child per call, as Felix (knftables) does: libnftables in-process
    # kept a 300k-rule transaction's C heap resident (2.5 GiB at stress, #17) and aborted the daemon
    # when both families' contexts ran on two apply threads at once (found by the kill -9 trials, #14).
    # Listings are parsed in a child too (nftables/snapshotworker.py): nft's JSON never enters the daemon.
    # Small transactions (the steady state) go to one long-lived libnftables context in a worker child
    # (nftables/txworker.py): half a fresh nft's time, and its heap and failures stay out of the daemon.
    shim = deps.nft_shim_factory() if deps.nft_shim_factory else NftChildProcess(
        parse_in_child=True, worker_below=WORKER_BELOW_BYTES)
    root, layers = new_nftables_tables(v, shim, refresh_interval=config.NftablesRefreshInterval)
    views: dict[str, Table] = dict(layers)
    # The dispatch maps live in the filter layer (their names get its prefix).
    return FamilyTables(views, root, layers["filter"], [root], "nftables")


def program_static_chains(renderer: RuleRenderer, tables: Mapping[str, Table]) -> None:
    """Start of day: static chains and the hooks into the kernel chains (recorded only).  The
    manager-owned chains they jump to are created by their managers' first apply."""
    for name, table in tables.items():
        table.update_chains(renderer.static_chains(name))
    install_kernel_hooks(tables, renderer.kernel_hooks())


def install_kernel_hooks(tables: Mapping[str, Table], hooks: Iterable[KernelHook]) -> None:
    """Record felixpy's rules in the kernel chains (appended, or as ChainInsertMode says)."""
    for hook in hooks:
        table = tables[hook.table]
        if hook.always_append:
            table.append_rules(hook.chain, hook.rules)
        else:
            table.insert_or_append_rules(hook.chain, hook.rules)


# ------------------------------------------------------------------------------ per family
def _main_route_table(config: Config, v: int, deps: KernelDeps) -> RouteTableAPI:
    if deps.main_route_table is not None:
        return deps.main_route_table(config, v)
    if config.RouteSyncDisabled:
        return DummyTable(v)
    from felixpy.drivers.routetable import MainTableOwnershipPolicy, RouteTable
    from felixpy.drivers.routetable.conntrack import CONNTRACK_TIMEOUT, ConntrackCleanupTracker, ConntrackFlusher

    conntrack = deps.conntrack_runner or SubprocessRunner(timeout=CONNTRACK_TIMEOUT)
    return RouteTable(
        ip_version=v, new_handle=deps.netlink(), table_index=MAIN_ROUTE_TABLE,
        ownership=MainTableOwnershipPolicy(workload_iface_prefixes=config.InterfacePrefix,
                                           device_route_protocol=config.DeviceRouteProtocol,
                                           remove_external_routes=config.RemoveExternalRoutes,
                                           vxlan_iface=vxlan_device_name(v)),
        default_protocol=config.DeviceRouteProtocol,
        device_route_source_address=(config.DeviceRouteSourceAddress if v == 4
                                     else config.DeviceRouteSourceAddressIPv6) or None,
        static_arp=(v == 4), conntrack=ConntrackCleanupTracker(v, ConntrackFlusher(conntrack)), clock=deps.clock,
    )


def _tunnel_devices(config: Config, v: int, deps: KernelDeps) -> TunnelDevices:
    """The family's tunnel-device syncer: every device name Calico reserves for it, enabled or not."""
    wg_iface = config.WireguardInterfaceName if v == 4 else config.WireguardInterfaceNameV6
    names = [(vxlan_device_name(v), KIND_VXLAN, vxlan_enabled(config, v)),
             (wg_iface, KIND_WIREGUARD, wireguard_enabled(config, v))]
    if v == 4:
        names.append((IPIP_DEVICE, KIND_IPIP, ipip_enabled(config, v)))
    enabled, disabled = owned_devices(names)
    return TunnelDevices(ip_version=v, new_handle=deps.netlink(), enabled=enabled, disabled=disabled,
                         clock=deps.clock)


def _announce_devices(devices: TunnelDevices, route_table: RouteTableAPI) -> None:
    """A (re)created device has a new ifindex: the route table must learn it and re-read its routes."""
    def on_created(name: str, index: int, oper_up: bool) -> None:
        route_table.on_iface_state(name, IfaceState.UP if oper_up else IfaceState.DOWN, index)
        route_table.queue_resync_iface(name)

    devices.add_creation_listener(on_created)


def _family_drivers(dp: InternalDataplane, config: Config, v: int, deps: KernelDeps, *,
                    register_sysctls: bool = True) -> tuple[RouteTableAPI, TunnelDevices, InterfaceSysctls]:
    """What every mode has per family: the main route table (shared with the routing managers), the
    tunnel devices (announced to it) and the interface sysctls; the two syncers are registered (the
    sysctls by the caller instead when *register_sysctls* is false: BPF mode, after the programs)."""
    main_rt = _main_route_table(config, v, deps)
    devices = _tunnel_devices(config, v, deps)
    _announce_devices(devices, main_rt)
    sysctls = InterfaceSysctls(v, deps.sysctls)
    if config.IPForwarding == "Enabled":
        sysctls.set_global("net/ipv4/ip_forward" if v == 4 else "net/ipv6/conf/all/forwarding", "1")
    dp.register_device_syncer(devices)
    if register_sysctls:
        dp.register_device_syncer(sysctls)
    return main_rt, devices, sysctls


def _family_parts(config: Config, v: int, renderer: RuleRenderer, ft: FamilyTables, tables: Mapping[str, Table],
                  drivers: tuple[RouteTableAPI, TunnelDevices, InterfaceSysctls], status: EndpointStatusCombiner, *,
                  maps: MapsDataplane | None, floating_ips: bool, bpf_raw: Table | None = None) -> FamilyParts:
    """The family's managers, writing to *tables* (the family's own, or discarded ones in BPF mode).

    BPF mode passes its real raw table as *bpf_raw*: the host-endpoint manager (in its BPF mode) writes
    untracked egress policy there, with the policy-group chains it uses; the endpoint manager renders
    no chains."""
    main_rt, devices, sysctls = drivers
    priority = config.IPv4NormalRoutePriority if v == 4 else config.IPv6NormalRoutePriority
    hep_raw = tables["raw"] if bpf_raw is None else bpf_raw
    # Workload and host endpoints share policy-group chains: one refcount decides when one exists.
    groups = PolicyGroupChains(renderer, [hep_raw, tables["mangle"], tables["filter"]])
    return FamilyParts(
        v=v, renderer=renderer, tables=ft, main_route_table=main_rt, devices=devices, sysctls=sysctls,
        ipsets_manager=IPSetsManager(f"ipv{v}", ft.ipsets, config.MaxIpsetSize),
        hostips=HostIPManager(v, ft.ipsets, config.InterfacePrefix, config.MaxIpsetSize),
        policy=PolicyManager(v, renderer, raw=tables["raw"], mangle=tables["mangle"], filter=tables["filter"]),
        endpoints=EndpointManager(v, renderer, raw=tables["raw"], mangle=tables["mangle"], filter=tables["filter"],
                                  route_table=main_rt, sysctls=sysctls, status=status, route_priority=priority,
                                  maps=maps, groups=groups, floating_ips=floating_ips,
                                  render_chains=bpf_raw is None),
        hostendpoints=HostEndpointManager(v, renderer, raw=hep_raw, mangle=tables["mangle"],
                                          filter=tables["filter"], status=status, groups=groups,
                                          workload_prefixes=config.InterfacePrefix, bpf_mode=bpf_raw is not None),
        floatingips=FloatingIPManager(v, renderer, tables["nat"], floating_ips),
        masq=MasqManager(v, ft.ipsets, tables["nat"], renderer, config.MaxIpsetSize),
        serviceloop=ServiceLoopManager(v, renderer, tables["filter"]),
        dscp=DSCPManager(v, ft.ipsets, tables["mangle"], renderer, config.MaxIpsetSize),
    )


def _build_family(dp: InternalDataplane, config: Config, v: int, ft: FamilyTables, deps: KernelDeps,
                  status: EndpointStatusCombiner) -> FamilyParts:
    renderer = RuleRenderer(config, v, options=renderer_options(config))
    program_static_chains(renderer, ft.tables)
    dp.register_ipsets(ft.ipsets)
    drivers = _family_drivers(dp, config, v, deps)
    parts = _family_parts(config, v, renderer, ft, ft.tables, drivers, status, maps=ft.maps,
                          floating_ips=config.FloatingIPs == "Enabled")
    for mgr in (parts.ipsets_manager, parts.hostips, parts.policy, parts.endpoints, parts.hostendpoints,
                parts.floatingips, parts.masq, parts.serviceloop, parts.dscp):
        dp.register_manager(mgr)
    _build_routing(dp, config, parts, deps)
    for table in ft.to_apply:
        dp.register_table(table)
    return parts


# ------------------------------------------------------------------------------ routing
def vxlan_enabled(config: Config, v: int) -> bool:
    """VXLAN for family *v*: ``VXLANEnabled``; for IPv6 also ``Ipv6Support`` (see the module doc)."""
    return bool(config.VXLANEnabled) and (v == 4 or config.Ipv6Support)


def wireguard_enabled(config: Config, v: int) -> bool:
    return config.WireguardEnabled if v == 4 else config.WireguardEnabledV6


def ipip_enabled(config: Config, v: int) -> bool:
    return v == 4 and bool(config.IpInIpEnabled)


def renderer_options(config: Config) -> RendererOptions:
    """The encapsulation inputs of the rules layer, from the same signal the managers use: with VXLAN on,
    the static chains allow VXLAN from (and to) the ``all-vxlan-net`` set the VXLAN manager keeps."""
    return RendererOptions(vxlan_enabled=vxlan_enabled(config, 4), vxlan_enabled_v6=vxlan_enabled(config, 6))


def pod_mtu(config: Config, host_mtu: int) -> int:
    """Felix's ``determinePodMTU``: the smallest MTU among the enabled encapsulations (each configured, or
    the host MTU less its overhead), or the host MTU when none is enabled."""
    candidates = [
        (config.IpInIpMtu or host_mtu - 20, ipip_enabled(config, 4)),
        (config.VXLANMTU or host_mtu - 50, vxlan_enabled(config, 4)),
        (config.VXLANMTUV6 or host_mtu - 70, vxlan_enabled(config, 6)),
        (config.WireguardMTU or host_mtu - 60, wireguard_enabled(config, 4)),
        (config.WireguardMTUV6 or host_mtu - 80, wireguard_enabled(config, 6)),
    ]
    enabled = [mtu for mtu, on in candidates if on and mtu > 0]
    if not enabled:
        return host_mtu
    mtu = min(enabled)
    if mtu > host_mtu:
        log.warning("Configured MTU is larger than the detected host interface MTU", mtu=mtu, host_mtu=host_mtu)
    return mtu


def wireguard_table_index(config: Config, v: int) -> int:
    """Felix grabs WireGuard's routing tables from ``RouteTableRanges``: the first index for IPv4,
    the second for IPv6."""
    indices = (i for lo, hi in config.RouteTableRanges for i in range(lo, hi + 1))
    want = 0 if v == 4 else 1
    for n, index in enumerate(indices):
        if n == want:
            return index
    raise ConfigError(f"RouteTableRanges {config.RouteTableRanges} has no routing table left for IPv{v} WireGuard")


def _build_routing(dp: InternalDataplane, config: Config, parts: FamilyParts, deps: KernelDeps) -> None:
    """Routing managers for one family (Felix's ``NewIntDataplaneDriver`` conditions).

    The main table is the endpoint manager's: each manager returns it from
    ``route_table_syncers()`` and the loop applies it once.  The VXLAN FDB is
    registered with the loop, which applies it before the routes that use it and
    forwards interface state to it.
    """
    from felixpy.managers.noencap import NoEncapManager, noencap_enabled
    from felixpy.managers.vxlan import VXLANManager

    v, rt, devices, ipsets = parts.v, parts.main_route_table, parts.devices, parts.tables.ipsets
    hostname = config.hostname
    vxlan, ipip, wireguard = vxlan_enabled(config, v), ipip_enabled(config, v), wireguard_enabled(config, v)
    log.info("Routing managers", ip_version=v, hostname=hostname, vxlan=vxlan, ipip=ipip, wireguard=wireguard,
             route_sync=not isinstance(rt, DummyTable), program_cluster_routes=config.ProgramClusterRoutes)
    routing: list[Manager] = []
    if vxlan:
        fdb = VXLANFDB(ip_version=v, iface_name=vxlan_device_name(v), new_handle=deps.netlink())
        devices.add_creation_listener(lambda name, _index, _up: fdb.queue_resync() if name == fdb.iface_name else None)
        dp.register_fdb(fdb)
        parts.fdb = fdb
        routing.append(VXLANManager(cfg=config, hostname=hostname, ip_version=v, route_table=rt, fdb=fdb,
                                    devices=devices, ipsets=ipsets))
    if ipip:
        from felixpy.managers.ipip import IPIPManager

        # Also keeps the all-hosts-net set the static chains reference with IPIP on.
        routing.append(IPIPManager(cfg=config, hostname=hostname, route_table=rt, devices=devices, ipsets=ipsets))
    if config.NATOutgoingExclusions == "IPPoolsAndHostIPs" and not ipip:
        # Felix's hosts-IP-set manager: cali-nat-outgoing excludes all-hosts-net, so the set must
        # exist (the IPIP manager maintains it when IPIP is on).
        from felixpy.managers.hostsipset import HostsIPSetManager

        routing.append(HostsIPSetManager(v, ipsets, config.ExternalNodesCIDRList, config.MaxIpsetSize))
    if wireguard:
        from felixpy.drivers.routerule import RouteRules
        from felixpy.drivers.routetable import ExclusiveOwnershipPolicy, RouteTable
        from felixpy.managers.wireguard import WireguardManager

        iface = config.WireguardInterfaceName if v == 4 else config.WireguardInterfaceNameV6
        index = wireguard_table_index(config, v)
        wg_table = RouteTable(ip_version=v, new_handle=deps.netlink(), table_index=index,
                              ownership=ExclusiveOwnershipPolicy([iface]),
                              default_protocol=config.DeviceRouteProtocol, clock=deps.clock)
        _announce_devices(devices, wg_table)
        rules = RouteRules(ip_version=v, table_indices=[index], new_handle=deps.netlink())
        routing.append(WireguardManager(cfg=config, hostname=hostname, ip_version=v, route_table=wg_table,
                                        route_rules=rules, devices=devices, fwmark=parts.renderer.marks.wireguard))
    if noencap_enabled(config) and not (vxlan or ipip or wireguard):
        routing.append(NoEncapManager(cfg=config, hostname=hostname, ip_version=v, route_table=rt))
    for mgr in routing:
        dp.register_manager(mgr)
    parts.routing = routing


# ------------------------------------------------------------------------------ BPF mode
def _default_bpf_kernel(config: Config) -> BPFKernel:
    from felixpy.drivers.bpfendpoints import open_kernel
    from felixpy.drivers.bpfendpoints.kernel import configured_pin_root

    return open_kernel(configured_pin_root(), config.BPFAttachType, sizes=bpf_map_sizes(config))


def bpf_map_sizes(config: Config) -> dict[str, int]:
    """Map sizes from the config.  The per-attach-point maps (globals and counters: an entry per
    interface and TC hook) follow ``BPFMapSizeIfState``, the number of interfaces the node is sized
    for: at their fixed sizes (4,000 and 20,000) a node raised to 5,000 workloads failed 3,000 of them
    with E2BIG, whatever BPFMapSizeIfState said."""
    from felixpy.bpf import maps

    ifaces = config.BPFMapSizeIfState
    return {"cali_v4_ct4": config.BPFMapSizeConntrack, "cali_v6_ct4": config.BPFMapSizeConntrack,
            "cali_v4_routes": config.BPFMapSizeRoute, "cali_v6_routes": config.BPFMapSizeRoute,
            "cali_v4_ip_sets": config.BPFMapSizeIPSets, "cali_v6_ip_sets": config.BPFMapSizeIPSets,
            "cali_iface4": ifaces,
            "cali_ap_glob": max(maps.AP_GLOBALS.max_entries, 4 * ifaces),
            "cali_counters6": max(maps.COUNTERS.max_entries, 4 * ifaces)}


BPF_HOLD_ATTACH = "FELIXPY_TEST_HOLD_BPF_ATTACH"  # FV test hook: a file naming interfaces not to attach yet


def _attach_hold_hook() -> Callable[[str], bool] | None:
    """The FV attach-gap test's hook: with ``FELIXPY_TEST_HOLD_BPF_ATTACH=<file>``, interfaces named
    in that file (one per line, re-read on every apply) are programmed but not attached yet."""
    path = os.environ.get(BPF_HOLD_ATTACH)
    if not path:
        return None

    def held(iface: str) -> bool:
        try:
            with open(path, encoding="utf-8") as f:
                return iface in {line.strip() for line in f}
        except FileNotFoundError:
            return False

    return held


def _build_bpf(dp: InternalDataplane, config: Config, families: list[int], tables_factory: TablesFactory,
               deps: KernelDeps, status: EndpointStatusCombiner) -> dict[int, FamilyParts]:
    """BPF mode (Felix's ``BPFEnabled``): policy in BPF programs per workload interface, IP sets in
    the LPM maps, and only the attach-gap and fall-through rules in *tables
    (:mod:`felixpy.rules.bpfmode`).  The *tables endpoint manager still does routes, sysctls and
    status, with its chains discarded; host endpoints are programmed on the host data interfaces
    (``BPFDataIfacePattern``) by the same BPF endpoint manager and driver.  Untracked host-endpoint
    egress policy stays in raw OUTPUT, as Felix keeps it: the host-endpoint manager (BPF mode) and the
    raw-egress policy manager write it to the real raw table, and the family's Linux IP sets (the
    ipset driver or the nft root, behind :class:`FilteredIPSets`, fed by the same IP-sets manager as
    the maps) hold only the sets it matches."""
    from felixpy.drivers.bpfconntrack.scanner import ConntrackScanner
    from felixpy.drivers.bpfconntrack.api import resolve_timeouts
    from felixpy.drivers.bpfendpoints import BPFEndpoints
    from felixpy.drivers.bpfendpoints.discard import DiscardTable
    from felixpy.drivers.bpfendpoints.ipsets import BPFIPSetsDataplane
    from felixpy.drivers.bpffailsafe.driver import BPFFailsafes
    from felixpy.drivers.bpfroutes.driver import BPFRoutes
    from felixpy.managers.bpf_endpoints import BPFEndpointManager
    from felixpy.managers.bpf_maps import BPFConntrackManager, BPFFailsafeManager, BPFRouteManager
    from felixpy.rules import bpfmode

    kernel = (deps.bpf_kernel or _default_bpf_kernel)(config)
    driver = BPFEndpoints(kernel, redirect_peer=config.BPFRedirectToPeer != "Disabled",
                          nat_exclude_hosts=config.NATOutgoingExclusions == "IPPoolsAndHostIPs",
                          hold_attach=_attach_hold_hook(), workload_prefixes=tuple(config.InterfacePrefix),
                          enforce_rpf=config.BPFEnforceRPF)
    parts: dict[int, FamilyParts] = {}
    sysctls: list[InterfaceSysctls] = []
    for v in families:
        ft = tables_factory(config, v)
        renderer = RuleRenderer(config, v, options=renderer_options(config))
        tables = ft.tables
        for name, table in tables.items():
            table.update_chains(bpfmode.static_chains(renderer.ctx, name))
        install_kernel_hooks(tables, bpfmode.kernel_hooks(renderer.ctx))
        bpf_ipsets = BPFIPSetsDataplane(v, kernel)
        # Untracked egress policy still matches Linux IP sets (the ipset driver, or the nft root): only
        # those it names reach the kernel, their members read from the maps' dataplane.
        linux_ipsets = FilteredIPSets(ft.ipsets, bpf_ipsets.get_desired_members)
        ft = FamilyTables(tables, bpf_ipsets, ft.maps, ft.to_apply, ft.backend)
        discard = {name: DiscardTable(name, v) for name in TABLE_NAMES}
        drivers = _family_drivers(dp, config, v, deps, register_sysctls=False)
        sysctls.append(drivers[2])
        dp.register_device_syncer(bpf_ipsets)  # members before the programs that use them
        routes = BPFRoutes(v, kernel.maps.routes(v == 6))  # before the programs (source check)
        failsafes = BPFFailsafes(v, kernel.maps.failsafes(v == 6))
        timeouts = resolve_timeouts(config.BPFConntrackTimeouts, lambda n: deps.sysctls.read(f"net/netfilter/{n}"))
        # Its own thread over the real maps; over injected (fake) maps each apply scans inline.
        conntrack = ConntrackScanner(v, kernel.maps.ct(v == 6), timeouts, background=deps.bpf_kernel is None)
        for syncer in (routes, failsafes, conntrack):
            dp.register_device_syncer(syncer)
        dp.register_ipsets(bpf_ipsets)  # removed sets cleared after the tables and programs
        dp.register_ipsets(linux_ipsets)  # written before the tables, destroyed after them
        # Policy, host endpoints, floating IPs and service-loop prevention are BPF work, but for untracked
        # host-endpoint egress policy, which Felix keeps in raw OUTPUT: the host-endpoint manager (BPF mode)
        # and the raw-egress policy manager write it to the real raw table.  Every other chain of these
        # managers is discarded (the endpoint manager is registered for its routes, sysctls and status).
        # Outgoing NAT is: the programs mark, cali-nat-outgoing (in the real nat table) masquerades.
        fam = _family_parts(config, v, renderer, ft, discard, drivers, status, maps=None, floating_ips=False,
                            bpf_raw=tables["raw"])
        fam.ipsets_manager.add_dataplane(linux_ipsets)
        fam.masq = MasqManager(v, bpf_ipsets, tables["nat"], renderer, config.MaxIpsetSize)
        fam.bpf = BPFFamilyParts(BPFEndpointManager(v, renderer.ctx, driver, filter=tables["filter"]),
                                 bpf_ipsets, driver, routes, failsafes, conntrack,
                                 BPFRouteManager(v, config, routes, workload_prefixes=renderer.ctx.workload_prefixes),
                                 RawEgressPolicyManager(v, renderer, raw=tables["raw"], ipsets=linux_ipsets),
                                 linux_ipsets)
        # The BPF endpoint manager resolves host endpoints as the host-endpoint manager does and programs
        # their interfaces (untracked ingress policy in XDP).
        for mgr in (fam.ipsets_manager, fam.hostips, fam.bpf.raw_egress, fam.endpoints, fam.hostendpoints,
                    fam.masq, fam.bpf.manager, fam.bpf.route_manager,
                    BPFFailsafeManager(v, config, failsafes), BPFConntrackManager(v, conntrack)):
            dp.register_manager(mgr)
        _build_routing(dp, config, fam, deps)
        for table in ft.to_apply:
            dp.register_table(table)
        parts[v] = fam
    dp.register_device_syncer(driver)  # after every family's IP sets
    # After the programs, as Felix's endpoint manager configures interfaces after its BPF endpoint
    # manager's attach; the driver runs them while its tc -batch child attaches (WaitsOnChild).
    for s in sysctls:
        dp.register_device_syncer(s)
    log.info("BPF mode", families=families, attach_type=config.BPFAttachType)
    return parts
