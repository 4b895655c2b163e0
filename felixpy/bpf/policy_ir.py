"""The policy program generator's input: typed, frozen, hashable values.

This is the shape Felix's ``polprog.Rules`` has, with each proto ``Rule`` normalised (action
names folded, protocol names resolved to numbers, ports as ranges).  :mod:`felixpy.bpf.from_proto`
builds it from ``felixbackend`` messages; tests and benchmarks build it directly.  Because
every value is frozen and hashable, an endpoint's whole :class:`PolicySet` is a cache key:
endpoints with identical policy share one loaded program.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
from dataclasses import dataclass, field

PROTOCOL_NUMBERS = {"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58, "sctp": 132, "udplite": 136}


class Action(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"
    PASS = "pass"  # "next-tier"
    LOG = "log"

    @classmethod
    def parse(cls, s: str) -> Action:
        s = s.lower()
        if s in ("", "allow"):
            return cls.ALLOW
        if s in ("pass", "next-tier"):
            return cls.PASS
        return cls(s)


@dataclass(frozen=True, slots=True)
class PortRange:
    first: int
    last: int

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last <= 65535:
            raise ValueError(f"bad port range {self.first}-{self.last}")


def ports(*specs: int | tuple[int, int]) -> tuple[PortRange, ...]:
    """Convenience: ports(80, (8000, 8080))."""
    return tuple(PortRange(s, s) if isinstance(s, int) else PortRange(*s) for s in specs)


@dataclass(frozen=True, slots=True)
class Rule:
    action: Action = Action.ALLOW
    ip_version: int | None = None  # 4 / 6 / None = both
    protocol: int | None = None
    not_protocol: int | None = None
    src_nets: tuple[str, ...] = ()
    not_src_nets: tuple[str, ...] = ()
    dst_nets: tuple[str, ...] = ()
    not_dst_nets: tuple[str, ...] = ()
    src_ip_sets: tuple[str, ...] = ()
    not_src_ip_sets: tuple[str, ...] = ()
    dst_ip_sets: tuple[str, ...] = ()
    not_dst_ip_sets: tuple[str, ...] = ()
    dst_ip_port_sets: tuple[str, ...] = ()
    src_ports: tuple[PortRange, ...] = ()
    not_src_ports: tuple[PortRange, ...] = ()
    dst_ports: tuple[PortRange, ...] = ()
    not_dst_ports: tuple[PortRange, ...] = ()
    src_named_port_ip_sets: tuple[str, ...] = ()
    not_src_named_port_ip_sets: tuple[str, ...] = ()
    dst_named_port_ip_sets: tuple[str, ...] = ()
    not_dst_named_port_ip_sets: tuple[str, ...] = ()
    icmp_type: int | None = None
    icmp_code: int | None = None
    not_icmp_type: int | None = None
    not_icmp_code: int | None = None
    rule_id: str = ""

    def ip_sets(self) -> set[str]:
        return {*self.src_ip_sets, *self.not_src_ip_sets, *self.dst_ip_sets, *self.not_dst_ip_sets,
                *self.dst_ip_port_sets, *self.src_named_port_ip_sets,
                *self.not_src_named_port_ip_sets, *self.dst_named_port_ip_sets,
                *self.not_dst_named_port_ip_sets}

    def for_family(self, v6: bool) -> Rule | None:
        """This rule as it applies to one IP family, or None if it cannot match there.

        As the iptables renderer: skip on an ip_version mismatch; filter CIDR lists to the
        family; a positive CIDR list that becomes empty drops the rule; a negated catch-all
        CIDR drops it too.  A pure function of the value, memoised (bounded): every program
        load of a policy change converts the same unchanged rules again."""
        return _rule_for_family(self, v6)

    def _for_family(self, v6: bool) -> Rule | None:
        fam = 6 if v6 else 4
        if self.ip_version is not None and self.ip_version != fam:
            return None
        out: dict[str, tuple[str, ...]] = {}
        for name in ("src_nets", "not_src_nets", "dst_nets", "not_dst_nets"):
            nets = getattr(self, name)
            kept = tuple(n for n in nets if ipaddress.ip_network(n, strict=False).version == fam)
            if nets and not kept and not name.startswith("not_"):
                return None
            if name.startswith("not_") and any(
                    ipaddress.ip_network(n, strict=False).prefixlen == 0 for n in kept):
                return None
            out[name] = kept
        from dataclasses import replace

        return replace(self, **out)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=8192)
def _rule_for_family(rule: Rule, v6: bool) -> Rule | None:
    return rule._for_family(v6)


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    rules: tuple[Rule, ...] = ()
    staged: bool = False


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    policies: tuple[Policy, ...] = ()
    default_action: Action = Action.DENY  # PASS disables the end-of-tier drop

    @property
    def end_action(self) -> Action:
        if self.default_action is Action.PASS:
            return Action.PASS
        if self.policies and all(p.staged for p in self.policies):
            return Action.PASS
        return Action.DENY


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicySet:
    """Everything one endpoint's policy program for one direction enforces (Felix's
    ``polprog.Rules``).

    Workload: ``tiers`` then ``profiles`` on the post-NAT destination.  Host policy, on a host
    interface (``for_host_interface``) or from a ``*`` host endpoint on a workload interface:
    ``host_pre_dnat_tiers`` (pre-NAT destination; end of tier = pass; allow skips the other
    host policy), then, for traffic to/from the host itself, ``host_normal_tiers`` +
    ``host_profiles`` unless ``suppress_normal_host_policy``, and for forwarded traffic
    ``host_forward_tiers``.  ``for_xdp``: only ``host_normal_tiers`` (the untracked policy) is
    used, and traffic nothing matched passes.

    ``suppress_normal_host_policy`` defaults to True, Felix's setting for workloads (always for
    host->workload, and for workload->host unless DefaultEndpointToHostAction is RETURN); host
    interfaces must set it False."""

    tiers: tuple[Tier, ...] = ()
    profiles: tuple[Profile, ...] = ()
    for_host_interface: bool = False
    host_pre_dnat_tiers: tuple[Tier, ...] = ()
    host_forward_tiers: tuple[Tier, ...] = ()
    host_normal_tiers: tuple[Tier, ...] = ()
    host_profiles: tuple[Profile, ...] = ()
    suppress_normal_host_policy: bool = True
    for_xdp: bool = False
    # Computed once per object (the value is immutable): the endpoint driver keys its loaded
    # programs by the set, once per policy slot, and the manager hands one shared object to every
    # endpoint with the same policy, so a deep hash or walk per slot was most of the slot's cost.
    # Not part of the value: no init, repr (the program names hash the repr) or comparison.
    _hash: int = field(default=0, init=False, repr=False, compare=False)
    _ip_sets: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        h = self._hash
        if not h:
            h = hash((self.tiers, self.profiles, self.for_host_interface, self.host_pre_dnat_tiers,
                      self.host_forward_tiers, self.host_normal_tiers, self.host_profiles,
                      self.suppress_normal_host_policy, self.for_xdp)) or 1
            object.__setattr__(self, "_hash", h)
        return h

    def all_tiers(self) -> tuple[Tier, ...]:
        return (*self.host_pre_dnat_tiers, *self.host_forward_tiers, *self.host_normal_tiers,
                *self.tiers)

    def ip_sets(self) -> frozenset[str]:
        got = self._ip_sets
        if got is None:
            out: set[str] = set()
            for t in self.all_tiers():
                for p in t.policies:
                    for r in p.rules:
                        out |= r.ip_sets()
            for pr in (*self.profiles, *self.host_profiles):
                for r in pr.rules:
                    out |= r.ip_sets()
            got = frozenset(out)
            object.__setattr__(self, "_ip_sets", got)
        return got

    def num_rules(self) -> int:
        return (sum(len(p.rules) for t in self.all_tiers() for p in t.policies)
                + sum(len(p.rules) for p in (*self.profiles, *self.host_profiles)))


DENY_ALL = PolicySet()
ALLOW_ALL = PolicySet(profiles=(Profile("allow-all", (Rule(Action.ALLOW),)),))
