"""Building a dataplane for a config: which managers and drivers, per IP family and mode.

This is the one construction site (Felix's ``NewIntDataplaneDriver``): every
per-family manager and driver is created here — the IPv6 set when
``Ipv6Support`` is on — and registered with the loop in Felix's order
(IP sets, policy, endpoints per family; v4 then v6).  Cross-cutting components
(the endpoint-status combiner) are registered with *every* family here.

Routing (:func:`_build_routing`): one main route table per family, shared by
the endpoint manager and the VXLAN / no-encap / IPIP managers (the loop applies
it once); the VXLAN manager per family that has VXLAN on (its FDB registered
with the loop, applied before routes), IPIP (v4) and WireGuard when configured
(this kernel lacks both: they report ``UnsupportedFeature`` once and the rest
keeps running), and the no-encap manager when ``ProgramClusterRoutes`` asks for
it and no overlay is on for that family (Felix's conditions).

Encapsulation signal: Felix derives ``VXLANEnabled``/``VXLANEnabledV6`` from the
IP pools (``config.Encapsulation``) and also sends them to the dataplane in an
``Encapsulation`` message, which arrives after the ``ConfigUpdate`` we build
from.  felixpy reads the ``VXLANEnabled`` parameter (Felix's override, carried
in ``ConfigUpdate``): VXLAN for IPv4 when it is true, and for IPv6 when it is
true *and* ``Ipv6Support`` is on (:func:`vxlan_enabled`).  IPIP is
``IpInIpEnabled`` (IPv4 only); WireGuard ``WireguardEnabled[V6]``.

Kernel access is injected through :class:`KernelDeps` so tests can build the
same graph over fakes.  Start-of-day chains are handed to the tables here;
tables only record them, so nothing reaches the kernel before the first apply
after ``InSync``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.dataplane.clock import Clock
from felixpy.dataplane.core import InternalDataplane
from felixpy.drivers.generictables.table import Table
from felixpy.drivers.procsys import ProcSys, SysctlWriter
from felixpy.errors import ConfigError, UnsupportedFeature
from felixpy.kernelnames import vxlan_device_name
from felixpy.managers.dscp import DSCPManager
from felixpy.managers.endpoints import EndpointManager
from felixpy.managers.hostips import HostIPManager
from felixpy.managers.masq import MasqManager
from felixpy.managers.policy import PolicyManager
from felixpy.managers.status import EndpointStatusCombiner
from felixpy.rules import RendererOptions, RuleRenderer

log = structlog.get_logger(__name__)

TABLE_NAMES = ("raw", "mangle", "filter", "nat")


class FeedSummaryManager:
    """Counts what the feed delivered and logs a summary per apply (observability only)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._since_apply: Counter[str] = Counter()

    def on_update(self, msg: Any) -> None:
        name = type(msg).__name__
        self.counts[name] += 1
        self._since_apply[name] += 1

    def complete_deferred_work(self) -> None:
        if self._since_apply:
            log.info("Batch received", **{k: v for k, v in sorted(self._since_apply.items())})
            self._since_apply.clear()


@dataclass
class KernelDeps:
    """How drivers reach the kernel; the defaults are the real thing in this process's netns."""

    iptables_runner: Any = None
    ipset_runner: Any = None
    netlink_factory: Callable[[], Any] | None = None
    conntrack_runner: Any = None
    sysctls: SysctlWriter = field(default_factory=ProcSys)
    iptables_backend: str | None = None  # skip detection (tests)
    nft_shim_factory: Callable[[], Any] | None = None  # libnftables by default

    def __post_init__(self) -> None:
        from felixpy.drivers.cmdshim import SubprocessRunner
        from felixpy.drivers.routetable.conntrack import CONNTRACK_TIMEOUT

        if self.iptables_runner is None:
            self.iptables_runner = SubprocessRunner()
        if self.ipset_runner is None:
            self.ipset_runner = SubprocessRunner()
        if self.netlink_factory is None:
            from felixpy.drivers.netlink.pyroute import PyrouteNetlink

            self.netlink_factory = PyrouteNetlink
        if self.conntrack_runner is None:
            self.conntrack_runner = SubprocessRunner(timeout=CONNTRACK_TIMEOUT)


def build_dataplane(config: Config, *, clock: Clock, status_sink: Any = None, on_first_sync: Any = None,
                    metrics: Any = None, deps: KernelDeps | None = None) -> InternalDataplane:
    if config.BPFEnabled:
        raise UnsupportedFeature("BPF dataplane mode", "the BPF endpoint manager is not wired into the daemon yet")
    deps = deps or KernelDeps()
    dp = InternalDataplane(config, clock, status_sink=status_sink, on_first_sync=on_first_sync, metrics=metrics)
    dp.register_manager(FeedSummaryManager())
    status = EndpointStatusCombiner()
    families = [4, 6] if config.Ipv6Support else [4]
    backend = "nftables" if config.nftables_enabled else (deps.iptables_backend or _detect_backend(config, deps))
    log.info("Building dataplane", mode=backend if backend == "nftables" else f"iptables-{backend}",
             families=families)
    for v in families:
        _build_family(dp, config, v, backend, deps, status)
    dp.register_manager(status)
    return dp


def _detect_backend(config: Config, deps: KernelDeps) -> str:
    from felixpy.drivers.iptables.detect import detect_backend

    return detect_backend(deps.iptables_runner, config.IptablesBackend)


def program_static_chains(renderer: RuleRenderer, tables: Mapping[str, Any]) -> None:
    """Start of day: static chains and the hooks into the kernel chains (recorded only), plus the
    inactive forms of chains the static chains jump to whose owners (the service-loop and
    floating-IP managers) are not ported yet."""
    for name, table in tables.items():
        table.update_chains(renderer.static_chains(name))
    for hook in renderer.kernel_hooks():
        table = tables[hook.table]
        if hook.always_append:
            table.append_rules(hook.chain, hook.rules)
        else:
            table.insert_or_append_rules(hook.chain, hook.rules)
    tables["nat"].update_chains([renderer.fip_dnat_chain({}), renderer.fip_snat_chain({})])
    tables["filter"].update_chain(renderer.cidr_block_chain([]))


def _iptables_tables(config: Config, v: int, backend: str, deps: KernelDeps) -> dict[str, Any]:
    from felixpy.drivers.iptables.detect import FeatureDetector
    from felixpy.drivers.iptables.table import IptablesTable

    features = FeatureDetector(deps.iptables_runner, overrides=config.FeatureDetectOverride)
    return {name: IptablesTable(name, v, runner=deps.iptables_runner, backend=backend, features=features,
                                insert_mode=config.ChainInsertMode,
                                refresh_interval=config.IptablesRefreshInterval,
                                post_write_interval=config.IptablesPostWriteCheckIntervalSecs,
                                lock_probe_interval=config.IptablesLockProbeIntervalMillis / 1000.0)
            for name in TABLE_NAMES}


def _route_table(config: Config, v: int, deps: KernelDeps) -> Any:
    if config.RouteSyncDisabled:
        return None
    from felixpy.drivers.routetable.conntrack import ConntrackCleanupTracker, ConntrackFlusher
    from felixpy.drivers.routetable.ownership import MainTableOwnershipPolicy
    from felixpy.drivers.routetable.table import RouteTable

    assert deps.netlink_factory is not None
    return RouteTable(
        ip_version=v, new_handle=deps.netlink_factory, table_index=254,
        ownership=MainTableOwnershipPolicy(workload_iface_prefixes=config.InterfacePrefix,
                                           device_route_protocol=config.DeviceRouteProtocol,
                                           remove_external_routes=config.RemoveExternalRoutes,
                                           vxlan_iface=vxlan_device_name(v)),
        default_protocol=config.DeviceRouteProtocol,
        device_route_source_address=(config.DeviceRouteSourceAddress if v == 4
                                     else config.DeviceRouteSourceAddressIPv6) or None,
        static_arp=(v == 4),
        conntrack=ConntrackCleanupTracker(v, ConntrackFlusher(deps.conntrack_runner)),
    )


def _build_family(dp: InternalDataplane, config: Config, v: int, backend: str, deps: KernelDeps,
                  status: EndpointStatusCombiner) -> None:
    from felixpy.drivers.ipsets.driver import IPSets
    from felixpy.managers.ipsets import IPSetsManager

    renderer = RuleRenderer(config, v, options=renderer_options(config))
    maps: Any = None
    if backend == "nftables":
        # One `calico` table per family: the root is the transaction, the IP-set dataplane
        # and the verdict-map owner; the rules layer sees per-layer views of it.
        from felixpy.drivers.nftables import LibNftables, new_nftables_tables

        root, tables = new_nftables_tables(v, (deps.nft_shim_factory or LibNftables)(),
                                           refresh_interval=config.NftablesRefreshInterval)
        ipsets: Any = root
        maps = tables["filter"]  # the dispatch maps live in the filter layer (names get its prefix)
        apply_tables: list[Any] = [root]
    else:
        tables = _iptables_tables(config, v, backend, deps)
        ipsets = IPSets(v, deps.ipset_runner)
        apply_tables = list(tables.values())
    program_static_chains(renderer, tables)

    dp.register_ipsets(ipsets)
    dp.register_manager(IPSetsManager(f"ipv{v}", ipsets, config.MaxIpsetSize))
    dp.register_manager(HostIPManager(v, ipsets, config.InterfacePrefix, config.MaxIpsetSize))
    dp.register_manager(PolicyManager(v, renderer, raw=tables["raw"], mangle=tables["mangle"],
                                      filter=tables["filter"]))
    priority = config.IPv4NormalRoutePriority if v == 4 else config.IPv6NormalRoutePriority
    main_route_table = _route_table(config, v, deps)  # one per family, shared with the routing managers
    dp.register_manager(EndpointManager(v, renderer, raw=tables["raw"], mangle=tables["mangle"],
                                        filter=tables["filter"], route_table=main_route_table,
                                        sysctls=deps.sysctls, status=status, route_priority=priority,
                                        maps=maps))
    dp.register_manager(MasqManager(v, ipsets, tables["nat"], renderer, config.MaxIpsetSize))
    dp.register_manager(DSCPManager(v, ipsets, tables["mangle"], renderer, config.MaxIpsetSize))
    _build_routing(dp, config, v, deps, ipsets=ipsets, main_route_table=main_route_table, renderer=renderer)
    for table in apply_tables:
        dp.register_table(table)


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


def wireguard_table_index(config: Config, v: int) -> int:
    """Felix grabs WireGuard's routing tables from ``RouteTableRanges``: the first index for IPv4,
    the second for IPv6."""
    indices = (i for lo, hi in config.RouteTableRanges for i in range(lo, hi + 1))
    want = 0 if v == 4 else 1
    for n, index in enumerate(indices):
        if n == want:
            return index
    raise ConfigError(f"RouteTableRanges {config.RouteTableRanges} has no routing table left for IPv{v} WireGuard")


class NoRouteTable:
    """Felix's ``DummyTable`` for ``RouteSyncDisabled``: routing managers may hand it routes and
    interface events; nothing reaches the kernel."""

    def __init__(self, ip_version: int) -> None:
        self.ip_version = ip_version
        self.index = 254

    def set_routes(self, route_class: Any, iface: str | None, targets: Any) -> None:
        pass

    def route_update(self, route_class: Any, iface: str | None, target: Any) -> None:
        pass

    def route_remove(self, route_class: Any, iface: str | None, cidr: str) -> None:
        pass

    def on_iface_state(self, name: str, state: Any, index: int) -> None:
        pass

    def queue_resync(self) -> None:
        pass

    def queue_resync_iface(self, name: str) -> None:
        pass

    def apply(self) -> None:
        pass


def _build_routing(dp: InternalDataplane, config: Config, v: int, deps: KernelDeps, *, ipsets: Any,
                   main_route_table: Any, renderer: RuleRenderer) -> None:
    """Routing managers for family *v* (Felix's ``NewIntDataplaneDriver`` conditions).

    The main table is the endpoint manager's (``main_route_table``): each manager returns it from
    ``route_table_syncers()`` and the loop applies it once.  Each VXLAN manager's FDB is registered
    with the loop, which applies it before the routes that use it and forwards interface state to it.
    """
    from felixpy.drivers.vxlanfdb import VXLANFDB
    from felixpy.managers.noencap import NoEncapManager, noencap_enabled
    from felixpy.managers.vxlan import VXLANManager

    assert deps.netlink_factory is not None
    new_handle = deps.netlink_factory
    hostname = config.hostname
    rt: Any = main_route_table if main_route_table is not None else NoRouteTable(v)
    vxlan, ipip, wireguard = vxlan_enabled(config, v), ipip_enabled(config, v), wireguard_enabled(config, v)
    log.info("Routing managers", ip_version=v, hostname=hostname, vxlan=vxlan, ipip=ipip, wireguard=wireguard,
             route_sync=main_route_table is not None, program_cluster_routes=config.ProgramClusterRoutes)

    if vxlan:
        fdb = VXLANFDB(ip_version=v, iface_name=vxlan_device_name(v), new_handle=new_handle)
        dp.register_fdb(fdb)
        dp.register_manager(VXLANManager(cfg=config, hostname=hostname, ip_version=v, route_table=rt, fdb=fdb,
                                         new_handle=new_handle, ipsets=ipsets))
    if ipip:
        from felixpy.managers.ipip import IPIPManager

        # Also keeps the all-hosts-net set the static chains reference with IPIP on.
        dp.register_manager(IPIPManager(cfg=config, hostname=hostname, route_table=rt, new_handle=new_handle,
                                        ipsets=ipsets))
    if config.NATOutgoingExclusions == "IPPoolsAndHostIPs" and not ipip:
        # Felix's hosts-IP-set manager: cali-nat-outgoing excludes all-hosts-net, so the set must
        # exist (the IPIP manager maintains it when IPIP is on).
        from felixpy.managers.hostsipset import HostsIPSetManager

        dp.register_manager(HostsIPSetManager(v, ipsets, config.ExternalNodesCIDRList, config.MaxIpsetSize))
    if wireguard:
        from felixpy.drivers.routerule import RouteRules
        from felixpy.drivers.routetable import ExclusiveOwnershipPolicy, RouteTable
        from felixpy.managers.wireguard import WireguardManager

        iface = config.WireguardInterfaceName if v == 4 else config.WireguardInterfaceNameV6
        index = wireguard_table_index(config, v)
        wg_table = RouteTable(ip_version=v, new_handle=new_handle, table_index=index,
                              ownership=ExclusiveOwnershipPolicy([iface]),
                              default_protocol=config.DeviceRouteProtocol)
        rules = RouteRules(ip_version=v, table_indices=[index], new_handle=new_handle)
        dp.register_manager(WireguardManager(cfg=config, hostname=hostname, ip_version=v, route_table=wg_table,
                                             route_rules=rules, new_handle=new_handle,
                                             fwmark=renderer.marks.wireguard))
    if noencap_enabled(config) and not (vxlan or ipip or wireguard):
        dp.register_manager(NoEncapManager(cfg=config, hostname=hostname, ip_version=v, route_table=rt,
                                           new_handle=new_handle))
