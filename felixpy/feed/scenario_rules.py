"""Scenario rules: YAML rule mappings → ``felix.Rule`` messages.

Owns the rule-level shorthands of the scenario format (docs/scenario-format.md):

* ``action``: allow (default), deny, pass, next-tier, log;
* ``ip_version``: 4 or 6 (or ipv4/ipv6/any);
* ``protocol`` / ``not_protocol``: a name (tcp, udp, icmp, icmpv6, sctp,
  udplite) or a number 0-255; a name is sent as ``Protocol.name``, a number as
  ``Protocol.number``, as Felix does;
* ``*_net``: a CIDR or list of CIDRs (bare addresses become /32 or /128);
* ``*_ports``: ints or ``"first:last"`` strings, or a single one of those;
* ``icmp_type`` [+ ``icmp_code``], ``not_icmp_type`` [+ ``not_icmp_code``];
* ``*_ip_set_ids``: IP set ids, which must name IP sets the scenario defines;
* ``rule_id``: when omitted, a stable 16-character id is derived from the
  rule's owner, position and content (Felix always sends one).

Every other ``felix.Rule`` field (``original_*`` selectors, service account
and HTTP matches, ``metadata``) passes through by its proto name.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from collections.abc import Callable, Mapping
from typing import Any

from felixpy.feed.protofill import (
    ScenarioError,
    as_list,
    describe,
    expect_list,
    expect_mapping,
    fill,
    index_path,
    key_path,
)
from felixpy.proto import felixbackend_pb2 as pb

ACTIONS = frozenset({"allow", "deny", "pass", "next-tier", "log"})
PROTOCOL_NAMES = frozenset({"tcp", "udp", "icmp", "icmpv6", "sctp", "udplite"})
_IP_VERSIONS: Mapping[Any, pb.IPVersion] = {
    4: pb.IPV4,
    6: pb.IPV6,
    "4": pb.IPV4,
    "6": pb.IPV6,
    "ipv4": pb.IPV4,
    "ipv6": pb.IPV6,
    "any": pb.ANY,
}
_NET_FIELDS = ("src_net", "dst_net", "not_src_net", "not_dst_net")
_PORT_FIELDS = ("src_ports", "dst_ports", "not_src_ports", "not_dst_ports")
_SET_FIELDS = (
    "src_ip_set_ids",
    "dst_ip_set_ids",
    "dst_ip_port_set_ids",
    "src_named_port_ip_set_ids",
    "dst_named_port_ip_set_ids",
    "not_src_ip_set_ids",
    "not_dst_ip_set_ids",
    "not_src_named_port_ip_set_ids",
    "not_dst_named_port_ip_set_ids",
)
_ICMP_KEYS = ("icmp_type", "icmp_code", "not_icmp_type", "not_icmp_code")
_SPECIAL = (
    ("action", "ip_version", "protocol", "not_protocol", "rule_id")
    + _NET_FIELDS
    + _PORT_FIELDS
    + _SET_FIELDS
    + _ICMP_KEYS
)
# Only reachable through icmp_type/icmp_code, so there is one way to say it.
_EXCLUDED = ("icmp_type_code", "not_icmp_type_code")

IPSetExists = Callable[[str], bool]


def parse_rules(value: Any, path: str, owner: str, ipset_exists: IPSetExists) -> list[pb.Rule]:
    """Parse a rule list; ``owner`` (e.g. ``policy default/p1 inbound``) seeds rule ids."""
    rules = []
    for i, item in enumerate(expect_list(value, path)):
        item_path = index_path(path, i)
        rules.append(parse_rule(expect_mapping(item, item_path), item_path, f"{owner}[{i}]", ipset_exists))
    return rules


def parse_rule(data: Mapping[str, Any], path: str, owner: str, ipset_exists: IPSetExists) -> pb.Rule:
    """One rule mapping → ``felix.Rule`` (see module docstring)."""
    rule = pb.Rule()
    fill(rule, data, path, exclude=_EXCLUDED, also_allowed=_SPECIAL)
    rule.action = _action(data.get("action", "allow"), key_path(path, "action"))
    if "ip_version" in data:
        rule.ip_version = _ip_version(data["ip_version"], key_path(path, "ip_version"))
    for key in ("protocol", "not_protocol"):
        if key in data:
            getattr(rule, key).CopyFrom(parse_protocol(data[key], key_path(path, key)))
    for key in _NET_FIELDS:
        if key in data:
            getattr(rule, key).extend(parse_nets(data[key], key_path(path, key)))
    for key in _PORT_FIELDS:
        if key in data:
            getattr(rule, key).extend(parse_ports(data[key], key_path(path, key)))
    for key in _SET_FIELDS:
        if key in data:
            getattr(rule, key).extend(_set_ids(data[key], key_path(path, key), ipset_exists))
    _set_icmp(rule, data, path, negated=False)
    _set_icmp(rule, data, path, negated=True)
    rule.rule_id = _rule_id(data, rule, owner, key_path(path, "rule_id"))
    return rule


def _action(value: Any, path: str) -> str:
    if not isinstance(value, str) or value.lower() not in ACTIONS:
        raise ScenarioError(path, f"bad action {describe(value)}; expected one of: {', '.join(sorted(ACTIONS))}")
    return value.lower()


def _ip_version(value: Any, path: str) -> pb.IPVersion:
    key = value.lower() if isinstance(value, str) else value
    if isinstance(key, bool) or key not in _IP_VERSIONS:
        raise ScenarioError(path, f"bad ip_version {describe(value)}; expected 4 or 6")
    return _IP_VERSIONS[key]


def parse_protocol(value: Any, path: str) -> pb.Protocol:
    """``tcp`` → Protocol(name="tcp"); ``6`` or ``"6"`` → Protocol(number=6)."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= 255:
            raise ScenarioError(path, f"bad protocol number {value}; expected 0-255")
        return pb.Protocol(number=value)
    if isinstance(value, str) and value.lower() in PROTOCOL_NAMES:
        return pb.Protocol(name=value.lower())
    names = ", ".join(sorted(PROTOCOL_NAMES))
    raise ScenarioError(path, f"bad protocol {describe(value)}; expected a number 0-255 or one of: {names}")


def parse_cidr(value: Any, path: str) -> str:
    """A CIDR (or bare address) in canonical form; host bits are cleared."""
    if not isinstance(value, str):
        raise ScenarioError(path, f"bad CIDR {describe(value)}")
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise ScenarioError(path, f"bad CIDR {describe(value)}") from None


def parse_nets(value: Any, path: str) -> list[str]:
    """A CIDR or list of CIDRs, canonicalised."""
    return [parse_cidr(v, index_path(path, i)) for i, v in enumerate(as_list(value, path))]


def parse_ports(value: Any, path: str) -> list[pb.PortRange]:
    """Ports as ints or ``"first:last"`` strings (or one of those alone)."""
    return [parse_port_range(v, index_path(path, i)) for i, v in enumerate(as_list(value, path))]


def parse_port_range(value: Any, path: str) -> pb.PortRange:
    """``80`` → 80:80, ``"1000:2000"`` → 1000:2000; ports are 0-65535, first ≤ last."""
    if isinstance(value, int) and not isinstance(value, bool):
        first = last = value
    elif isinstance(value, str):
        first, last = _split_range(value, path)
    else:
        raise ScenarioError(path, f"bad port {describe(value)}")
    if not (0 <= first <= 65535 and 0 <= last <= 65535) or first > last:
        raise ScenarioError(path, f"bad port {describe(value)}")
    return pb.PortRange(first=first, last=last)


def _split_range(text: str, path: str) -> tuple[int, int]:
    parts = text.strip().split(":")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ScenarioError(path, f"bad port {describe(text)}")
    first = int(parts[0])
    return first, int(parts[-1])


def _set_ids(value: Any, path: str, ipset_exists: IPSetExists) -> list[str]:
    ids = []
    for i, item in enumerate(as_list(value, path)):
        item_path = index_path(path, i)
        if not isinstance(item, str) or not item:
            raise ScenarioError(item_path, f"bad IP set id {describe(item)}")
        if not ipset_exists(item):
            raise ScenarioError(item_path, f"unknown IP set {item!r}")
        ids.append(item)
    return ids


def _icmp_number(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise ScenarioError(path, f"bad ICMP value {describe(value)}; expected 0-255")
    return value


def _set_icmp(rule: pb.Rule, data: Mapping[str, Any], path: str, *, negated: bool) -> None:
    prefix = "not_" if negated else ""
    type_key, code_key = f"{prefix}icmp_type", f"{prefix}icmp_code"
    if code_key in data and type_key not in data:
        raise ScenarioError(key_path(path, code_key), f"needs {type_key}")
    if type_key not in data:
        return
    icmp_type = _icmp_number(data[type_key], key_path(path, type_key))
    if code_key in data:
        code = _icmp_number(data[code_key], key_path(path, code_key))
        getattr(rule, f"{prefix}icmp_type_code").CopyFrom(pb.IcmpTypeAndCode(type=icmp_type, code=code))
    else:
        setattr(rule, type_key, icmp_type)


def _rule_id(data: Mapping[str, Any], rule: pb.Rule, owner: str, path: str) -> str:
    if "rule_id" in data:
        value = data["rule_id"]
        if not isinstance(value, str) or not value:
            raise ScenarioError(path, f"bad rule_id {describe(value)}")
        return value
    digest = hashlib.sha256(owner.encode() + b"\0" + rule.SerializeToString(deterministic=True))
    return base64.urlsafe_b64encode(digest.digest()).decode()[:16]
