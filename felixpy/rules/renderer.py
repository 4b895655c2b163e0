"""The :class:`RuleRenderer` facade the managers use (one per IP family)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from felixpy import markbits
from felixpy.config import Config
from felixpy.drivers.generictables.model import Action, Chain, Rule
from felixpy.drivers.generictables.table import MapMetadata
from felixpy.rules import dispatch, endpoints, groups, nat, policy, static
from felixpy.rules.context import RenderContext, RendererOptions
from felixpy.rules.epmark import EndpointMarkMapper
from felixpy.rules.groups import PolicyGroup, TierPolicyGroups
from felixpy.rules.names import PolicyID, ProfileID

if TYPE_CHECKING:
    from felixpy.proto import felixbackend_pb2 as pb

__all__ = ["RuleRenderer"]


class RuleRenderer:
    """Pure renderer: proto messages and config in, :class:`Chain`/:class:`Rule` values out.

    ``RuleRenderer(config, 4)`` allocates mark bits from ``config.mark_mask`` (raising
    :class:`~felixpy.errors.ConfigError` if the mask is too small) unless ``marks`` is given.
    """

    def __init__(self, config: Config, ip_version: int, *, marks: markbits.MarkBits | None = None,
                 options: RendererOptions | None = None) -> None:
        if ip_version not in (4, 6):
            raise ValueError(f"ip_version must be 4 or 6, not {ip_version!r}")
        options = options or RendererOptions()
        if marks is None:
            marks = markbits.from_config(config, need_endpoint_bits=options.kube_ipvs_support)
        self.ctx = RenderContext(config=config, ip_version=ip_version, marks=marks, options=options)

    # -- properties ---------------------------------------------------------------------
    @property
    def ip_version(self) -> int:
        return self.ctx.ip_version

    @property
    def marks(self) -> markbits.MarkBits:
        return self.ctx.marks

    @property
    def max_name_length(self) -> int:
        return self.ctx.max_name_length

    def new_endpoint_mark_mapper(self) -> EndpointMarkMapper:
        """For IPVS support: the mapper over this renderer's endpoint-mark block."""
        return EndpointMarkMapper(self.marks.endpoint, self.marks.non_calico_endpoint)

    # -- static chains and kernel hooks -------------------------------------------------
    def static_chains(self, table: str) -> list[Chain]:
        return static.static_chains(self.ctx, table)

    def kernel_hooks(self) -> list[static.KernelHook]:
        return static.kernel_hooks(self.ctx)

    def filter_forward_append_rules(self) -> tuple[Rule, ...]:
        return static.filter_forward_append_rules(self.ctx)

    def rpf_skip_chain(self, spoofing: Mapping[str, Sequence[str]]) -> Chain:
        return static.rpf_skip_chain(self.ctx, spoofing)

    def egress_dscp_chain(self, rules: Sequence[tuple[str, int]]) -> Chain:
        return static.egress_dscp_chain(rules)

    def nat_outgoing_chain(self, active: bool) -> Chain:
        return nat.nat_outgoing_chain(self.ctx, active)

    def fip_dnat_chain(self, dnats: Mapping[str, str]) -> Chain:
        return nat.fip_dnat_chain(dnats)

    def fip_snat_chain(self, snats: Mapping[str, str]) -> Chain:
        return nat.fip_snat_chain(snats)

    def cidr_block_chain(self, cidrs: Iterable[str]) -> Chain:
        return nat.cidr_block_chain(self.ctx, cidrs)

    # -- dispatch -----------------------------------------------------------------------
    def workload_dispatch_chains(self, iface_names: Iterable[str]) -> list[Chain]:
        return dispatch.workload_dispatch_chains(self.ctx, iface_names)

    def workload_dispatch_maps(self, iface_names: Iterable[str]) -> list[tuple[MapMetadata, dict[str, Action]]]:
        return dispatch.workload_dispatch_maps(self.ctx, iface_names)

    def host_dispatch_chains(self, iface_names: Iterable[str], default_iface: str = "",
                             apply_on_forward: bool = False) -> list[Chain]:
        return dispatch.host_dispatch_chains(self.ctx, iface_names, default_iface, apply_on_forward)

    def from_host_dispatch_chains(self, iface_names: Iterable[str], default_iface: str = "") -> list[Chain]:
        return dispatch.from_host_dispatch_chains(self.ctx, iface_names, default_iface)

    def to_host_dispatch_chains(self, iface_names: Iterable[str], default_iface: str = "") -> list[Chain]:
        return dispatch.to_host_dispatch_chains(self.ctx, iface_names, default_iface)

    def endpoint_mark_dispatch_chains(self, mapper: EndpointMarkMapper, workload_ifaces: Iterable[str],
                                      host_ifaces: Iterable[str]) -> list[Chain]:
        return dispatch.endpoint_mark_dispatch_chains(self.ctx, mapper, workload_ifaces, host_ifaces)

    # -- endpoint chains ----------------------------------------------------------------
    def workload_endpoint_chains(self, endpoint: pb.WorkloadEndpoint, tiers: Sequence[TierPolicyGroups],
                                 mark_mapper: EndpointMarkMapper | None = None) -> list[Chain]:
        """``cali-tw-``/``cali-fw-`` (+``cali-sm-`` with IPVS) for a proto WorkloadEndpoint."""
        qos = endpoint.qos_controls if endpoint.HasField("qos_controls") else None
        return endpoints.workload_endpoint_chains(self.ctx, endpoint.name, admin_up=endpoint.state == "active",
                                                  tiers=tiers, profile_ids=list(endpoint.profile_ids), qos=qos,
                                                  mark_mapper=mark_mapper)

    def host_endpoint_filter_chains(self, iface: str, tiers: Sequence[TierPolicyGroups],
                                    forward_tiers: Sequence[TierPolicyGroups], profile_ids: Sequence[str],
                                    mark_mapper: EndpointMarkMapper | None = None) -> list[Chain]:
        return endpoints.host_endpoint_filter_chains(self.ctx, iface, tiers=tiers, forward_tiers=forward_tiers,
                                                     profile_ids=profile_ids, mark_mapper=mark_mapper)

    def host_endpoint_mangle_egress_chains(self, iface: str, tiers: Sequence[TierPolicyGroups],
                                           profile_ids: Sequence[str]) -> list[Chain]:
        return endpoints.host_endpoint_mangle_egress_chains(self.ctx, iface, tiers=tiers, profile_ids=profile_ids)

    def host_endpoint_raw_chains(self, iface: str, untracked_tiers: Sequence[TierPolicyGroups]) -> list[Chain]:
        return endpoints.host_endpoint_raw_chains(self.ctx, iface, untracked_tiers=untracked_tiers)

    def host_endpoint_raw_egress_chain(self, iface: str, untracked_tiers: Sequence[TierPolicyGroups]) -> Chain:
        """BPF mode: ``cali-th-<iface>`` only (untracked ingress is the XDP program's)."""
        return endpoints.host_endpoint_raw_egress_chain(self.ctx, iface, untracked_tiers=untracked_tiers)

    def host_endpoint_mangle_ingress_chains(self, iface: str, pre_dnat_tiers: Sequence[TierPolicyGroups]
                                            ) -> list[Chain]:
        return endpoints.host_endpoint_mangle_ingress_chains(self.ctx, iface, pre_dnat_tiers=pre_dnat_tiers)

    # -- policies, profiles, groups -----------------------------------------------------
    def policy_chains(self, policy_id: PolicyID | pb.PolicyID, pol: pb.Policy) -> list[Chain]:
        """``cali-pi-``/``cali-po-`` for a policy; [] for staged kinds."""
        pid = policy_id if isinstance(policy_id, PolicyID) else PolicyID.from_proto(policy_id)
        return policy.policy_chains(self.ctx, pid, pol)

    def profile_chains(self, profile_id: ProfileID | pb.ProfileID | str, profile: pb.Profile) -> tuple[Chain, Chain]:
        if isinstance(profile_id, str):
            pid = ProfileID(profile_id)
        elif isinstance(profile_id, ProfileID):
            pid = profile_id
        else:
            pid = ProfileID.from_proto(profile_id)
        return policy.profile_chains(self.ctx, pid, profile)

    def policy_group_chain(self, group: PolicyGroup) -> Chain:
        return groups.policy_group_chain(self.ctx, group)

    def proto_rule_to_rules(self, rule: pb.Rule, *, owner: str, direction: str, index: int,
                            ident: PolicyID | ProfileID, tier: str = "", untracked: bool = False) -> list[Rule]:
        return policy.render_proto_rule(self.ctx, rule, owner=owner, direction=direction, index=index, ident=ident,
                                        tier=tier, untracked=untracked)
