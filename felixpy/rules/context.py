"""What every rendering function needs: config, family, marks and the derived actions.

:class:`RendererOptions` carries the inputs Felix learns at runtime rather than
from configuration parameters (the calc graph's ``Encapsulation`` message,
whether kube-proxy runs in IPVS mode, OpenStack special cases).
:class:`RenderContext` is built once per :class:`~felixpy.rules.RuleRenderer`
and passed to the pure functions in this package.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

from felixpy.config import Config
from felixpy.drivers.generictables.model import Accept, Action, Drop, Reject, Return, Rule
from felixpy.markbits import MarkBits
from felixpy.rules.ipset_names import main_ipset_name
from felixpy.rules.names import IPTABLES_MAX_CHAIN_NAME_LENGTH, NFTABLES_MAX_CHAIN_NAME_LENGTH

__all__ = ["BodyMemo", "RenderContext", "RendererOptions", "action_name"]

BODY_MEMO_SIZE = 1024


@dataclass(frozen=True, slots=True)
class RendererOptions:
    """Runtime inputs; ``None`` means "take it from Config" (or False if Config has no value)."""

    ipip_enabled: bool | None = None        # Encapsulation.ipip_enabled
    vxlan_enabled: bool | None = None       # Encapsulation.vxlan_enabled
    vxlan_enabled_v6: bool | None = None    # Encapsulation.vxlan_enabled_v6 (default False)
    kube_ipvs_support: bool = False         # kube-ipvs0 present (Felix probes at start)
    openstack_special_cases: bool = False
    openstack_metadata_ip: str = ""
    openstack_metadata_port: int = 8775
    flow_logs_enabled: bool | None = None   # default: FlowLogsGoldmaneServer set or local reporter on


def action_name(action: Action) -> str:
    """Felix's ``Action.String()`` used inside comments ("Drop", "Reject", "Accept", "Return")."""
    return type(action).__name__


class BodyMemo:
    """Bounded LRU of rendered rule tuples, keyed by *every* input of the rendering but the chain name.

    Rendering is pure given a :class:`RenderContext`, so endpoints with the same
    policies and profiles get the very same (immutable) rule tuple: the tables then
    hold one copy of each distinct body instead of one per endpoint (1,000 endpoints
    over 100 policy sets: ~24k rule objects per family become ~2.4k).  Eviction only
    costs sharing, never correctness.
    """

    __slots__ = ("_d", "maxsize")

    def __init__(self, maxsize: int = BODY_MEMO_SIZE) -> None:
        self._d: OrderedDict[Hashable, tuple[Rule, ...]] = OrderedDict()
        self.maxsize = maxsize

    def get(self, key: Hashable) -> tuple[Rule, ...] | None:
        rules = self._d.get(key)
        if rules is not None:
            self._d.move_to_end(key)
        return rules

    def put(self, key: Hashable, rules: tuple[Rule, ...]) -> None:
        self._d[key] = rules
        if len(self._d) > self.maxsize:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


@dataclass(frozen=True, slots=True)
class RenderContext:
    config: Config
    ip_version: int
    marks: MarkBits
    options: RendererOptions = field(default_factory=RendererOptions)
    # Not part of the context's value: a cache of what was rendered under it.
    bodies: BodyMemo = field(default_factory=BodyMemo, compare=False, hash=False, repr=False)

    # -- backend-level facts the rules layer itself depends on ------------------------
    @property
    def nftables(self) -> bool:
        return self.config.nftables_enabled

    @property
    def max_name_length(self) -> int:
        return NFTABLES_MAX_CHAIN_NAME_LENGTH if self.nftables else IPTABLES_MAX_CHAIN_NAME_LENGTH

    # -- encapsulation / features -------------------------------------------------------
    @property
    def ipip_enabled(self) -> bool:
        if self.options.ipip_enabled is not None:
            return self.options.ipip_enabled
        return bool(self.config.IpInIpEnabled)

    @property
    def vxlan_enabled(self) -> bool:
        if self.options.vxlan_enabled is not None:
            return self.options.vxlan_enabled
        return bool(self.config.VXLANEnabled)

    @property
    def vxlan_enabled_v6(self) -> bool:
        return bool(self.options.vxlan_enabled_v6)

    @property
    def vxlan_for_family(self) -> bool:
        return self.vxlan_enabled if self.ip_version == 4 else self.vxlan_enabled_v6

    @property
    def wireguard_any(self) -> bool:
        c = self.config
        return (c.WireguardEnabled and bool(c.WireguardInterfaceName)) or \
            (c.WireguardEnabledV6 and bool(c.WireguardInterfaceNameV6))

    @property
    def flow_logs(self) -> bool:
        if self.options.flow_logs_enabled is not None:
            return self.options.flow_logs_enabled
        return bool(self.config.FlowLogsGoldmaneServer) or self.config.FlowLogsLocalReporter == "Enabled"

    @property
    def workload_prefixes(self) -> tuple[str, ...]:
        return self.config.InterfacePrefix

    # -- configured actions -------------------------------------------------------------
    @property
    def filter_allow(self) -> Action:
        return Return() if self.config.filter_allow_action == "RETURN" else Accept()

    @property
    def mangle_allow(self) -> Action:
        return Return() if self.config.mangle_allow_action == "RETURN" else Accept()

    @property
    def deny(self) -> Action:
        """The filter deny action (``IptablesFilterDenyAction``/``NftablesFilterDenyAction``)."""
        return Reject() if self.config.filter_deny_action == "REJECT" else Drop()

    @property
    def deny_name(self) -> str:
        return action_name(self.deny)

    @property
    def input_accept(self) -> Action:
        """``DefaultEndpointToHostAction`` as an action (end of ``cali-wl-to-host``)."""
        a = self.config.DefaultEndpointToHostAction
        if a == "DROP":
            return Drop()
        if a == "ACCEPT":
            return Accept()
        return Return()

    @property
    def block_cidr(self) -> Action | None:
        slp = self.config.ServiceLoopPrevention
        if slp == "Drop":
            return Drop()
        if slp == "Reject":
            return Reject()
        return None

    def ipset(self, set_id: str) -> str:
        return main_ipset_name(set_id, self.ip_version)
