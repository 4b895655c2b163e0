"""Building a dataplane for a config: which managers and drivers, per IP family and mode.

This is the one construction site (Felix's ``NewIntDataplaneDriver``): every
per-family manager and driver is created here — the IPv6 set when
``Ipv6Support`` is on — and registered with the loop in Felix's order
(IP sets, policy, endpoints per family; v4 then v6).  Cross-cutting components
(the endpoint-status combiner) are registered with *every* family here.

Kernel access is injected through :class:`KernelDeps` so tests can build the
same graph over fakes.  Start-of-day chains are handed to the tables here;
tables only record them, so nothing reaches the kernel before the first apply
after ``InSync``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.dataplane.clock import Clock
from felixpy.dataplane.core import InternalDataplane
from felixpy.drivers.generictables.table import Table
from felixpy.drivers.procsys import ProcSys, SysctlWriter
from felixpy.errors import UnsupportedFeature
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
        if self.iptables_runner is None:
            from felixpy.drivers.iptables.cmdshim import RealRunner

            self.iptables_runner = RealRunner()
        if self.ipset_runner is None:
            from felixpy.drivers.ipsets.cmdshim import SubprocessRunner as IpsetRunner

            self.ipset_runner = IpsetRunner()
        if self.netlink_factory is None:
            from felixpy.drivers.netlink.pyroute import PyrouteNetlink

            self.netlink_factory = PyrouteNetlink
        if self.conntrack_runner is None:
            from felixpy.drivers.routetable.conntrack import SubprocessRunner as CtRunner

            self.conntrack_runner = CtRunner()


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
                                           vxlan_iface="vxlan.calico" if v == 4 else "vxlan-v6.calico"),
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

    renderer = RuleRenderer(config, v, options=RendererOptions())
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
    # Start of day: static chains and the hooks into the kernel chains (recorded only).
    for name, table in tables.items():
        table.update_chains(renderer.static_chains(name))
    for hook in renderer.kernel_hooks():
        table = tables[hook.table]
        if hook.always_append:
            table.append_rules(hook.chain, hook.rules)
        else:
            table.insert_or_append_rules(hook.chain, hook.rules)
    # Chains the static chains jump to whose owners (service-loop and floating-IP
    # managers) are not ported yet: their inactive forms.
    tables["nat"].update_chains([renderer.fip_dnat_chain({}), renderer.fip_snat_chain({})])
    tables["filter"].update_chain(renderer.cidr_block_chain([]))

    dp.register_ipsets(ipsets)
    dp.register_manager(IPSetsManager(f"ipv{v}", ipsets, config.MaxIpsetSize))
    dp.register_manager(HostIPManager(v, ipsets, config.InterfacePrefix, config.MaxIpsetSize))
    dp.register_manager(PolicyManager(v, renderer, raw=tables["raw"], mangle=tables["mangle"],
                                      filter=tables["filter"]))
    priority = config.IPv4NormalRoutePriority if v == 4 else config.IPv6NormalRoutePriority
    dp.register_manager(EndpointManager(v, renderer, raw=tables["raw"], mangle=tables["mangle"],
                                        filter=tables["filter"], route_table=_route_table(config, v, deps),
                                        sysctls=deps.sysctls, status=status, route_priority=priority,
                                        maps=maps))
    dp.register_manager(MasqManager(v, ipsets, tables["nat"], renderer, config.MaxIpsetSize))
    dp.register_manager(DSCPManager(v, ipsets, tables["mangle"], renderer, config.MaxIpsetSize))
    for table in apply_tables:
        dp.register_table(table)
