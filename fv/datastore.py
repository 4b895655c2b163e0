"""Datastore builders: the scenario-format dicts (docs/scenario-format.md) FV tests describe a node with.

The node has workloads a, b and c (and, for tests that plug one in later, d),
named ``cali<name>`` on the node side, with one IPv4 and one IPv6 address each
from the FV pools 10.65.0.0/24 and fd00:65::/64.  :func:`datastore` builds a
whole datastore (what Felix's calc graph would have sent by then); the node
sends only the difference from what it sent before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

HOST = "host"
WORKLOADS: Mapping[str, tuple[str, str]] = {
    "a": ("10.65.0.2", "fd00:65::2"),
    "b": ("10.65.0.3", "fd00:65::3"),
    "c": ("10.65.0.4", "fd00:65::4"),
}
EXTRA_WORKLOADS: Mapping[str, tuple[str, str]] = {"d": ("10.65.0.5", "fd00:65::5")}
PROFILE_ALLOW = "kns.fv"


def iface(name: str) -> str:
    return f"cali{name}"


def addr(name: str, v: int) -> str:
    v4, v6 = {**WORKLOADS, **EXTRA_WORKLOADS}[name]
    return v4 if v == 4 else v6


def nets(*names: str, v: int | None = None) -> list[str]:
    """Host CIDRs of workloads; both families unless ``v`` is given (Felix sends mixed lists)."""
    versions = (4, 6) if v is None else (v,)
    return [f"{addr(n, ver)}/{32 if ver == 4 else 128}" for n in names for ver in versions]


def allow_all_profile() -> dict[str, Any]:
    return {"name": PROFILE_ALLOW, "inbound": [{"action": "allow"}], "outbound": [{"action": "allow"}]}


def policy(name: str, *, tier: str = "default", inbound: Sequence[Mapping[str, Any]] = (),
           outbound: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    return {"name": name, "tier": tier, "inbound": list(inbound), "outbound": list(outbound)}


def tier(name: str, *, ingress: Sequence[str] = (), egress: Sequence[str] = (),
         default_action: str | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"name": name, "ingress": list(ingress), "egress": list(egress)}
    if default_action:
        t["default_action"] = default_action
    return t


def workload(name: str, *, profiles: Sequence[str] = (PROFILE_ALLOW,), ingress: Sequence[str] = (),
             egress: Sequence[str] = (), tiers: Sequence[Mapping[str, Any]] = (),
             state: str = "active") -> dict[str, Any]:
    """A workload endpoint as CNI + Felix's calc graph would describe it (MAC filled in by the node)."""
    wl: dict[str, Any] = {
        "name": iface(name),
        "state": state,
        "ipv4_nets": nets(name, v=4),
        "ipv6_nets": nets(name, v=6),
        "profile_ids": list(profiles),
    }
    all_tiers = [dict(t) for t in tiers]
    if ingress or egress:
        all_tiers.append(tier("default", ingress=ingress, egress=egress))
    if all_tiers:
        wl["tiers"] = all_tiers
    return wl


def datastore(*, workloads: Iterable[Mapping[str, Any]] | None = None, policies: Iterable[Mapping[str, Any]] = (),
              ipsets: Iterable[Mapping[str, Any]] = (),
              profiles: Iterable[Mapping[str, Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """A whole datastore; by default a, b and c with the allow-all profile and no policy."""
    if workloads is None:
        workloads = [workload(n) for n in WORKLOADS]
    if profiles is None:
        profiles = [allow_all_profile()]
    return {"ipsets": [dict(i) for i in ipsets], "policies": [dict(p) for p in policies],
            "profiles": [dict(p) for p in profiles], "workloads": [dict(w) for w in workloads]}


def icmp_echo(v: int) -> dict[str, Any]:
    """Match fields for an ICMP echo request of family ``v``."""
    return {"protocol": "icmp", "icmp_type": 8} if v == 4 else {"protocol": "icmpv6", "icmp_type": 128}


def icmp_echo_reply(v: int) -> dict[str, Any]:
    return {"protocol": "icmp", "icmp_type": 0} if v == 4 else {"protocol": "icmpv6", "icmp_type": 129}
