"""The dataplane's configuration: Felix's parameter names, defaults and parsing.

One frozen :class:`Config` object holds every parameter the dataplane reads.
Attributes use Felix's own parameter names (``config.IptablesMarkMask``), so a
name in Felix's docs, a ``FELIX_*`` variable and the code are the same word.

Layers, lowest priority first, as Felix resolves them: built-in defaults <
``ConfigUpdate.config`` from the calc graph (already resolved by Felix) <
the optional config file (INI, read as Felix's ``LoadConfigFile`` reads it:
every section's keys, usually one ``[global]``) < ``FELIX_<Name>`` environment
variables (case-insensitive names).

Every parameter records its status next to its default (:data:`HONOURED`,
:data:`IGNORED` or :data:`UNSUPPORTED`); ``docs/config.md`` is generated from
those records by ``python -m felixpy.configdoc``.  A non-default value of an
ignored parameter gets one warning per process; an unknown ``FELIX_*``
variable or file key gets a warning with the closest known name.

Bad values are reported by name (:class:`ConfigProblem`) and fall back to the
default, as Felix does.  :func:`changed_params` tells the daemon which
parameters differ between two configs; any change outside
:data:`NO_RESTART_PARAMS` makes the daemon exit cleanly with
``EXIT_CONFIG_CHANGED`` so that its supervisor restarts it with the new config.
"""

from __future__ import annotations

import configparser
import dataclasses
import difflib
import ipaddress
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from felixpy.errors import ConfigError

log = structlog.get_logger(__name__)

EXIT_CONFIG_CHANGED = 129
HONOURED = "honoured"
IGNORED = "accepted and ignored"
UNSUPPORTED = "unsupported (felixpy reports it)"
NO_RESTART_PARAMS = frozenset({"CalicoVersion", "ClusterGUID", "ClusterType", "HealthTimeoutOverrides"})


@dataclass(frozen=True, slots=True)
class ProtoPort:
    """One failsafe entry: ``port``, ``proto:port`` or ``proto:net:port``."""

    protocol: str
    port: int
    net: str = ""


# --------------------------------------------------------------------------- parsers
def _bool(raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("true", "1", "yes", "y", "t", "on"):
        return True
    if v in ("false", "0", "no", "n", "f", "off"):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def _int(raw: str) -> int:
    return int(raw.strip(), 0)


def _float(raw: str) -> float:
    v = float(raw.strip())
    if v < 0:
        raise ValueError("must not be negative")
    return v


def _str(raw: str) -> str:
    return raw.strip()


def _str_list(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


_IFACE_FILTER = re.compile(r"[A-Za-z0-9_.:@-]{1,15}\+?")


def _iface_filters(raw: str) -> tuple[str, ...]:
    """Felix's ``iface-filter-slice``: interface names, each optionally ending in ``+`` (a prefix)."""
    names = _str_list(raw)
    bad = [n for n in names if not _IFACE_FILTER.fullmatch(n)]
    if bad:
        raise ValueError(f"not interface names (optionally ending in +): {', '.join(bad)}")
    return names


def _port(raw: str) -> int:
    p = int(raw)
    if not 0 <= p <= 65535:
        raise ValueError(f"port out of range: {p}")
    return p


def _choice(*choices: str) -> Callable[[str], str]:
    by_lower = {c.lower(): c for c in choices}

    def parse(raw: str) -> str:
        try:
            return by_lower[raw.strip().lower()]
        except KeyError:
            raise ValueError(f"must be one of {', '.join(choices)}") from None

    parse.choices = choices  # type: ignore[attr-defined]  # read by felixpy.configdoc
    return parse


def _mark_mask(raw: str) -> int:
    v = int(raw.strip(), 0)
    if not 0 <= v <= 0xFFFFFFFF:
        raise ValueError("not a 32-bit mask")
    return v


def _port_range(raw: str) -> str:
    raw = raw.strip()
    if raw and not re.fullmatch(r"\d+(:\d+)?", raw):
        raise ValueError("expected N or N:M")
    return raw


def _proto_ports(raw: str) -> tuple[ProtoPort, ...]:
    """Felix's failsafe syntax; only tcp and udp are accepted (as Felix's parser)."""
    out: list[ProtoPort] = []
    raw = raw.strip()
    if raw.lower() == "none" or not raw:
        return ()
    for entry in raw.split(","):
        entry = entry.strip()
        m = re.fullmatch(r"(?:(?P<proto>[a-zA-Z]+):)?(?:(?P<net>\[[^\]]+\]|[0-9./]+):)?(?P<port>\d+)", entry)
        if not m:
            raise ValueError(f"bad entry {entry!r}")
        proto = (m.group("proto") or "tcp").lower()
        if proto not in ("tcp", "udp"):
            raise ValueError(f"unsupported protocol {proto!r} in {entry!r}")
        net = (m.group("net") or "").strip("[]")
        if net:
            net = str(ipaddress.ip_network(net, strict=False))
        out.append(ProtoPort(proto, _port(m.group("port")), net))
    return tuple(out)


def _route_table_ranges(raw: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in _str_list(raw):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if not (1 <= a <= b <= 0xFFFFFFFF) or any(253 <= t <= 255 for t in (a, b)):
            raise ValueError(f"bad range {part!r}")
        out.append((a, b))
    return tuple(out)


def _p(default: Any, parse: Callable[[str], Any], status: str = HONOURED, note: str = "", *,
       warn: bool = True) -> Any:
    """One parameter: its default, its parser, and what felixpy does with it (*status*, *note*).

    *warn* (ignored parameters only): a non-default value gets a warning; off for parameters that
    concern only Felix itself, which Felix sends with its own values.
    """
    return field(default=default, metadata={"parse": parse, "status": status, "note": note, "warn": warn})


def _ignored(default: Any, parse: Callable[[str], Any], note: str, *, warn: bool = True) -> Any:
    return _p(default, parse, IGNORED, note, warn=warn)


CT_TIMEOUTS_DEFAULT = ("CreationGracePeriod=10s,TCPSynSent=20s,TCPEstablished=1h,TCPFinsSeen=Auto,"
                       "TCPResetSeen=40s,UDPTimeout=60s,GenericTimeout=10m,ICMPTimeout=5s")


def _ct_timeouts(raw: str) -> tuple[tuple[str, str], ...]:
    """Felix's ``BPFConntrackTimeouts``: ``Name=duration|Auto,...`` (validated by name and value)."""
    from felixpy.drivers.bpfconntrack.api import parse_timeouts_setting

    return parse_timeouts_setting(raw)


FAILSAFE_IN = "tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667"
FAILSAFE_OUT = "udp:53,udp:67,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667"
_WHICH_DRIVER = "felixpy is the dataplane driver; which driver Felix runs is Felix's choice"
_NO_BPF = "not read by BPF mode yet"
_BPF_OPT_IN = "in BPF mode (BPFEnabled)"
_ALLOW = _choice("ACCEPT", "RETURN")
_DENY = _choice("DROP", "REJECT")


# --------------------------------------------------------------------------- the config
@dataclass(frozen=True, slots=True)
class Config:  # noqa: N815 - attribute names are Felix's parameter names on purpose.
    # Identity.
    FelixHostname: str = _p("", _str)
    # Driver selection and modes.
    UseInternalDataplaneDriver: bool = _ignored(True, _bool, _WHICH_DRIVER, warn=False)
    DataplaneDriver: str = _ignored("calico-iptables-plugin", _str, _WHICH_DRIVER, warn=False)
    BPFEnabled: bool = _p(False, _bool, HONOURED, "workload and host-endpoint policy in BPF programs, untracked "
                          "policy in XDP and raw OUTPUT, endpoints' DSCP (docs/bpf.md); not yet: services/NAT; "
                          "floating IPs unsupported, as in Felix")
    NFTablesMode: str = _p("Auto", _choice("Enabled", "Disabled", "Auto"))
    IptablesBackend: str = _p("auto", _choice("auto", "legacy", "nft"))
    Ipv6Support: bool = _p(True, _bool)
    DataplaneWatchdogTimeout: float = _p(90.0, _float)
    # *tables.
    IptablesRefreshInterval: float = _p(180.0, _float)
    IptablesPostWriteCheckIntervalSecs: float = _p(5.0, _float)
    IptablesLockProbeIntervalMillis: float = _p(50.0, _float)
    IptablesMarkMask: int = _p(0xFFFF0000, _mark_mask, HONOURED, "BPF mode: must cover 0x1ff00000, the "
                               "programs' own marks, which are taken out before allocating (as Felix)")
    NftablesMarkMask: int = _p(0xFFFF0000, _mark_mask, HONOURED, "BPF mode: as IptablesMarkMask")
    IptablesFilterAllowAction: str = _p("ACCEPT", _ALLOW)
    IptablesMangleAllowAction: str = _p("ACCEPT", _ALLOW)
    IptablesFilterDenyAction: str = _p("DROP", _DENY)
    NftablesFilterAllowAction: str = _p("ACCEPT", _ALLOW)
    NftablesMangleAllowAction: str = _p("ACCEPT", _ALLOW)
    NftablesFilterDenyAction: str = _p("DROP", _DENY)
    IptablesNATOutgoingInterfaceFilter: str = _p("", _str)
    NftablesRefreshInterval: float = _p(180.0, _float)
    NFTablesFlowTableOffload: str = _ignored("Disabled", _choice("All", "Disabled"),
                                             "no flowtable offload in felixpy")
    NFTablesFlowTableDataIfacePattern: str = _ignored("", _str,
                                                      "no flowtable offload in felixpy")
    ChainInsertMode: str = _p("insert", _choice("insert", "append"))
    DefaultEndpointToHostAction: str = _p("DROP", _choice("DROP", "RETURN", "ACCEPT"))
    DisableConntrackInvalidCheck: bool = _p(False, _bool)
    LogPrefix: str = _p("calico-packet", _str)
    LogActionRateLimit: str = _p("", _str)
    LogActionRateLimitBurst: int = _p(5, _int)
    NATPortRange: str = _p("", _port_range)
    NATOutgoingAddress: str = _p("", _str)
    NATOutgoingExclusions: str = _p("IPPoolsOnly", _choice("IPPoolsOnly", "IPPoolsAndHostIPs"))
    KubeNodePortRanges: tuple[str, ...] = _p(("30000:32767",), _str_list)
    ServiceLoopPrevention: str = _p("Drop", _choice("Drop", "Reject", "Disabled"))
    WorkloadSourceSpoofing: str = _p("Disabled", _choice("Disabled", "Any"))
    FloatingIPs: str = _p("Disabled", _choice("Enabled", "Disabled"))
    AllowVXLANPacketsFromWorkloads: bool = _p(False, _bool)
    AllowIPIPPacketsFromWorkloads: bool = _p(False, _bool)
    ExternalNodesCIDRList: tuple[str, ...] = _p((), _str_list)
    FailsafeInboundHostPorts: tuple[ProtoPort, ...] = _p(_proto_ports(FAILSAFE_IN), _proto_ports)
    FailsafeOutboundHostPorts: tuple[ProtoPort, ...] = _p(_proto_ports(FAILSAFE_OUT), _proto_ports)
    # felixpy extension: dispatch-chain design ("Felix" = Felix's one-level prefix tree).
    DispatchChainMode: str = _p("Felix", _choice("Felix", "TwoLevel"))
    # IP sets.
    IpsetsRefreshInterval: float = _p(90.0, _float)
    MaxIpsetSize: int = _p(1048576, _int)
    # Routes and interfaces.
    RouteRefreshInterval: float = _p(90.0, _float)
    InterfaceRefreshInterval: float = _p(90.0, _float)
    InterfacePrefix: tuple[str, ...] = _p(("cali",), _str_list)
    InterfaceExclude: tuple[str, ...] = _p(("kube-ipvs0",), _str_list)
    DeviceRouteProtocol: int = _p(3, _int)
    DeviceRouteSourceAddress: str = _p("", _str)
    DeviceRouteSourceAddressIPv6: str = _p("", _str)
    RemoveExternalRoutes: bool = _p(True, _bool)
    RouteTableRanges: tuple[tuple[int, int], ...] = _p(((1, 250),), _route_table_ranges)
    RouteSyncDisabled: bool = _p(False, _bool)
    RouteSource: str = _ignored("CalicoIPAM", _choice("CalicoIPAM", "WorkloadIPs"),
                                "routes follow the calc graph's RouteUpdates; no workload-IP route source")
    ProgramClusterRoutes: str = _p("EnabledIPIPOnly", _choice("Enabled", "Disabled", "EnabledIPIPOnly", "EnabledNoEncapOnly"))
    IPv4NormalRoutePriority: int = _p(1024, _int)
    IPv6NormalRoutePriority: int = _p(1024, _int)
    IPv4ElevatedRoutePriority: int = _ignored(512, _int,
                                              "no live-migration route elevation")
    IPv6ElevatedRoutePriority: int = _ignored(512, _int,
                                              "no live-migration route elevation")
    IPForwarding: str = _p("Enabled", _choice("Enabled", "Disabled"), HONOURED,
                           "Enabled: ip_forward and IPv6 all/forwarding set to 1; Disabled: left as they are")
    NetlinkTimeoutSecs: float = _ignored(10.0, _float,
                                         "netlink calls use pyroute2's own timeouts")
    MTUIfacePattern: str = _p(r"^((en|wl|ww|sl|ib)[Pcopsvx].*|(eth|wlan|wwan).*)", _str, HONOURED,
                              "host MTU detection, Felix's MTU file")
    # Encapsulation.
    VXLANEnabled: bool | None = _p(None, _bool)
    IpInIpEnabled: bool | None = _p(None, _bool)
    VXLANPort: int = _p(4789, _port)
    VXLANVNI: int = _p(4096, _int)
    VXLANMTU: int = _p(0, _int)
    VXLANMTUV6: int = _p(0, _int)
    IpInIpMtu: int = _p(0, _int)
    IPv4VXLANTunnelAddr: str = _p("", _str)
    IPv6VXLANTunnelAddr: str = _p("", _str)
    VXLANTunnelMACAddr: str = _ignored("", _str,
                                       "the VXLAN device MAC comes from the VTEP updates")
    VXLANTunnelMACAddrV6: str = _ignored("", _str,
                                         "the VXLAN device MAC comes from the VTEP updates")
    IpInIpTunnelAddr: str = _p("", _str)
    WireguardEnabled: bool = _p(False, _bool)
    WireguardEnabledV6: bool = _p(False, _bool)
    WireguardListeningPort: int = _p(51820, _port)
    WireguardListeningPortV6: int = _p(51821, _port)
    WireguardRoutingRulePriority: int = _p(99, _int)
    WireguardInterfaceName: str = _p("wireguard.cali", _str)
    WireguardInterfaceNameV6: str = _p("wg-v6.cali", _str)
    WireguardMTU: int = _p(0, _int)
    WireguardMTUV6: int = _p(0, _int)
    WireguardHostEncryptionEnabled: bool = _p(False, _bool)
    WireguardPersistentKeepAlive: float = _ignored(0.0, _float,
                                                   "peers are programmed without a keep-alive")
    # XDP / L2.
    XDPEnabled: bool = _ignored(True, _bool,
                                "no XDP acceleration of untracked deny policies")
    GenericXDPEnabled: bool = _ignored(False, _bool,
                                       "no XDP acceleration of untracked deny policies")
    XDPRefreshInterval: float = _ignored(90.0, _float, "no XDP acceleration of untracked deny policies")
    LocalSubnetL2Reachability: str = _ignored("Disabled", _choice("Disabled", "Enabled"),
                                              "no proxy-neighbour manager")
    # Status, health, metrics, logging.
    EndpointReportingEnabled: bool = _p(False, _bool, HONOURED,
                                        "true (or a non-empty EndpointStatusPathPrefix): endpoint status is "
                                        "sent back on the feed; neither: it is not")
    EndpointReportingDelaySecs: float = _ignored(1.0, _float,
                                                 "status goes out after the apply that changed it")
    EndpointStatusPathPrefix: str = _p("/var/run/calico", _str, HONOURED,
                                       "non-empty: endpoint status goes back to Felix, whose file reporter "
                                       "writes the files (felixpy writes none itself)")
    ReportingIntervalSecs: float = _p(30.0, _float)
    ReportingTTLSecs: float = _ignored(90.0, _float,
                                       "a datastore TTL: Felix's concern, not the driver's", warn=False)
    HealthEnabled: bool = _p(False, _bool)
    HealthHost: str = _p("localhost", _str)
    HealthPort: int = _p(9099, _port)
    HealthTimeoutOverrides: str = _ignored("", _str,
                                           "health reporters keep their built-in timeouts")
    PrometheusMetricsEnabled: bool = _p(False, _bool)
    PrometheusMetricsHost: str = _p("", _str)
    PrometheusMetricsPort: int = _p(9091, _port)
    LogSeverityScreen: str = _p("INFO", _choice("DEBUG", "INFO", "WARNING", "ERROR", "FATAL", "CRITICAL", "PANIC"))
    FeatureDetectOverride: str = _p("", _str)
    FlowLogsGoldmaneServer: str = _p("", _str)
    FlowLogsLocalReporter: str = _p("Disabled", _choice("Enabled", "Disabled"))
    # BPF.
    BPFLogLevel: str = _ignored("off", _choice("off", "info", "debug"), _NO_BPF)
    BPFConntrackLogLevel: str = _ignored("off", _choice("off", "debug"), _NO_BPF)
    BPFDataIfacePattern: str = _p(r"^((en|wl|ww|sl|ib)[Popsx].*|(eth|wlan|wwan|bond).*)", _str, HONOURED,
                                  "in BPF mode: host endpoints attach to matching interfaces only")
    BPFAttachType: str = _p("Netkit", _choice("Netkit", "TCX", "TC"), HONOURED, _BPF_OPT_IN)
    BPFRedirectToPeer: str = _p("Enabled", _choice("Enabled", "Disabled", "L2Only"), HONOURED, _BPF_OPT_IN)
    BPFPolicyDebugEnabled: bool = _ignored(True, _bool, _NO_BPF)
    BPFMapSizeRoute: int = _p(262144, _int, HONOURED, _BPF_OPT_IN)
    BPFMapSizeConntrack: int = _p(512000, _int, HONOURED, _BPF_OPT_IN)
    BPFMapSizeIPSets: int = _p(1048576, _int, HONOURED, _BPF_OPT_IN)
    BPFMapSizeIfState: int = _p(1000, _int, HONOURED, _BPF_OPT_IN)
    BPFEnforceRPF: str = _p("Loose", _choice("Disabled", "Strict", "Loose"), HONOURED,
                            _BPF_OPT_IN + "; host endpoints: a new flow's source must route back out of the "
                            "interface it came in on (Strict) or out of any interface (Loose)")
    BPFHostConntrackBypass: bool = _p(False, _bool, HONOURED,
                                      _BPF_OPT_IN + "; raw cali-PREROUTING sends forwarded traffic to "
                                      "cali-untracked-flows, which NOTRACKs it unless it must stay in Linux "
                                      "conntrack (BPFForceTrackPacketsFromIfaces, link-local, the programs' "
                                      "SKIP_FIB, fall-through, MASQ and NAT-outgoing marks)")
    BPFForceTrackPacketsFromIfaces: tuple[str, ...] = _p(("docker+",), _iface_filters, HONOURED,
                                                         "with BPFHostConntrackBypass: traffic from these "
                                                         "interfaces (a trailing + is a prefix) stays tracked")
    BPFConntrackTimeouts: tuple[tuple[str, str], ...] = _p(
        _ct_timeouts(CT_TIMEOUTS_DEFAULT), _ct_timeouts, HONOURED,
        _BPF_OPT_IN + "; the userspace scanner (every 10 s); Auto reads net.netfilter's conntrack timeouts; "
        "CreationGracePeriod has no per-entry creation time to act on in the v4 map layout")
    # Informational (never trigger a restart).
    CalicoVersion: str = _ignored("", _str,
                                  "informational (usage reporting is Felix's)", warn=False)
    ClusterGUID: str = _ignored("", _str,
                                "informational (usage reporting is Felix's)", warn=False)
    ClusterType: str = _ignored("", _str,
                                "informational (usage reporting is Felix's)", warn=False)

    # -- derived views ---------------------------------------------------------------
    @property
    def hostname(self) -> str:
        """``FelixHostname``, defaulting to the machine's hostname as Felix does."""
        import socket

        return self.FelixHostname or socket.gethostname()

    @property
    def nftables_enabled(self) -> bool:
        """felixpy has no kube-proxy nft probe: Auto means iptables unless told otherwise."""
        return self.NFTablesMode == "Enabled"

    @property
    def mark_mask(self) -> int:
        return self.NftablesMarkMask if self.nftables_enabled else self.IptablesMarkMask

    @property
    def filter_allow_action(self) -> str:
        return self.NftablesFilterAllowAction if self.nftables_enabled else self.IptablesFilterAllowAction

    @property
    def mangle_allow_action(self) -> str:
        return self.NftablesMangleAllowAction if self.nftables_enabled else self.IptablesMangleAllowAction

    @property
    def filter_deny_action(self) -> str:
        return self.NftablesFilterDenyAction if self.nftables_enabled else self.IptablesFilterDenyAction

    @property
    def endpoint_status_wanted(self) -> bool:
        """Whether endpoint status goes back on the feed: Felix consumes it for its datastore reporter
        (``EndpointReportingEnabled``) and for its endpoint-status file reporter (a non-empty
        ``EndpointStatusPathPrefix``, the default); with neither, Felix would drop it."""
        return self.EndpointReportingEnabled or bool(self.EndpointStatusPathPrefix)

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)


# Felix's own parameters (felix/config/config_params.go) that the dataplane driver has no use for: how
# Felix reaches its datastore, logs, reports usage, tunes the Go runtime, debugs itself.  Set in calico-node's
# environment as a matter of course, so they are accepted silently (logged at debug).
FELIX_PROCESS_PARAMS = frozenset({
    "DatastoreType", "EtcdAddr", "EtcdScheme", "EtcdKeyFile", "EtcdCertFile", "EtcdCaFile", "EtcdEndpoints",
    "TyphaAddr", "TyphaK8sServiceName", "TyphaK8sNamespace", "TyphaReadTimeout", "TyphaWriteTimeout",
    "TyphaKeyFile", "TyphaCertFile", "TyphaCAFile", "TyphaCN", "TyphaURISAN",
    "LogFilePath", "LogSeverityFile", "LogSeveritySys", "LogDebugFilenameRegex",
    "UsageReportingEnabled", "UsageReportingInitialDelaySecs", "UsageReportingIntervalSecs",
    "PrometheusGoMetricsEnabled", "PrometheusProcessMetricsEnabled", "PrometheusMetricsCAFile",
    "PrometheusMetricsCertFile", "PrometheusMetricsKeyFile", "PrometheusMetricsClientAuth",
    "DebugMemoryProfilePath", "DebugCPUProfilePath", "DebugDisableLogDropping", "DebugSimulateCalcGraphHangAfter",
    "DebugSimulateDataplaneHangAfter", "DebugSimulateDataplaneApplyDelay", "DebugPanicAfter",
    "DebugSimulateDataRace", "DebugHost", "DebugPort", "DebugBPFCgroupV2", "CgroupV2Path",
    "GoGCThreshold", "GoMemoryLimitMB", "GoMaxProcs", "Variant", "FeatureGates", "PolicySyncPathPrefix",
    "MetadataAddr", "MetadataPort", "OpenstackRegion", "WindowsManageFirewallRules", "RequireMTUFile",
})
# Felix dataplane parameters felixpy has no equivalent for: accepted, ignored, and a warning when set.
FELIX_UNMODELLED_PARAMS = frozenset({
    "WireguardThreadingEnabled", "PrometheusWireGuardMetricsEnabled", "AWSSrcDstCheck", "RouteTableRange",
    "LiveMigrationRouteConvergenceTime", "SidecarAccelerationEnabled", "IstioAmbientMode", "IstioDSCPMark",
    "FlowLogsFlushInterval", "FlowLogsCollectorDebugTrace", "FlowLogsPolicyEvaluationMode",
    "BPFDisableUnprivileged", "BPFJITHardening", "BPFConntrackCleanupMode",
    "BPFLogFilters", "BPFCTLBLogFilter", "BPFL3IfacePattern", "BPFConnectTimeLoadBalancingEnabled",
    "BPFConnectTimeLoadBalancing", "BPFHostNetworkedNATWithoutCTLB", "BPFExternalServiceMode",
    "BPFDSROptoutCIDRs", "BPFKubeProxyIptablesCleanupEnabled", "BPFKubeProxyMinSyncPeriod",
    "BPFKubeProxyHealthzPort", "BPFExtToServiceConnmark", "BPFPSNATPorts", "BPFMapSizeNATFrontend",
    "BPFMapSizeNATBackend", "BPFMapSizeNATAffinity", "BPFMapSizePerCPUConntrack", "BPFMapSizeConntrackScaling",
    "BPFMapSizeConntrackCleanupQueue",
    "BPFDisableGROForIfaces", "BPFExcludeCIDRsFromNAT", "BPFExportBufferSizeMB", "BPFProfiling",
    "BPFMaglevMaxEndpointsPerService", "BPFMaglevMaxServices",
})


PARAM_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config))
_BY_LOWER = {n.lower(): n for n in PARAM_NAMES}
_FELIX_BY_LOWER = {n.lower(): n for n in FELIX_PROCESS_PARAMS | FELIX_UNMODELLED_PARAMS}
_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    param: str
    source: str
    raw: str
    error: str


def _apply_layer(values: dict[str, Any], raw_layer: Mapping[str, str], source: str,
                 problems: list[ConfigProblem], unknown: list[str] | None = None) -> None:
    for raw_name, raw in raw_layer.items():
        name = _BY_LOWER.get(raw_name.lower())
        if name is None:
            if unknown is not None:
                unknown.append(raw_name)
            continue  # Felix ignores parameters it doesn't know (other components use them).
        if not raw.strip():
            continue  # as Felix: an empty value is ignored ("none" is how to ask for the zero value)
        try:
            parse = _FIELDS[name].metadata["parse"]
            values[name] = _zero_value(name) if raw.strip().lower() == "none" else parse(raw)
        except (ValueError, TypeError) as exc:
            problems.append(ConfigProblem(name, source, raw, str(exc)))


def _zero_value(name: str) -> Any:
    """Felix's ``none``: the parameter's zero value (off, 0, empty), not its default."""
    f = _FIELDS[name]
    default: Any = f.default
    if default is None:
        return None
    if getattr(f.metadata["parse"], "choices", None) is not None:
        raise ValueError("cannot be none: it must be one of " + ", ".join(f.metadata["parse"].choices))
    return type(default)()


def closest_param(name: str) -> str | None:
    """The known parameter name closest to *name* (case-insensitive), if any is close."""
    found = difflib.get_close_matches(name.lower(), list(_BY_LOWER), n=1, cutoff=0.8)
    return _BY_LOWER[found[0]] if found else None


def env_layer(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k[6:]: v for k, v in environ.items() if k.upper().startswith("FELIX_")}


def file_layer(path: str) -> dict[str, str]:
    """The config file as Felix's ``LoadConfigFile`` reads it: an INI file whose every section's keys
    count (conventionally one ``[global]``), ``#``/``;`` comments, later keys winning.

    A missing file is no error (Felix logs and carries on); a malformed one raises
    :class:`ConfigError` naming the file and line.  Key case is kept.
    """
    parser = configparser.ConfigParser(interpolation=None, strict=False, default_section="\x00none",
                                       delimiters=("=",), comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment, method-assign]  # keep Felix's CamelCase
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        log.info("Ignoring absent config file", path=path)
        return {}
    try:
        parser.read_string(text, source=path)
    except configparser.MissingSectionHeaderError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: a key outside any section; Felix's config file needs a "
                          "section header such as [global]") from None
    except configparser.Error as exc:
        raise ConfigError(f"{path}: not a valid INI config file: {exc.message}") from None
    out: dict[str, str] = {}
    for section in parser.sections():
        for key, value in parser.items(section):
            if key in out:
                log.warning("Multiple values defined for a config file key; the last wins", path=path, key=key)
            out[key] = value
    return out


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_once(kind: str, what: str, **kw: Any) -> None:
    with _warned_lock:
        if (kind, what) in _warned:
            return
        _warned.add((kind, what))
    log.warning(kind, **kw)


def _report_unknown(names: list[str], source: str, prefix: str) -> None:
    for raw in names:
        felix_name = _FELIX_BY_LOWER.get(raw.lower())
        if felix_name in FELIX_PROCESS_PARAMS:
            log.debug("Felix process parameter; nothing for the dataplane driver to do", param=felix_name)
        elif felix_name is not None:
            _warn_once(f"{prefix}{raw} ({felix_name}) is a Felix parameter felixpy has no equivalent for; "
                       f"ignored", f"{source}:{raw}", param=f"{prefix}{raw}", source=source)
        else:
            guess = closest_param(raw)
            hint = f"; did you mean {guess}?" if guess else ""
            _warn_once(f"Unknown config parameter {prefix}{raw} in the {source}, ignored{hint}",
                       f"{source}:{raw}", param=f"{prefix}{raw}", source=source, closest=guess)


def _report_ignored(cfg: Config) -> None:
    for f in dataclasses.fields(cfg):
        if f.metadata["status"] != IGNORED or not f.metadata["warn"]:
            continue
        value = getattr(cfg, f.name)
        if value != f.default:
            _warn_once(f"{f.name} is set but felixpy does not implement it: {f.metadata['note']}",
                       f"{f.name}={value!r}", param=f.name, value=str(value))


def check_values(raw: Mapping[str, str]) -> tuple[list[ConfigProblem], list[tuple[str, str | None]]]:
    """Validate one layer without logging: its bad values, and its unknown names with the closest
    known parameter (``felixpy feed --check``)."""
    problems: list[ConfigProblem] = []
    unknown: list[str] = []
    _apply_layer({}, raw, "scenario", problems, unknown)
    return problems, [(n, closest_param(n)) for n in unknown if n.lower() not in _FELIX_BY_LOWER]


def load(datastore: Mapping[str, str] | None = None, *, config_file: str | None = None,
         environ: Mapping[str, str] | None = None) -> tuple[Config, list[ConfigProblem]]:
    """Resolve the layers into one Config; return it with every problem found.

    Warns (once per process each) about unknown ``FELIX_*`` variables and file keys, naming the
    closest known parameter, and about ignored parameters set to a non-default value.
    """
    values: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    _apply_layer(values, datastore or {}, "datastore", problems)
    if config_file:
        unknown_keys: list[str] = []
        _apply_layer(values, file_layer(config_file), "file", problems, unknown_keys)
        _report_unknown(unknown_keys, f"config file {config_file}", "")
    unknown_env: list[str] = []
    _apply_layer(values, env_layer(environ), "environment", problems, unknown_env)
    _report_unknown(unknown_env, "environment", "FELIX_")
    for p in problems:
        log.error("Bad config value, using the default", param=p.param, source=p.source, value=p.raw,
                  error=p.error)
    cfg = Config(**values)
    _report_ignored(cfg)
    return cfg, problems


def changed_params(old: Config, new: Config) -> list[str]:
    return [n for n in PARAM_NAMES if getattr(old, n) != getattr(new, n)]


def restart_needed(old: Config, new: Config) -> list[str]:
    """Names of changed parameters that need a restart (Felix restarts on all but a few)."""
    return [n for n in changed_params(old, new) if n not in NO_RESTART_PARAMS]
