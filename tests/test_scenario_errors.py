"""Scenario feed: every error names its YAML path; the generic proto filler on its own."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from felixpy.errors import ConfigError
from felixpy.feed.scenario import Scenario, ScenarioError, load_scenario, parse_scenario, scenario_from_dict
from felixpy.messages import payload_of
from felixpy.proto import felixbackend_pb2 as pb


def parse(text: str, start_seq: int = 0) -> Scenario:
    return parse_scenario(textwrap.dedent(text), start_seq)


def only(msgs: Any, kind: str) -> Any:
    (found,) = [p for k, p in map(payload_of, msgs) if k == kind]
    return found


# --------------------------------------------------------------------------
# Errors: every one names the path.
# --------------------------------------------------------------------------

ERRORS = [
    # Top level and YAML.
    ("policies: [", "invalid YAML"),
    ("a: 1\na: 2", "duplicate key 'a' at line 2, column 1"),
    ("- 1", "expected a mapping, got [1]"),
    ("bogus: 1", "bogus: unknown key; expected one of: config, description,"),
    ("description: [1]", "description: expected text"),
    ("1: x", "keys must be strings"),
    # Config.
    ("config: [a]", "config: expected a mapping"),
    ("config: {A: null}", "config.A: expected a string, got None"),
    ("config: {A: [1]}", "config.A: expected a string"),
    # IP sets.
    ("ipsets: {id: x}", "ipsets: expected a list"),
    ("ipsets: [x]", "ipsets[0]: expected a mapping, got 'x'"),
    ("ipsets: [{members: []}]", "ipsets[0].id: required"),
    ("ipsets: [{id: ''}]", "ipsets[0].id: must not be empty"),
    ("ipsets: [{id: true}]", "ipsets[0].id: expected a string, got True"),
    ("ipsets: [{id: a, type: hash}]", "ipsets[0].type: bad IP set type 'hash'"),
    ("ipsets: [{id: a, members: [[1]]}]", "ipsets[0].members[0]: expected a string"),
    ("ipsets: [{id: a, members: {x: 1}}]", "ipsets[0].members: expected a list"),
    ("ipsets: [{id: a, color: red}]", "ipsets[0].color: unknown key; expected one of: id, members, type"),
    ("ipsets: [{id: a}, {id: a}]", "ipsets[1]: duplicate IP set 'a' (also at ipsets[0])"),
    ("ipset_deltas: [{added_members: [x]}]", "ipset_deltas[0].id: required"),
    ("ipset_deltas: [{id: nope}]", "ipset_deltas[0].id: unknown IP set 'nope'"),
    # Policies and rules.
    ("policies: [{kind: gnp}]", "policies[0].name: required"),
    ("policies: [{name: p, kind: xnp}]", "policies[0].kind: bad policy kind 'xnp'"),
    ("policies: [{name: p, kind: 5}]", "policies[0].kind: bad policy kind 5"),
    ("policies: [{name: p, original_selector: true}]", "policies[0].original_selector: expected a string, got True"),
    ("policies: [{name: p, kind: np}]", "policies[0].namespace: required for kind NetworkPolicy"),
    ("policies: [{name: p, namespace: ns}]", "policies[0].namespace: not allowed for kind GlobalNetworkPolicy"),
    (
        "policies: [{name: p, untracked: true, pre_dnat: true}]",
        "policies[0]: a policy cannot be both untracked and pre_dnat",
    ),
    ("policies: [{name: p, untracked: yes please}]", "policies[0].untracked: expected true or false"),
    ("policies: [{name: p, inbound_rules: []}]", "policies[0].inbound_rules: unknown key"),
    ("policies: [{name: p, tier: ''}]", "policies[0].tier: must not be empty"),
    ("policies: [{name: p, inbound: {action: allow}}]", "policies[0].inbound: expected a list"),
    ("policies: [{name: p, inbound: [{action: accept}]}]", "policies[0].inbound[0].action: bad action 'accept'"),
    ("policies: [{name: p, inbound: [{action: 1}]}]", "policies[0].inbound[0].action: bad action 1"),
    ("policies: [{name: p, inbound: [{ip_version: 5}]}]", "policies[0].inbound[0].ip_version: bad ip_version 5"),
    ("policies: [{name: p, inbound: [{ip_version: true}]}]", "policies[0].inbound[0].ip_version: bad ip_version True"),
    ("policies: [{name: p, inbound: [{protocol: 256}]}]", "policies[0].inbound[0].protocol: bad protocol number 256"),
    ("policies: [{name: p, inbound: [{protocol: -1}]}]", "policies[0].inbound[0].protocol: bad protocol number -1"),
    (
        "policies: [{name: p, inbound: [{not_protocol: tcpx}]}]",
        "policies[0].inbound[0].not_protocol: bad protocol 'tcpx'",
    ),
    ("policies: [{name: p, inbound: [{protocol: true}]}]", "policies[0].inbound[0].protocol: bad protocol True"),
    (
        "policies: [{name: p, inbound: [{src_net: [10.0.0.0/33]}]}]",
        "policies[0].inbound[0].src_net[0]: bad CIDR '10.0.0.0/33'",
    ),
    ("policies: [{name: p, inbound: [{dst_net: [5]}]}]", "policies[0].inbound[0].dst_net[0]: bad CIDR 5"),
    ("policies: [{name: p, inbound: [{dst_ports: [x]}]}]", "policies[0].inbound[0].dst_ports[0]: bad port 'x'"),
    ("policies: [{name: p, inbound: [{dst_ports: x}]}]", "policies[0].inbound[0].dst_ports[0]: bad port 'x'"),
    ("policies: [{name: p, inbound: [{dst_ports: [65536]}]}]", "dst_ports[0]: bad port 65536"),
    ("policies: [{name: p, inbound: [{dst_ports: [-1]}]}]", "dst_ports[0]: bad port -1"),
    ("policies: [{name: p, inbound: [{src_ports: ['9:1']}]}]", "src_ports[0]: bad port '9:1'"),
    ("policies: [{name: p, inbound: [{src_ports: ['1:2:3']}]}]", "src_ports[0]: bad port '1:2:3'"),
    ("policies: [{name: p, inbound: [{src_ports: ['']}]}]", "src_ports[0]: bad port ''"),
    ("policies: [{name: p, inbound: [{not_dst_ports: [1.5]}]}]", "not_dst_ports[0]: bad port 1.5"),
    ("policies: [{name: p, inbound: [{not_src_ports: [true]}]}]", "not_src_ports[0]: bad port True"),
    ("policies: [{name: p, inbound: [{dst_ports: {a: 1}}]}]", "dst_ports: expected a list"),
    (
        "policies: [{name: p, inbound: [{src_ip_set_ids: [nope]}]}]",
        "policies[0].inbound[0].src_ip_set_ids[0]: unknown IP set 'nope'",
    ),
    ("policies: [{name: p, inbound: [{not_dst_ip_set_ids: [1]}]}]", "not_dst_ip_set_ids[0]: bad IP set id 1"),
    ("policies: [{name: p, inbound: [{icmp_code: 1}]}]", "policies[0].inbound[0].icmp_code: needs icmp_type"),
    ("policies: [{name: p, inbound: [{not_icmp_code: 1}]}]", "inbound[0].not_icmp_code: needs not_icmp_type"),
    ("policies: [{name: p, inbound: [{icmp_type: 256}]}]", "inbound[0].icmp_type: bad ICMP value 256"),
    ("policies: [{name: p, inbound: [{icmp_type: 1, icmp_code: x}]}]", "inbound[0].icmp_code: bad ICMP value 'x'"),
    ("policies: [{name: p, inbound: [{icmp_type_code: {type: 1}}]}]", "inbound[0].icmp_type_code: unknown key"),
    ("policies: [{name: p, inbound: [{rule_id: ''}]}]", "inbound[0].rule_id: bad rule_id ''"),
    ("policies: [{name: p, inbound: [{colour: red}]}]", "policies[0].inbound[0].colour: unknown key"),
    ("policies: [{name: p, inbound: [{original_src_selector: [1]}]}]", "original_src_selector: expected a string"),
    (
        "policies: [{name: p, inbound: [{http_match: {methods: GET, paths: [{exact: 1, bogus: 2}]}}]}]",
        "http_match.paths[0].bogus: unknown key",
    ),
    ("policies: [{name: p, inbound: [{http_match: {paths: {exact: a}}}]}]", "http_match.paths: expected a list"),
    ("policies: [{name: p, inbound: [{metadata: {annotations: [a]}}]}]", "metadata.annotations: expected a mapping"),
    ("policies: [{name: p, inbound: [{metadata: 3}]}]", "inbound[0].metadata: expected a mapping, got 3"),
    # Profiles.
    ("profiles: [{name: a, labels: {}}]", "profiles[0].labels: unknown key; expected one of: inbound, name, outbound"),
    ("profiles: [{inbound: []}]", "profiles[0].name: required"),
    # Workloads and tiers.
    ("workloads: [{ipv4_nets: []}]", "workloads[0].name: required"),
    ("workloads: [{name: w, ipv4_nets: [fd00::1]}]", "workloads[0].ipv4_nets[0]: fd00::1/128 is not an IPv4 CIDR"),
    ("workloads: [{name: w, ipv6_nets: [10.0.0.1]}]", "workloads[0].ipv6_nets[0]: 10.0.0.1/32 is not an IPv6 CIDR"),
    ("workloads: [{name: w, ipv4_nets: [banana]}]", "workloads[0].ipv4_nets[0]: bad CIDR 'banana'"),
    ("workloads: [{name: w, profile_ids: [nope]}]", "workloads[0].profile_ids[0]: unknown profile 'nope'"),
    (
        "workloads: [{name: w, id: {pod: x}}]",
        "workloads[0].id.pod: unknown key; expected one of: endpoint, orchestrator, workload",
    ),
    ("workloads: [{name: w, id: x}]", "workloads[0].id: expected a mapping"),
    ("workloads: [{name: w, tiers: [{ingress: []}]}]", "workloads[0].tiers[0].name: required"),
    (
        "workloads: [{name: w, tiers: [{name: t, ingress: [nope]}]}]",
        "workloads[0].tiers[0].ingress[0]: unknown policy 'nope'",
    ),
    (
        "workloads: [{name: w, tiers: [{name: t, egress: [[x]]}]}]",
        "workloads[0].tiers[0].egress[0]: bad policy reference",
    ),
    (
        "policies: [{name: p1}]\nworkloads: [{name: w, tiers: [{name: t, ingress: [{name: p1, kind: np}]}]}]",
        "tiers[0].ingress[0]: unknown policy",
    ),
    (
        "workloads: [{name: w, tiers: [{name: t, default_action: drop}]}]",
        "tiers[0].default_action: bad default_action 'drop'",
    ),
    ("workloads: [{name: w, tiers: [{name: t, policies: []}]}]", "tiers[0].policies: unknown key"),
    ("workloads: [{name: w, tiers: {name: t}}]", "workloads[0].tiers: expected a list"),
    (
        "workloads: [{name: w, qos_controls: {IngressBandwidth: x}}]",
        "qos_controls.IngressBandwidth: expected an integer, got 'x'",
    ),
    ("workloads: [{name: w, qos_controls: {IngressBandwidth: 9223372036854775808}}]", "is out of range"),
    ("workloads: [{name: w, live_migration_role: sideways}]", "live_migration_role: bad LiveMigrationRole 'sideways'"),
    ("workloads: [{name: w, live_migration_role: 7}]", "live_migration_role: bad LiveMigrationRole 7"),
    ("workloads: [{name: w, is_istio_ambient: 1}]", "is_istio_ambient: expected true or false, got 1"),
    ("workloads: [{name: w, ipv4_nat: {ext_ip: x}}]", "workloads[0].ipv4_nat: expected a list"),
    (
        "workloads: [{name: w}, {name: w, id: {workload: other}}]",
        "workloads[1].name: interface 'w' already belongs to workload",
    ),
    ("workloads: [{name: w}, {name: w}]", "workloads[1]: duplicate workload"),
    # Host endpoints.
    ("host_endpoints: [{id: h}]", "host_endpoints[0].name: required"),
    ("host_endpoints: [{expected_ipv4_addrs: [10.0.0.1]}]", "host_endpoints[0].id: required"),
    (
        "host_endpoints: [{name: eth0, expected_ipv4_addrs: [fd00::1]}]",
        "expected_ipv4_addrs[0]: fd00::1 is not an IPv4 address",
    ),
    (
        "host_endpoints: [{name: eth0, expected_ipv6_addrs: [10.0.0.0/8]}]",
        "expected_ipv6_addrs[0]: bad IP address '10.0.0.0/8'",
    ),
    (
        "host_endpoints: [{name: eth0, forward_tiers: [{name: t, ingress: [x]}]}]",
        "forward_tiers[0].ingress[0]: unknown policy 'x'",
    ),
    # Routes, VTEPs, pools, hosts.
    ("routes: [{types: [remote_host]}]", "routes[0].dst: required"),
    ("routes: [{dst: nowhere}]", "routes[0].dst: bad CIDR 'nowhere'"),
    ("routes: [{dst: 10.0.0.0/8, types: [remote_workloads]}]", "routes[0].types[0]: bad route type 'remote_workloads'"),
    ("routes: [{dst: 10.0.0.0/8, types: [1]}]", "routes[0].types[0]: bad route type 1"),
    ("routes: [{dst: 10.0.0.0/8, ip_pool_type: gre}]", "routes[0].ip_pool_type: bad IPPoolType 'gre'"),
    ("routes: [{dst: 10.0.0.0/8, ip_pool_type: [vxlan]}]", "routes[0].ip_pool_type: bad IPPoolType ['vxlan']"),
    ("routes: [{dst: 10.0.0.0/8, tunnel_type: gre}]", "routes[0].tunnel_type[0]: bad tunnel type 'gre'"),
    ("routes: [{dst: 10.0.0.0/8, tunnel_type: {gre: true}}]", "routes[0].tunnel_type.gre: unknown key"),
    ("routes: [{dst: 10.0.0.0/8, same_subnet: 'yes'}]", "routes[0].same_subnet: expected true or false"),
    ("routes: [{dst: 10.0.0.0/8}, {dst: 10.0.0.1/8}]", "routes[1]: duplicate route '10.0.0.0/8'"),
    ("vteps: [{mac: x}]", "vteps[0].node: required"),
    ("vteps: [{node: n, colour: x}]", "vteps[0].colour: unknown key"),
    ("ipam_pools: [{masquerade: true}]", "ipam_pools[0].cidr: required"),
    ("ipam_pools: [{cidr: 10.0.0.0/8, masquerade: 1}]", "ipam_pools[0].masquerade: expected true or false"),
    ("host_metadata: [{ipv4_addr: 1.2.3.4}]", "host_metadata[0].hostname: required"),
    ("host_metadata: [{hostname: h, labels: [a]}]", "host_metadata[0].labels: expected a mapping"),
    ("encapsulation: [true]", "encapsulation: expected a mapping"),
    ("encapsulation: {gre_enabled: true}", "encapsulation.gre_enabled: unknown key"),
    ("global_bgp_config: {service_cluster_cidrs: {a: b}}", "global_bgp_config.service_cluster_cidrs: expected a list"),
    ("services: [{name: s}]", "services[0].namespace: required"),
    ("services: [{name: s, namespace: n, ports: [{Port: x}]}]", "services[0].ports[0].Port: expected an integer"),
    ("service_accounts: [{name: s}]", "service_accounts[0].namespace: required"),
    ("namespaces: [{labels: {}}]", "namespaces[0].name: required"),
    ("namespaces: [{name: n, id: {name: n}}]", "namespaces[0].id: unknown key"),
    ("wireguard_endpoints: [{public_key: k}]", "wireguard_endpoints[0].hostname: required"),
    # Steps.
    ("steps: {update: {}}", "steps: expected a list"),
    ("steps: [x]", "steps[0]: expected a mapping"),
    ("steps: [{}]", "steps[0]: a step needs an update or a remove"),
    ("steps: [{after_seconds: 1}]", "steps[0]: a step needs an update or a remove"),
    ("steps: [{update: {ipsets: [], workloads: }}]", "steps[0]: a step needs an update or a remove"),
    ("steps: [{after_seconds: -1, update: {config: {}}}]", "steps[0].after_seconds: expected a number >= 0"),
    (
        "steps: [{after_seconds: soon, update: {config: {}}}]",
        "steps[0].after_seconds: expected a number >= 0, got 'soon'",
    ),
    (
        "steps: [{after_seconds: true, update: {config: {}}}]",
        "steps[0].after_seconds: expected a number >= 0, got True",
    ),
    (
        "steps: [{wait: 1, update: {config: {}}}]",
        "steps[0].wait: unknown key; expected one of: after_seconds, description, remove, update",
    ),
    ("steps: [{description: 5, update: {config: {}}}]", "steps[0].description: expected text"),
    ("steps: [{update: [x]}]", "steps[0].update: expected a mapping"),
    ("steps: [{update: {polices: []}}]", "steps[0].update.polices: unknown key"),
    ("steps: [{update: {steps: []}}]", "steps[0].update.steps: unknown key"),
    ("steps: [{remove: {encapsulation: [x]}}]", "steps[0].remove.encapsulation: unknown key"),
    ("steps: [{remove: {ipset_deltas: [x]}}]", "steps[0].remove.ipset_deltas: unknown key"),
    ("steps: [{remove: {ipsets: s:a}}]", "steps[0].remove.ipsets: expected a list"),
    ("steps: [{remove: {ipsets: [nope]}}]", "steps[0].remove.ipsets[0]: unknown IP set 'nope'"),
    (
        "ipsets: [{id: s:a}]\nsteps: [{remove: {ipsets: [s:a, s:a]}}]",
        "steps[0].remove.ipsets[1]: IP set 's:a' is already removed at steps[0].remove.ipsets[0]",
    ),
    (
        "ipsets: [{id: s:a}]\nsteps: [{remove: {ipsets: [s:a]}}, {remove: {ipsets: [s:a]}}]",
        "steps[1].remove.ipsets[0]: unknown IP set 's:a'",
    ),
    (
        "ipsets: [{id: s:a}]\nsteps: [{remove: {ipsets: [s:a]}, update: {ipsets: [{id: s:a}]}}]",
        "steps[0].update.ipsets[0]: IP set 's:a' is also removed at steps[0].remove.ipsets[0]",
    ),
    (
        "ipsets: [{id: s:a}]\nsteps: [{remove: {ipsets: [s:a]}, update: {policies: [{name: q, inbound: [{src_ip_set_ids: [s:a]}]}]}}]",
        "steps[0].update.policies[0].inbound[0].src_ip_set_ids[0]: unknown IP set 's:a'",
    ),
    ("steps: [{remove: {policies: [nope]}}]", "steps[0].remove.policies[0]: unknown policy 'nope'"),
    ("steps: [{remove: {policies: [5]}}]", "steps[0].remove.policies[0]: bad policy reference 5"),
    ("steps: [{remove: {profiles: [nope]}}]", "steps[0].remove.profiles[0]: unknown profile 'nope'"),
    ("steps: [{remove: {workloads: [cali-nope]}}]", "steps[0].remove.workloads[0]: unknown workload 'cali-nope'"),
    ("steps: [{remove: {workloads: [{orchestrator: k8s}]}}]", "steps[0].remove.workloads[0].workload: required"),
    ("steps: [{remove: {workloads: [{workload: x}]}}]", "steps[0].remove.workloads[0]: unknown workload"),
    ("steps: [{remove: {host_endpoints: [eth9]}}]", "steps[0].remove.host_endpoints[0]: unknown host endpoint 'eth9'"),
    ("steps: [{remove: {routes: [10.9.0.0/16]}}]", "steps[0].remove.routes[0]: unknown route '10.9.0.0/16'"),
    ("steps: [{remove: {routes: [bad]}}]", "steps[0].remove.routes[0]: bad CIDR 'bad'"),
    ("steps: [{remove: {vteps: [n9]}}]", "steps[0].remove.vteps[0]: unknown VTEP 'n9'"),
    ("steps: [{remove: {ipam_pools: [p9]}}]", "steps[0].remove.ipam_pools[0]: unknown IPAM pool 'p9'"),
    ("steps: [{remove: {host_metadata: [h9]}}]", "steps[0].remove.host_metadata[0]: unknown host 'h9'"),
    ("steps: [{remove: {namespaces: [n9]}}]", "steps[0].remove.namespaces[0]: unknown namespace 'n9'"),
    ("steps: [{remove: {wireguard_endpoints: [h]}}]", "unknown WireGuard endpoint 'h'"),
    ("steps: [{remove: {wireguard_endpoints_v6: [h]}}]", "unknown WireGuard IPv6 endpoint 'h'"),
    (
        "steps: [{remove: {service_accounts: [a/b]}}]",
        "steps[0].remove.service_accounts[0]: unknown service account 'a/b'",
    ),
    (
        "steps: [{remove: {service_accounts: [ab]}}]",
        "remove.service_accounts[0]: bad reference 'ab'; expected 'namespace/name'",
    ),
    ("steps: [{remove: {services: [{namespace: a}]}}]", "steps[0].remove.services[0].name: required"),
    ("steps: [{remove: {services: [{namespace: a, name: b, x: 1}]}}]", "steps[0].remove.services[0].x: unknown key"),
    ("steps: [{remove: {services: [a/b]}}]", "steps[0].remove.services[0]: unknown service 'a/b'"),
    ("steps: [{remove: {config: [Nope]}}]", "steps[0].remove.config[0]: unknown config key 'Nope'"),
    ("steps: [{update: {config: {A: {b: c}}}}]", "steps[0].update.config.A: expected a string"),
]


@pytest.mark.parametrize(("text", "message"), ERRORS, ids=[e[1][:60] for e in ERRORS])
def test_errors_name_the_path(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse(text)
    assert message in str(info.value)


def test_ambiguous_policy_reference() -> None:
    with pytest.raises(ScenarioError, match=r"workloads\[0\].tiers\[0\].ingress\[0\]: ambiguous policy 'same'"):
        parse(
            """
            policies: [{name: same, kind: np, namespace: a}, {name: same, kind: np, namespace: b}]
            workloads: [{name: w, tiers: [{name: t, ingress: [same]}]}]
            """
        )


def test_scenario_error_is_a_config_and_value_error() -> None:
    with pytest.raises(ScenarioError) as info:
        parse("ipsets: [{id: a, type: hash}]")
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, ValueError)
    assert err.path == "ipsets[0].type" and err.problem.startswith("bad IP set type")


def test_duplicate_keys_inside_nested_mappings_are_caught() -> None:
    with pytest.raises(ScenarioError, match="duplicate key 'id' at line 1"):
        parse("ipsets: [{id: a, id: b}]")


def test_merge_keys_may_be_overridden() -> None:
    s = parse(
        """
        workloads:
          - &w {name: cali-1, state: active}
        steps:
          - update: {workloads: [{<<: *w, state: down}]}
        """
    )
    assert only(s.steps[0].messages, "workload_endpoint_update").endpoint.state == "down"


@pytest.mark.parametrize("start_seq", [-1, True, "0", 1.0])
def test_bad_start_seq(start_seq: Any) -> None:
    with pytest.raises(ScenarioError, match="bad start_seq"):
        scenario_from_dict({}, start_seq)


def test_load_scenario_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario .*missing.yaml"):
        load_scenario(tmp_path / "missing.yaml")


def test_load_scenario_reports_yaml_position(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("ipsets:\n  - {id: a\n")
    with pytest.raises(ScenarioError, match=r"bad.yaml: invalid YAML: expected ',' or '}', .* at line 3, column 1"):
        load_scenario(path)


def test_unreadable_characters_are_reported() -> None:
    with pytest.raises(ScenarioError, match="invalid YAML: unacceptable character"):
        parse("a: \x07")


def test_yaml_tags_outside_safe_loader_are_refused() -> None:
    with pytest.raises(ScenarioError, match="invalid YAML"):
        parse("config: !!python/object/apply:os.system [echo hi]")
    assert yaml  # PyYAML is the parser


# --------------------------------------------------------------------------
# The generic filler on its own (fields no scenario section reaches).
# --------------------------------------------------------------------------


def test_fill_handles_message_valued_maps_and_doubles() -> None:
    from felixpy.feed.protofill import fill

    config = pb.ConfigUpdate()
    fill(config, {"source_to_raw_config": {1: {"source": "env", "config": {"A": 1}}}, "message": "m"}, "cfg")
    assert config.source_to_raw_config[1] == pb.RawConfig(source="env", config={"A": "1"})
    status = pb.ProcessStatusUpdate()
    fill(status, {"uptime": 3, "iso_timestamp": "2026-01-01T00:00:00Z"}, "st")
    assert status.uptime == 3.0


@pytest.mark.parametrize(
    ("message", "data", "error"),
    [
        (pb.ProcessStatusUpdate, {"uptime": "long"}, "st.uptime: expected a number, got 'long'"),
        (pb.ProcessStatusUpdate, {"uptime": True}, "st.uptime: expected a number, got True"),
        (pb.ConfigUpdate, {"source_to_raw_config": {"x": {}}}, "st.source_to_raw_config.x: expected an integer"),
        (pb.ConfigUpdate, {"source_to_raw_config": {1: []}}, "st.source_to_raw_config.1: expected a mapping"),
        (pb.ConfigUpdate, {"source_to_raw_config": [1]}, "st.source_to_raw_config: expected a mapping"),
    ],
)
def test_fill_errors(message: Any, data: dict[str, Any], error: str) -> None:
    from felixpy.feed.protofill import fill

    with pytest.raises(ScenarioError) as info:
        fill(message(), data, "st")
    assert error in str(info.value)
