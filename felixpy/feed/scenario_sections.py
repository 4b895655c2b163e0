"""The object sections of a scenario: YAML items ↔ Felix update/remove payloads.

Each list section (``ipsets``, ``policies``, ``workloads``, …) is a
:class:`Section`: ``parse`` turns one YAML item into ``(key, update payload)``
and ``remove`` turns a reference (as written under a step's ``remove:``) into
``(key, remove payload)``.  Keys identify objects in :class:`ScenarioState`,
the simulated datastore that lets later items and steps check references
(IP sets named by rules, policies named by tiers, profiles named by
endpoints) and removals.

:data:`SECTIONS` lists the sections in dependency order (referenced objects
first); the batch builder in :mod:`felixpy.feed.scenario` parses in that order
and leaves wire ordering to Felix's flush order.  The single-mapping sections
(``config``, ``encapsulation``, ``global_bgp_config``) are handled there too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from felixpy.feed.protofill import (
    ScenarioError,
    as_list,
    check_keys,
    describe,
    expect_list,
    expect_mapping,
    expect_str,
    fields_of,
    fill,
    index_path,
    key_path,
)
from felixpy.feed.scenario_rules import parse_cidr, parse_rules
from felixpy.proto import felixbackend_pb2 as pb

POLICY_KINDS: Mapping[str, str] = {
    "gnp": "GlobalNetworkPolicy",
    "np": "NetworkPolicy",
    "knp": "KubernetesNetworkPolicy",
    "sgnp": "StagedGlobalNetworkPolicy",
    "snp": "StagedNetworkPolicy",
    "sknp": "StagedKubernetesNetworkPolicy",
    "anp": "KubernetesAdminNetworkPolicy",
    "banp": "KubernetesBaselineAdminNetworkPolicy",
}
NAMESPACED_KINDS = frozenset(
    {"NetworkPolicy", "KubernetesNetworkPolicy", "StagedNetworkPolicy", "StagedKubernetesNetworkPolicy"}
)
IPSET_TYPES: Mapping[str, pb.IPSetUpdate.IPSetType] = {
    "ip": pb.IPSetUpdate.IP,
    "net": pb.IPSetUpdate.NET,
    "ip_and_port": pb.IPSetUpdate.IP_AND_PORT,
}
TIER_DEFAULT_ACTIONS: Mapping[str, str] = {"deny": "Deny", "pass": "Pass"}
WORKLOAD_ID_DEFAULTS = {"orchestrator": "k8s", "endpoint": "eth0"}

Key = Hashable


@dataclass
class ScenarioState:
    """What the scenario has defined so far: section name → key → update payload."""

    config: dict[str, str] = field(default_factory=dict)
    objects: dict[str, dict[Key, Any]] = field(default_factory=dict)

    def of(self, section: str) -> dict[Key, Any]:
        return self.objects.setdefault(section, {})


ParseFn = Callable[[Mapping[str, Any], str, ScenarioState], tuple[Key, Message]]
RemoveFn = Callable[[Any, str, ScenarioState], tuple[Key, Message]]


@dataclass(frozen=True)
class Section:
    """One list section: how to parse an item and how to remove by reference."""

    name: str
    noun: str
    parse: ParseFn
    remove: RemoveFn | None


# --------------------------------------------------------------------------
# Small shared helpers.
# --------------------------------------------------------------------------


def _required(data: Mapping[str, Any], key: str, path: str) -> str:
    if key not in data:
        raise ScenarioError(key_path(path, key), "required")
    return expect_str(data[key], key_path(path, key))


def _unknown(noun: str, ref: Any, path: str) -> ScenarioError:
    return ScenarioError(path, f"unknown {noun} {describe(ref)}")


def _existing(state: ScenarioState, section: str, key: Key, noun: str, ref: Any, path: str) -> Key:
    if key not in state.of(section):
        raise _unknown(noun, ref, path)
    return key


def _addresses(value: Any, path: str, version: int | None, *, cidr: bool) -> list[str]:
    """Validate (and canonicalise) a list of CIDRs or plain addresses of one family."""
    result = []
    for i, item in enumerate(as_list(value, path)):
        item_path = index_path(path, i)
        text = parse_cidr(item, item_path) if cidr else _address(item, item_path)
        if version is not None and ipaddress.ip_network(text).version != version:
            raise ScenarioError(item_path, f"{text} is not an IPv{version} {'CIDR' if cidr else 'address'}")
        result.append(text)
    return result


def _address(value: Any, path: str) -> str:
    try:
        return str(ipaddress.ip_address(value if isinstance(value, str) else ""))
    except ValueError:
        raise ScenarioError(path, f"bad IP address {describe(value)}") from None


def _namespaced_ref(ref: Any, path: str) -> tuple[str, str]:
    """``"ns/name"`` or ``{namespace, name}`` → (namespace, name)."""
    if isinstance(ref, str) and ref.count("/") == 1 and all(ref.split("/")):
        namespace, name = ref.split("/")
        return namespace, name
    if isinstance(ref, Mapping):
        check_keys(ref, ("namespace", "name"), path)
        return _required(ref, "namespace", path), _required(ref, "name", path)
    raise ScenarioError(path, f"bad reference {describe(ref)}; expected 'namespace/name'")


# --------------------------------------------------------------------------
# IP sets.
# --------------------------------------------------------------------------


def _parse_ipset(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    check_keys(data, ("id", "type", "members"), path)
    ipset_id = _required(data, "id", path)
    type_name = data.get("type", "net")
    if not isinstance(type_name, str) or type_name.lower() not in IPSET_TYPES:
        raise ScenarioError(
            key_path(path, "type"), f"bad IP set type {describe(type_name)}; expected ip, net or ip_and_port"
        )
    members_path = key_path(path, "members")
    members = [
        expect_str(m, index_path(members_path, i)) for i, m in enumerate(as_list(data.get("members"), members_path))
    ]
    return ipset_id, pb.IPSetUpdate(id=ipset_id, type=IPSET_TYPES[type_name.lower()], members=members)


def _remove_ipset(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
    ipset_id = expect_str(ref, path)
    return _existing(state, "ipsets", ipset_id, "IP set", ref, path), pb.IPSetRemove(id=ipset_id)


def _parse_ipset_delta(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    delta = pb.IPSetDeltaUpdate()
    fill(delta, data, path)
    if not delta.id:
        raise ScenarioError(key_path(path, "id"), "required")
    _existing(state, "ipsets", delta.id, "IP set", delta.id, key_path(path, "id"))
    return delta.id, delta


# --------------------------------------------------------------------------
# Policies, profiles and tiers.
# --------------------------------------------------------------------------


def policy_kind(value: Any, path: str) -> str:
    """A kind shorthand (gnp, np, knp, …) or full kind name → the full kind name."""
    if isinstance(value, str):
        if value.lower() in POLICY_KINDS:
            return POLICY_KINDS[value.lower()]
        if value in POLICY_KINDS.values():
            return value
    choices = ", ".join(POLICY_KINDS)
    raise ScenarioError(path, f"bad policy kind {describe(value)}; expected one of: {choices} (or the full kind name)")


def _policy_id(data: Mapping[str, Any], path: str) -> pb.PolicyID:
    name = _required(data, "name", path)
    kind = policy_kind(data.get("kind", "gnp"), key_path(path, "kind"))
    namespace = expect_str(data["namespace"], key_path(path, "namespace")) if "namespace" in data else ""
    if kind in NAMESPACED_KINDS and not namespace:
        raise ScenarioError(key_path(path, "namespace"), f"required for kind {kind}")
    if namespace and kind not in NAMESPACED_KINDS:
        raise ScenarioError(key_path(path, "namespace"), f"not allowed for kind {kind}")
    return pb.PolicyID(name=name, namespace=namespace, kind=kind)


def _policy_key(pid: pb.PolicyID) -> Key:
    return (pid.kind, pid.namespace, pid.name)


def _ipset_checker(state: ScenarioState) -> Callable[[str], bool]:
    return lambda ipset_id: ipset_id in state.of("ipsets")


def _parse_policy(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    pid = _policy_id(data, path)
    policy = pb.Policy(namespace=pid.namespace)
    handled = ("name", "kind", "namespace", "tier", "inbound", "outbound")
    fill(policy, data, path, exclude=("inbound_rules", "outbound_rules"), also_allowed=handled)
    policy.tier = expect_str(data.get("tier", "default"), key_path(path, "tier"))
    if policy.untracked and policy.pre_dnat:
        raise ScenarioError(path, "a policy cannot be both untracked and pre_dnat")
    owner = f"policy {pid.kind}/{pid.namespace}/{pid.name}"
    _add_rules(policy, data, path, owner, state)
    return _policy_key(pid), pb.ActivePolicyUpdate(id=pid, policy=policy)


def _add_rules(
    target: pb.Policy | pb.Profile, data: Mapping[str, Any], path: str, owner: str, state: ScenarioState
) -> None:
    for key, rules in (("inbound", target.inbound_rules), ("outbound", target.outbound_rules)):
        if key in data:
            rules.extend(parse_rules(data[key], key_path(path, key), f"{owner} {key}", _ipset_checker(state)))


def resolve_policy(ref: Any, path: str, state: ScenarioState) -> pb.PolicyID:
    """``"name"``, ``"namespace/name"`` or ``{name, namespace, kind}`` → a known PolicyID."""
    if isinstance(ref, Mapping):
        check_keys(ref, ("name", "namespace", "kind"), path)
        wanted_kind = policy_kind(ref["kind"], key_path(path, "kind")) if "kind" in ref else None
        namespace = expect_str(ref["namespace"], key_path(path, "namespace")) if "namespace" in ref else None
        name = _required(ref, "name", path)
    elif isinstance(ref, str) and ref:
        wanted_kind = None
        namespace, _, name = ref.rpartition("/") if "/" in ref else (None, "", ref)
    else:
        raise ScenarioError(path, f"bad policy reference {describe(ref)}")
    matches = [
        pid
        for pid in (update.id for update in state.of("policies").values())
        if pid.name == name
        and (namespace is None or pid.namespace == namespace)
        and (wanted_kind is None or pid.kind == wanted_kind)
    ]
    if not matches:
        raise _unknown("policy", ref, path)
    if len(matches) > 1:
        found = ", ".join(f"{p.kind} {p.namespace + '/' if p.namespace else ''}{p.name}" for p in matches)
        raise ScenarioError(path, f"ambiguous policy {describe(ref)} matches {found}; add namespace or kind")
    return pb.PolicyID(name=matches[0].name, namespace=matches[0].namespace, kind=matches[0].kind)


def _remove_policy(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
    pid = resolve_policy(ref, path, state)
    return _policy_key(pid), pb.ActivePolicyRemove(id=pid)


def _parse_profile(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    check_keys(data, ("name", "inbound", "outbound"), path)
    name = _required(data, "name", path)
    profile = pb.Profile()
    _add_rules(profile, data, path, f"profile {name}", state)
    return name, pb.ActiveProfileUpdate(id=pb.ProfileID(name=name), profile=profile)


def _remove_profile(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
    name = expect_str(ref, path)
    _existing(state, "profiles", name, "profile", ref, path)
    return name, pb.ActiveProfileRemove(id=pb.ProfileID(name=name))


def parse_tiers(value: Any, path: str, state: ScenarioState) -> list[pb.TierInfo]:
    """``[{name, ingress: [policy refs], egress: [...], default_action}]`` → TierInfos."""
    tiers = []
    for i, item in enumerate(expect_list(value, path)):
        item_path = index_path(path, i)
        data = expect_mapping(item, item_path)
        check_keys(data, ("name", "ingress", "egress", "default_action"), item_path)
        tier = pb.TierInfo(name=_required(data, "name", item_path))
        tier.default_action = _tier_default_action(
            data.get("default_action", "Deny"), key_path(item_path, "default_action")
        )
        for key, target in (("ingress", tier.ingress_policies), ("egress", tier.egress_policies)):
            refs_path = key_path(item_path, key)
            for j, ref in enumerate(as_list(data.get(key), refs_path)):
                target.append(resolve_policy(ref, index_path(refs_path, j), state))
        tiers.append(tier)
    return tiers


def _tier_default_action(value: Any, path: str) -> str:
    if not isinstance(value, str) or value.lower() not in TIER_DEFAULT_ACTIONS:
        raise ScenarioError(path, f"bad default_action {describe(value)}; expected Deny or Pass")
    return TIER_DEFAULT_ACTIONS[value.lower()]


def _profile_ids(value: Any, path: str, state: ScenarioState) -> list[str]:
    ids = []
    for i, ref in enumerate(as_list(value, path)):
        item_path = index_path(path, i)
        name = expect_str(ref, item_path)
        _existing(state, "profiles", name, "profile", ref, item_path)
        ids.append(name)
    return ids


# --------------------------------------------------------------------------
# Endpoints.
# --------------------------------------------------------------------------


def _workload_id(value: Any, path: str, name: str | None) -> pb.WorkloadEndpointID:
    data = expect_mapping(value, path)
    check_keys(data, ("orchestrator", "workload", "endpoint"), path)
    if "workload" not in data and name is None:
        raise ScenarioError(key_path(path, "workload"), "required")
    defaults = {**WORKLOAD_ID_DEFAULTS, "workload": f"default/{name}"}
    parts = {key: expect_str(data.get(key, defaults[key]), key_path(path, key)) for key in defaults}
    return pb.WorkloadEndpointID(
        orchestrator_id=parts["orchestrator"], workload_id=parts["workload"], endpoint_id=parts["endpoint"]
    )


def _wep_key(wid: pb.WorkloadEndpointID) -> Key:
    return (wid.orchestrator_id, wid.workload_id, wid.endpoint_id)


_WEP_HANDLED = ("id", "name", "state", "ipv4_nets", "ipv6_nets", "profile_ids", "tiers")


def _parse_workload(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    name = _required(data, "name", path)
    wid = _workload_id(data.get("id", {}), key_path(path, "id"), name)
    ep = pb.WorkloadEndpoint(name=name)
    fill(ep, data, path, also_allowed=_WEP_HANDLED)
    ep.state = expect_str(data.get("state", "active"), key_path(path, "state"))
    ep.ipv4_nets.extend(_addresses(data.get("ipv4_nets"), key_path(path, "ipv4_nets"), 4, cidr=True))
    ep.ipv6_nets.extend(_addresses(data.get("ipv6_nets"), key_path(path, "ipv6_nets"), 6, cidr=True))
    ep.profile_ids.extend(_profile_ids(data.get("profile_ids"), key_path(path, "profile_ids"), state))
    if "tiers" in data:
        ep.tiers.extend(parse_tiers(data["tiers"], key_path(path, "tiers"), state))
    for other_key, other in state.of("workloads").items():
        if other.endpoint.name == name and other_key != _wep_key(wid):
            raise ScenarioError(key_path(path, "name"), f"interface {name!r} already belongs to workload {other_key}")
    return _wep_key(wid), pb.WorkloadEndpointUpdate(id=wid, endpoint=ep)


def _remove_workload(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
    """By interface name (``cali-wl-a``) or by id mapping (defaults as for updates)."""
    if isinstance(ref, str):
        for key, update in state.of("workloads").items():
            if update.endpoint.name == ref:
                return key, pb.WorkloadEndpointRemove(id=update.id)
        raise _unknown("workload", ref, path)
    wid = _workload_id(ref, path, None)
    key = _existing(state, "workloads", _wep_key(wid), "workload", ref, path)
    return key, pb.WorkloadEndpointRemove(id=wid)


_HEP_TIER_KEYS = ("tiers", "untracked_tiers", "pre_dnat_tiers", "forward_tiers")


def _parse_host_endpoint(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    # A HEP chosen by its expected IPs names no interface (it then needs an id).
    if "name" in data or not (data.get("expected_ipv4_addrs") or data.get("expected_ipv6_addrs")):
        name = _required(data, "name", path)
        hep_id = expect_str(data.get("id", name), key_path(path, "id"))
    else:
        name = ""
        hep_id = _required(data, "id", path)
    handled = ("id", "name", "profile_ids", "expected_ipv4_addrs", "expected_ipv6_addrs") + _HEP_TIER_KEYS
    ep = pb.HostEndpoint(name=name)
    fill(ep, data, path, also_allowed=handled)
    ep.profile_ids.extend(_profile_ids(data.get("profile_ids"), key_path(path, "profile_ids"), state))
    for key, version in (("expected_ipv4_addrs", 4), ("expected_ipv6_addrs", 6)):
        getattr(ep, key).extend(_addresses(data.get(key), key_path(path, key), version, cidr=False))
    for key in _HEP_TIER_KEYS:
        if key in data:
            getattr(ep, key).extend(parse_tiers(data[key], key_path(path, key), state))
    hep = pb.HostEndpointID(endpoint_id=hep_id)
    return hep_id, pb.HostEndpointUpdate(id=hep, endpoint=ep)


def _remove_host_endpoint(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
    hep_id = expect_str(ref, path)
    _existing(state, "host_endpoints", hep_id, "host endpoint", ref, path)
    return hep_id, pb.HostEndpointRemove(id=pb.HostEndpointID(endpoint_id=hep_id))


# --------------------------------------------------------------------------
# Routes, VTEPs, pools, hosts, WireGuard.
# --------------------------------------------------------------------------


def route_types(value: Any, path: str) -> int:
    """A route type name or list of names → the RouteType bitmap."""
    bits = 0
    for i, item in enumerate(as_list(value, path)):
        number = pb.RouteType.DESCRIPTOR.values_by_name.get(item.upper()) if isinstance(item, str) else None
        if number is None:
            choices = ", ".join(v.name.lower() for v in pb.RouteType.DESCRIPTOR.values)
            raise ScenarioError(index_path(path, i), f"bad route type {describe(item)}; expected one of: {choices}")
        bits |= number.number
    return bits


def tunnel_type(value: Any, path: str) -> pb.TunnelType:
    """``vxlan``, ``[ipip, wireguard]`` or ``{vxlan: true}`` → TunnelType."""
    result = pb.TunnelType()
    if isinstance(value, Mapping):
        fill(result, expect_mapping(value, path), path)
        return result
    names = set(fields_of(result))
    for i, item in enumerate(as_list(value, path)):
        if not isinstance(item, str) or item.lower() not in names:
            raise ScenarioError(
                index_path(path, i), f"bad tunnel type {describe(item)}; expected one of: {', '.join(sorted(names))}"
            )
        setattr(result, item.lower(), True)
    return result


def _parse_route(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    dst = parse_cidr(data.get("dst"), key_path(path, "dst")) if "dst" in data else None
    if dst is None:
        raise ScenarioError(key_path(path, "dst"), "required")
    route = pb.RouteUpdate(dst=dst)
    fill(route, data, path, also_allowed=("dst", "types", "tunnel_type"))
    # RouteUpdate.types is declared as the RouteType enum but carries an OR of RouteType flags (as
    # Felix sends it); the generated stub cannot express a bitmap, so the int is assigned as is.
    route.types = route_types(data.get("types"), key_path(path, "types"))  # type: ignore[assignment]
    if "tunnel_type" in data:
        route.tunnel_type.CopyFrom(tunnel_type(data["tunnel_type"], key_path(path, "tunnel_type")))
    return dst, route


def _remove_route(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
    dst = parse_cidr(ref, path)
    return _existing(state, "routes", dst, "route", ref, path), pb.RouteRemove(dst=dst)


def _keyed_parser(message: type[Message], key_field: str) -> ParseFn:
    """A parser for sections whose payload is filled as is and keyed by one field."""

    def parse(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
        _required(data, key_field, path)
        msg = message()
        fill(msg, data, path)
        return getattr(msg, key_field), msg

    return parse


def _keyed_remover(section: str, noun: str, make: Callable[[str, ScenarioState], Message]) -> RemoveFn:
    def remove(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
        key = expect_str(ref, path)
        _existing(state, section, key, noun, ref, path)
        return key, make(key, state)

    return remove


def _parse_pool(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    cidr = parse_cidr(data.get("cidr"), key_path(path, "cidr")) if "cidr" in data else None
    if cidr is None:
        raise ScenarioError(key_path(path, "cidr"), "required")
    pool_id = expect_str(data.get("id", cidr.replace("/", "-")), key_path(path, "id"))
    pool = pb.IPAMPool(cidr=cidr)
    fill(pool, data, path, also_allowed=("id", "cidr"))
    return pool_id, pb.IPAMPoolUpdate(id=pool_id, pool=pool)


def _remove_pool(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
    """By pool id or by CIDR."""
    text = expect_str(ref, path)
    pools = state.of("ipam_pools")
    for pool_id, update in pools.items():
        if text in (pool_id, update.pool.cidr):
            return pool_id, pb.IPAMPoolRemove(id=str(pool_id))
    raise _unknown("IPAM pool", ref, path)


def _host_metadata_remove(hostname: str, state: ScenarioState) -> Message:
    known = state.of("host_metadata")[hostname]
    return pb.HostMetadataRemove(hostname=hostname, ipv4_addr=known.ipv4_addr)


# --------------------------------------------------------------------------
# Namespaces, service accounts, services.
# --------------------------------------------------------------------------


def _parse_namespace(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    name = _required(data, "name", path)
    msg = pb.NamespaceUpdate(id=pb.NamespaceID(name=name))
    fill(msg, data, path, exclude=("id",), also_allowed=("name",))
    return name, msg


def _parse_service_account(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    sa_id = pb.ServiceAccountID(namespace=_required(data, "namespace", path), name=_required(data, "name", path))
    msg = pb.ServiceAccountUpdate(id=sa_id)
    fill(msg, data, path, exclude=("id",), also_allowed=("namespace", "name"))
    return (sa_id.namespace, sa_id.name), msg


def _remove_service_account(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
    namespace, name = key = _namespaced_ref(ref, path)
    _existing(state, "service_accounts", key, "service account", ref, path)
    return key, pb.ServiceAccountRemove(id=pb.ServiceAccountID(namespace=namespace, name=name))


def _parse_service(data: Mapping[str, Any], path: str, state: ScenarioState) -> tuple[Key, Message]:
    _required(data, "namespace", path)
    _required(data, "name", path)
    msg = pb.ServiceUpdate()
    fill(msg, data, path)
    return (msg.namespace, msg.name), msg


def _remove_service(ref: Any, path: str, state: ScenarioState) -> tuple[Key, Message]:
    namespace, name = key = _namespaced_ref(ref, path)
    _existing(state, "services", key, "service", ref, path)
    return key, pb.ServiceRemove(namespace=namespace, name=name)


# --------------------------------------------------------------------------
# The registry, in dependency order.
# --------------------------------------------------------------------------

SECTIONS: tuple[Section, ...] = (
    Section("ipsets", "IP set", _parse_ipset, _remove_ipset),
    Section("ipset_deltas", "IP set delta", _parse_ipset_delta, None),
    Section("policies", "policy", _parse_policy, _remove_policy),
    Section("profiles", "profile", _parse_profile, _remove_profile),
    Section("workloads", "workload", _parse_workload, _remove_workload),
    Section("host_endpoints", "host endpoint", _parse_host_endpoint, _remove_host_endpoint),
    Section("service_accounts", "service account", _parse_service_account, _remove_service_account),
    Section(
        "namespaces",
        "namespace",
        _parse_namespace,
        _keyed_remover("namespaces", "namespace", lambda k, s: pb.NamespaceRemove(id=pb.NamespaceID(name=k))),
    ),
    Section(
        "vteps",
        "VTEP",
        _keyed_parser(pb.VXLANTunnelEndpointUpdate, "node"),
        _keyed_remover("vteps", "VTEP", lambda k, s: pb.VXLANTunnelEndpointRemove(node=k)),
    ),
    Section("routes", "route", _parse_route, _remove_route),
    Section(
        "wireguard_endpoints",
        "WireGuard endpoint",
        _keyed_parser(pb.WireguardEndpointUpdate, "hostname"),
        _keyed_remover(
            "wireguard_endpoints", "WireGuard endpoint", lambda k, s: pb.WireguardEndpointRemove(hostname=k)
        ),
    ),
    Section(
        "wireguard_endpoints_v6",
        "WireGuard IPv6 endpoint",
        _keyed_parser(pb.WireguardEndpointV6Update, "hostname"),
        _keyed_remover(
            "wireguard_endpoints_v6", "WireGuard IPv6 endpoint", lambda k, s: pb.WireguardEndpointV6Remove(hostname=k)
        ),
    ),
    Section(
        "host_metadata",
        "host",
        _keyed_parser(pb.HostMetadataUpdate, "hostname"),
        _keyed_remover("host_metadata", "host", _host_metadata_remove),
    ),
    Section("ipam_pools", "IPAM pool", _parse_pool, _remove_pool),
    Section("services", "service", _parse_service, _remove_service),
)

SECTIONS_BY_NAME: Mapping[str, Section] = {s.name: s for s in SECTIONS}
