"""Scenario feed: valid YAML → the ordered ToDataplane stream (errors: test_scenario_errors.py)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from felixpy.feed import scenario as sc
from felixpy.feed.scenario import Scenario, ScenarioError, load_scenario, parse_scenario, scenario_from_dict
from felixpy.messages import payload_of
from felixpy.proto import felixbackend_pb2 as pb


def parse(text: str, start_seq: int = 0) -> Scenario:
    return parse_scenario(textwrap.dedent(text), start_seq)


def kinds(msgs: Any) -> list[str]:
    return [payload_of(m)[0] for m in msgs]


def payloads(msgs: Any, kind: str) -> list[Any]:
    return [p for k, p in map(payload_of, msgs) if k == kind]


def only(msgs: Any, kind: str) -> Any:
    (found,) = payloads(msgs, kind)
    return found


BASE = """
ipsets:
  - {id: s:a, members: [10.0.0.1/32]}
  - {id: s:b, type: ip, members: [10.0.0.2]}
profiles:
  - {name: kns.default, inbound: [{action: allow}], outbound: [{action: allow}]}
policies:
  - {name: p1, inbound: [{action: allow}]}
"""


def parse_with_base(text: str) -> Scenario:
    return parse(BASE + textwrap.dedent(text))


# --------------------------------------------------------------------------
# The bundled demo.
# --------------------------------------------------------------------------


def test_demo_scenario() -> None:
    demo = load_scenario(sc.bundled_scenario_path("demo"))

    assert kinds(demo.initial) == [
        "config_update",
        "ipset_update",
        "active_policy_update",
        "active_profile_update",
        "workload_endpoint_update",
        "workload_endpoint_update",
        "workload_endpoint_update",
        "in_sync",
    ]
    assert [m.sequence_number for m in demo.all_messages()] == list(range(10))
    weps = {w.endpoint.name: w for w in payloads(demo.initial, "workload_endpoint_update")}
    assert sorted(weps) == ["cali-wl-a", "cali-wl-b", "cali-wl-c"]
    for i, name in enumerate(["cali-wl-a", "cali-wl-b", "cali-wl-c"], start=2):
        assert list(weps[name].endpoint.ipv4_nets) == [f"10.65.0.{i}/32"]
        assert list(weps[name].endpoint.ipv6_nets) == [f"fd00:65::{i}/128"]
        assert list(weps[name].endpoint.profile_ids) == ["kns.default"]
    (tier,) = weps["cali-wl-b"].endpoint.tiers
    assert tier.name == "default" and [p.name for p in tier.ingress_policies] == ["allow-8080-from-clients"]
    rule = only(demo.initial, "active_policy_update").policy.inbound_rules[0]
    assert rule.protocol.name == "tcp" and (rule.dst_ports[0].first, rule.dst_ports[0].last) == (8080, 8080)
    assert list(rule.src_ip_set_ids) == ["s:clients"]

    (step,) = demo.steps
    assert step.after_seconds == 2.0 and "wl-c" in step.description
    assert kinds(step.messages) == ["active_policy_update", "workload_endpoint_update"]
    locked = only(step.messages, "workload_endpoint_update").endpoint
    assert locked.name == "cali-wl-c" and locked.tiers[0].ingress_policies[0].name == "deny-all-to-c"
    assert list(locked.ipv4_nets) == ["10.65.0.4/32"]  # merged from the anchor


def test_bundled_scenario_unknown_name() -> None:
    with pytest.raises(ScenarioError, match="no bundled scenario named 'nope'"):
        sc.bundled_scenario_path("nope")


# --------------------------------------------------------------------------
# Batches, ordering, numbering.
# --------------------------------------------------------------------------


def test_empty_scenario_is_config_then_in_sync() -> None:
    for s in (parse(""), scenario_from_dict({})):
        assert kinds(s.initial) == ["config_update", "in_sync"]
        assert s.steps == () and s.next_seq == 2


def test_empty_sections_are_allowed() -> None:
    s = parse("ipsets:\npolicies:\nsteps:\n")
    assert kinds(s.initial) == ["config_update", "in_sync"] and s.steps == ()
    s = parse("ipsets: [{id: a}]\nsteps: [{update: {ipsets: }, remove: {ipsets: [a]}}]")
    assert kinds(s.steps[0].messages) == ["ipset_remove"]


def test_start_seq() -> None:
    s = parse("steps: [{update: {config: {A: 1}}}]", start_seq=100)
    assert [m.sequence_number for m in s.all_messages()] == [100, 101, 102]
    assert s.next_seq == 103


EVERYTHING = """
config: {A: x}
encapsulation: {vxlan_enabled: true}
global_bgp_config: {service_cluster_cidrs: [10.96.0.0/12]}
services: [{namespace: default, name: web, cluster_ips: [10.96.0.10]}]
ipam_pools: [{cidr: 10.65.0.0/16, masquerade: true, vxlan_mode: Always}]
host_metadata: [{hostname: node-1, ipv4_addr: 192.168.0.1, asnumber: 64512}]
wireguard_endpoints: [{hostname: node-2, public_key: abc=}]
wireguard_endpoints_v6: [{hostname: node-2, public_key_v6: def=}]
routes: [{dst: 10.65.1.0/26, types: [remote_workload], dst_node_name: node-2, dst_node_ip: 192.168.0.2}]
vteps: [{node: node-2, mac: "66:00:00:00:00:02", ipv4_addr: 10.65.1.0, parent_device_ip: 192.168.0.2}]
namespaces: [{name: default, labels: {team: a}}]
service_accounts: [{namespace: default, name: sa1}]
host_endpoints: [{name: eth0, profile_ids: [kns.default]}]
workloads: [{name: cali-1, profile_ids: [kns.default], tiers: [{name: default, ingress: [p1]}]}]
ipset_deltas: [{id: s:a, added_members: [10.0.0.9/32]}]
"""

INITIAL_ORDER = [
    "config_update",
    "ipset_update",
    "ipset_update",
    "ipset_delta_update",
    "active_policy_update",
    "active_profile_update",
    "workload_endpoint_update",  # Felix interleaves endpoint kinds (map order); we
    "host_endpoint_update",  # keep workloads first, in file order
    "service_account_update",
    "namespace_update",
    "vtep_update",
    "route_update",
    "wireguard_endpoint_update",
    "wireguard_endpoint_v6_update",
    "host_metadata_update",
    "ipam_pool_update",
    "encapsulation",
    "global_bgp_config_update",
    "service_update",
    "in_sync",
]


def test_initial_batch_follows_felix_flush_order() -> None:
    s = parse_with_base(EVERYTHING)
    assert kinds(s.initial) == INITIAL_ORDER
    assert [m.sequence_number for m in s.initial] == list(range(len(INITIAL_ORDER)))


def test_step_removes_follow_felix_flush_order() -> None:
    s = parse_with_base(
        EVERYTHING
        + """
steps:
  - remove:
      services: [default/web]
      ipam_pools: [10.65.0.0/16]
      host_metadata: [node-1]
      wireguard_endpoints: [node-2]
      wireguard_endpoints_v6: [node-2]
      routes: [10.65.1.0/26]
      vteps: [node-2]
      namespaces: [default]
      service_accounts: [{namespace: default, name: sa1}]
      ipsets: [s:b]
      policies: [p1]
      workloads: [cali-1]
      profiles: [kns.default]
      host_endpoints: [eth0]
    update:
      ipsets: [{id: s:c}]
      routes: [{dst: 10.65.2.0/26, types: remote_workload}]
"""
    )
    (step,) = s.steps
    assert kinds(step.messages) == [
        "ipset_update",
        "workload_endpoint_remove",
        "host_endpoint_remove",
        "active_profile_remove",
        "active_policy_remove",
        "ipset_remove",
        "service_account_remove",
        "namespace_remove",
        "route_remove",
        "vtep_remove",
        "route_update",
        "wireguard_endpoint_remove",
        "wireguard_endpoint_v6_remove",
        "host_metadata_remove",
        "ipam_pool_remove",
        "service_remove",
    ]
    assert step.messages[0].sequence_number == len(INITIAL_ORDER)
    assert only(step.messages, "host_metadata_remove") == pb.HostMetadataRemove(
        hostname="node-1", ipv4_addr="192.168.0.1"
    )
    assert only(step.messages, "ipam_pool_remove").id == "10.65.0.0-16"
    assert only(step.messages, "service_account_remove").id == pb.ServiceAccountID(namespace="default", name="sa1")
    assert only(step.messages, "service_remove") == pb.ServiceRemove(namespace="default", name="web")
    assert only(step.messages, "workload_endpoint_remove").id.workload_id == "default/cali-1"
    assert only(step.messages, "host_endpoint_remove").id.endpoint_id == "eth0"
    assert only(step.messages, "active_policy_remove").id == pb.PolicyID(name="p1", kind="GlobalNetworkPolicy")


def test_vtep_adds_precede_route_adds_and_route_removes_precede_vtep_removes() -> None:
    s = parse(
        """
        steps:
          - update:
              routes: [{dst: 10.1.0.0/26, types: [remote_workload, remote_tunnel]}]
              vteps: [{node: n2}]
          - remove: {routes: [10.1.0.0/26], vteps: [n2]}
        """
    )
    assert kinds(s.steps[0].messages) == ["vtep_update", "route_update"]
    assert kinds(s.steps[1].messages) == ["route_remove", "vtep_remove"]


def test_steps_and_after_seconds() -> None:
    s = parse(
        """
        steps:
          - {after_seconds: 1.5, description: first, update: {config: {A: 1}}}
          - {update: {config: {B: 2}}}
        """
    )
    assert [(st.after_seconds, st.description) for st in s.steps] == [(1.5, "first"), (0.0, "")]


def test_step_config_is_merged_and_keys_can_be_removed() -> None:
    s = parse(
        """
        config: {A: 1, B: true, C: x}
        steps:
          - update: {config: {A: 2, D: 1.5}}
          - remove: {config: [C]}
        """
    )
    assert dict(only(s.initial, "config_update").config) == {"A": "1", "B": "true", "C": "x"}
    assert dict(only(s.steps[0].messages, "config_update").config) == {"A": "2", "B": "true", "C": "x", "D": "1.5"}
    assert dict(only(s.steps[1].messages, "config_update").config) == {"A": "2", "B": "true", "D": "1.5"}


def test_update_replaces_and_remove_then_readd_works() -> None:
    s = parse_with_base(
        """
        steps:
          - remove: {policies: [p1]}
          - update: {policies: [{name: p1, outbound: [{action: deny}]}]}
          - update: {workloads: [{name: cali-1, tiers: [{name: default, egress: [p1]}]}]}
        """
    )
    assert only(s.steps[1].messages, "active_policy_update").policy.outbound_rules[0].action == "deny"
    assert only(s.steps[2].messages, "workload_endpoint_update").endpoint.tiers[0].egress_policies[0].name == "p1"


def test_objects_added_in_a_step_can_be_referenced_in_the_same_step() -> None:
    s = parse(
        """
        steps:
          - update:
              workloads: [{name: w, profile_ids: [prof], tiers: [{name: t, ingress: [pol]}]}]
              policies: [{name: pol, tier: t, inbound: [{src_ip_set_ids: [s:x]}]}]
              profiles: [{name: prof}]
              ipsets: [{id: s:x}]
        """
    )
    assert kinds(s.steps[0].messages) == [
        "ipset_update",
        "active_policy_update",
        "active_profile_update",
        "workload_endpoint_update",
    ]


# --------------------------------------------------------------------------
# Section contents.
# --------------------------------------------------------------------------


def test_ipsets() -> None:
    s = parse(
        """
        ipsets:
          - {id: s:net, members: [10.0.0.0/24, "fd00::/64"]}
          - {id: s:ip, type: IP, members: 10.0.0.1}
          - {id: s:port, type: ip_and_port, members: ["10.0.0.1,tcp:80"]}
          - {id: s:empty}
        """
    )
    sets = {u.id: u for u in payloads(s.initial, "ipset_update")}
    assert sets["s:net"].type == pb.IPSetUpdate.NET and list(sets["s:net"].members) == ["10.0.0.0/24", "fd00::/64"]
    assert sets["s:ip"].type == pb.IPSetUpdate.IP and list(sets["s:ip"].members) == ["10.0.0.1"]
    assert sets["s:port"].type == pb.IPSetUpdate.IP_AND_PORT
    assert list(sets["s:empty"].members) == []


def test_ipset_delta() -> None:
    s = parse_with_base(
        "steps: [{update: {ipset_deltas: [{id: s:a, added_members: [1.1.1.1], removed_members: [10.0.0.1/32]}]}}]"
    )
    delta = only(s.steps[0].messages, "ipset_delta_update")
    assert (list(delta.added_members), list(delta.removed_members)) == (["1.1.1.1"], ["10.0.0.1/32"])


def test_policy_fields_and_kinds() -> None:
    s = parse(
        """
        policies:
          - {name: g, tier: security, untracked: true, original_selector: "all()", perf_hints: [AssumeNeededOnEveryNode]}
          - {name: n, kind: np, namespace: prod, pre_dnat: false}
          - {name: k, kind: KubernetesNetworkPolicy, namespace: prod}
          - {name: a, kind: ANP}
        """
    )
    ups = {u.id.name: u for u in payloads(s.initial, "active_policy_update")}
    assert ups["g"].id == pb.PolicyID(name="g", kind="GlobalNetworkPolicy")
    assert ups["g"].policy.tier == "security" and ups["g"].policy.untracked
    assert ups["g"].policy.original_selector == "all()" and list(ups["g"].policy.perf_hints) == [
        "AssumeNeededOnEveryNode"
    ]
    assert ups["n"].id == pb.PolicyID(name="n", namespace="prod", kind="NetworkPolicy")
    assert ups["n"].policy.namespace == "prod" and ups["n"].policy.tier == "default"
    assert ups["k"].id.kind == "KubernetesNetworkPolicy"
    assert ups["a"].id.kind == "KubernetesAdminNetworkPolicy"


def test_policy_references() -> None:
    s = parse(
        """
        policies:
          - {name: same, kind: np, namespace: a}
          - {name: same, kind: np, namespace: b}
          - {name: uniq}
        workloads:
          - name: w
            tiers:
              - name: default
                ingress: [uniq, a/same, {name: same, namespace: b, kind: np}]
                default_action: pass
        """
    )
    (tier,) = only(s.initial, "workload_endpoint_update").endpoint.tiers
    assert [(p.namespace, p.name, p.kind) for p in tier.ingress_policies] == [
        ("", "uniq", "GlobalNetworkPolicy"),
        ("a", "same", "NetworkPolicy"),
        ("b", "same", "NetworkPolicy"),
    ]
    assert tier.default_action == "Pass"


def test_workload_defaults_and_passthrough() -> None:
    s = parse(
        """
        workloads:
          - name: cali-x
            ipv4_nets: [10.0.0.5]
            ipv6_nets: ["fd00::5"]
            ipv4_nat: [{ext_ip: 1.2.3.4, int_ip: 10.0.0.5}]
            annotations: {a: b}
            qos_controls: {IngressBandwidth: 1000000}
            live_migration_role: target
          - name: cali-y
            id: {orchestrator: openstack, workload: vm1, endpoint: tap1}
            state: down
        """
    )
    x, y = payloads(s.initial, "workload_endpoint_update")
    assert x.id == pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id="default/cali-x", endpoint_id="eth0")
    assert x.endpoint.state == "active"
    assert list(x.endpoint.ipv4_nets) == ["10.0.0.5/32"] and list(x.endpoint.ipv6_nets) == ["fd00::5/128"]
    assert x.endpoint.ipv4_nat[0].ext_ip == "1.2.3.4" and dict(x.endpoint.annotations) == {"a": "b"}
    assert x.endpoint.qos_controls.IngressBandwidth == 1000000
    assert x.endpoint.live_migration_role == pb.TARGET
    assert y.id == pb.WorkloadEndpointID(orchestrator_id="openstack", workload_id="vm1", endpoint_id="tap1")
    assert y.endpoint.state == "down"


def test_removes_pick_the_right_object_among_several() -> None:
    s = parse(
        """
        workloads: [{name: cali-1}, {name: cali-2}]
        ipam_pools: [{cidr: 10.1.0.0/16}, {cidr: 10.2.0.0/16, id: two}]
        steps: [{remove: {workloads: [cali-2], ipam_pools: [10.2.0.0/16]}}]
        """
    )
    assert only(s.steps[0].messages, "workload_endpoint_remove").id.workload_id == "default/cali-2"
    assert only(s.steps[0].messages, "ipam_pool_remove").id == "two"


def test_enum_by_number() -> None:
    s = parse("workloads: [{name: w, live_migration_role: 2}]")
    assert only(s.initial, "workload_endpoint_update").endpoint.live_migration_role == pb.TARGET


def test_remove_workload_by_id_mapping() -> None:
    s = parse(
        """
        workloads: [{name: cali-y, id: {workload: ns/pod}}]
        steps: [{remove: {workloads: [{workload: ns/pod}]}}]
        """
    )
    assert only(s.steps[0].messages, "workload_endpoint_remove").id.workload_id == "ns/pod"


def test_host_endpoints() -> None:
    s = parse_with_base(
        """
        host_endpoints:
          - id: all
            name: "*"
            expected_ipv4_addrs: [192.168.0.1]
            expected_ipv6_addrs: ["fd00::1"]
            untracked_tiers: [{name: default, ingress: [p1]}]
            pre_dnat_tiers: [{name: default, ingress: [p1]}]
            forward_tiers: [{name: default, egress: [p1]}]
            tiers: [{name: default, ingress: [p1]}]
        """
    )
    hep = only(s.initial, "host_endpoint_update")
    assert hep.id.endpoint_id == "all" and hep.endpoint.name == "*"
    assert list(hep.endpoint.expected_ipv4_addrs) == ["192.168.0.1"]
    assert list(hep.endpoint.expected_ipv6_addrs) == ["fd00::1"]
    for field in ("tiers", "untracked_tiers", "pre_dnat_tiers", "forward_tiers"):
        assert len(getattr(hep.endpoint, field)) == 1


def test_routes() -> None:
    s = parse(
        """
        routes:
          - dst: 10.65.1.0/26
            types: [remote_workload, REMOTE_TUNNEL]
            ip_pool_type: vxlan
            tunnel_type: vxlan
            dst_node_name: n2
            dst_node_ip: 192.168.0.2
            same_subnet: true
            nat_outgoing: true
            borrowed: true
          - {dst: 10.65.2.0/26, types: local_workload, local_workload: true, tunnel_type: [ipip, wireguard]}
          - {dst: 10.65.0.0/16, tunnel_type: {vxlan: true}}
        """
    )
    a, b, c = payloads(s.initial, "route_update")
    assert a.types == pb.REMOTE_WORKLOAD | pb.REMOTE_TUNNEL == 17
    assert a.ip_pool_type == pb.VXLAN and a.tunnel_type == pb.TunnelType(vxlan=True)
    assert (a.dst_node_name, a.dst_node_ip, a.same_subnet, a.nat_outgoing, a.borrowed) == (
        "n2",
        "192.168.0.2",
        True,
        True,
        True,
    )
    assert b.types == pb.LOCAL_WORKLOAD and b.local_workload
    assert b.tunnel_type == pb.TunnelType(ipip=True, wireguard=True)
    assert c.types == pb.CIDR_INFO and c.tunnel_type.vxlan


def test_pools_hosts_encap_vteps_and_others() -> None:
    s = parse(
        """
        ipam_pools: [{id: pool1, cidr: 10.65.0.1/16, ipip_mode: Always, allowed_uses: [Workload, Tunnel]}]
        host_metadata: [{hostname: n1, ipv4_addr: 10.0.0.1/24, ipv6_addr: "fd00::1/64", asnumber: 64512, labels: {zone: a}}]
        encapsulation: {ipip_enabled: true, vxlan_enabled_v6: true, no_encap_enabled: false}
        vteps: [{node: n2, mac: aa:bb:cc:dd:ee:ff, ipv6_addr: "fd00::2", mac_v6: aa:bb:cc:dd:ee:00}]
        global_bgp_config: {local_workload_peering_ip_v4: 169.254.0.1}
        services:
          - {namespace: ns, name: svc, type: ClusterIP, ports: [{Protocol: TCP, Port: 80, NodePort: 30080}]}
        """
    )
    pool = only(s.initial, "ipam_pool_update")
    assert pool.id == "pool1" and pool.pool.cidr == "10.65.0.0/16" and pool.pool.ipip_mode == "Always"
    assert list(pool.pool.allowed_uses) == ["Workload", "Tunnel"]
    host = only(s.initial, "host_metadata_update")
    assert host.asnumber == "64512" and dict(host.labels) == {"zone": "a"} and host.ipv6_addr == "fd00::1/64"
    assert only(s.initial, "encapsulation") == pb.Encapsulation(ipip_enabled=True, vxlan_enabled_v6=True)
    assert only(s.initial, "vtep_update").mac_v6 == "aa:bb:cc:dd:ee:00"
    assert only(s.initial, "global_bgp_config_update").local_workload_peering_ip_v4 == "169.254.0.1"
    assert only(s.initial, "service_update").ports[0] == pb.ServicePort(Protocol="TCP", Port=80, NodePort=30080)


# --------------------------------------------------------------------------
# Rules.
# --------------------------------------------------------------------------


def rule_from(rule_yaml: str) -> pb.Rule:
    """Parse one rule, written as a YAML flow mapping, inside a policy of BASE."""
    text = BASE.replace("{name: p1, inbound: [{action: allow}]}", f"{{name: p1, inbound: [{rule_yaml}]}}")
    return only(parse(text).initial, "active_policy_update").policy.inbound_rules[0]


def test_rule_defaults() -> None:
    rule = rule_from("{}")
    assert rule.action == "allow" and rule.ip_version == pb.ANY and not rule.HasField("protocol")
    assert len(rule.rule_id) == 16


def test_rule_full() -> None:
    rule = rule_from(
        """{action: Deny, ip_version: 4, protocol: tcp, not_protocol: 17,
            src_net: 10.0.0.5, dst_net: [10.1.0.0/16], not_src_net: [10.2.0.0/16], not_dst_net: 10.3.0.1/8,
            src_ports: 80, dst_ports: [443, "8000:8080"], not_src_ports: ["1:2"], not_dst_ports: [22],
            src_ip_set_ids: [s:a], dst_ip_set_ids: s:b, not_src_ip_set_ids: [s:a], not_dst_ip_set_ids: [s:b],
            src_named_port_ip_set_ids: [s:a], dst_named_port_ip_set_ids: [s:b], dst_ip_port_set_ids: [s:a],
            not_src_named_port_ip_set_ids: [s:a], not_dst_named_port_ip_set_ids: [s:b],
            original_src_selector: "role == 'x'", http_match: {methods: [GET], paths: [{exact: /a}, {prefix: /b}]},
            src_service_account_match: {names: [sa1]}, metadata: {annotations: {k: v}}, rule_id: my-id}""",
    )
    assert rule.action == "deny" and rule.ip_version == pb.IPV4
    assert rule.protocol == pb.Protocol(name="tcp") and rule.not_protocol == pb.Protocol(number=17)
    assert list(rule.src_net) == ["10.0.0.5/32"] and list(rule.not_dst_net) == ["10.0.0.0/8"]
    assert [(p.first, p.last) for p in rule.dst_ports] == [(443, 443), (8000, 8080)]
    assert [(p.first, p.last) for p in rule.src_ports] == [(80, 80)]
    assert [(p.first, p.last) for p in rule.not_src_ports] == [(1, 2)]
    assert list(rule.dst_ip_set_ids) == ["s:b"] and list(rule.dst_ip_port_set_ids) == ["s:a"]
    assert list(rule.not_dst_named_port_ip_set_ids) == ["s:b"]
    assert rule.http_match.paths[1].prefix == "/b" and list(rule.http_match.methods) == ["GET"]
    assert list(rule.src_service_account_match.names) == ["sa1"]
    assert dict(rule.metadata.annotations) == {"k": "v"}
    assert rule.original_src_selector == "role == 'x'" and rule.rule_id == "my-id"


def test_rule_icmp() -> None:
    typed = rule_from("{protocol: icmp, icmp_type: 8, not_icmp_type: 0, not_icmp_code: 3}")
    assert typed.WhichOneof("icmp") == "icmp_type" and typed.icmp_type == 8
    assert typed.not_icmp_type_code == pb.IcmpTypeAndCode(type=0, code=3)
    both = rule_from("{protocol: icmpv6, ip_version: 6, icmp_type: 128, icmp_code: 0}")
    assert both.WhichOneof("icmp") == "icmp_type_code" and both.icmp_type_code == pb.IcmpTypeAndCode(type=128, code=0)
    zero = rule_from("{icmp_type: 0}")
    assert zero.WhichOneof("icmp") == "icmp_type"


def test_rule_protocol_number_as_string_and_name_case() -> None:
    assert rule_from('{protocol: "6"}').protocol == pb.Protocol(number=6)
    assert rule_from("{protocol: UDP}").protocol == pb.Protocol(name="udp")


def test_rule_ids_are_stable_and_distinct() -> None:
    def first_rule_id(s: Scenario) -> str:
        return str(only(s.initial, "active_policy_update").policy.inbound_rules[0].rule_id)

    assert first_rule_id(parse(BASE)) == first_rule_id(parse(BASE))
    assert first_rule_id(parse(BASE.replace("{name: p1,", "{name: p2,"))) != first_rule_id(parse(BASE))
    profile = only(parse(BASE).initial, "active_profile_update").profile
    assert profile.inbound_rules[0].rule_id != profile.outbound_rules[0].rule_id
