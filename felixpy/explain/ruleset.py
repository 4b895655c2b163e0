"""What a reader hands the evaluator: chains of typed rules, hooks, IP sets and verdict maps.

Criteria and actions are those of :mod:`felixpy.drivers.generictables.model` (the
values felixpy renders), so one evaluator serves every backend.  What a parser
cannot map onto them becomes :class:`UnknownMatch` / :class:`UnknownAction` and the
explanation says so rather than guessing.  Rules are parsed lazily, chain by chain,
as the packet reaches them: a node with 100,000 rules is answered by parsing the few
hundred the packet meets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

from felixpy.drivers.generictables.model import Action, Criterion

HOOKS = ("prerouting", "input", "forward", "output", "postrouting")


@dataclass(frozen=True, slots=True)
class UnknownMatch:
    """A criterion explain cannot evaluate (the text as the tool printed it)."""

    text: str


@dataclass(frozen=True, slots=True)
class UnknownAction:
    text: str


@dataclass(frozen=True, slots=True)
class VerdictMapAction:
    """nftables ``<iifname|oifname> vmap @map``: a goto/jump per interface, else fall through."""

    key: str        # "iifname" | "oifname"
    map_name: str


AnyCriterion = Union[Criterion, UnknownMatch]
AnyAction = Union[Action, UnknownAction, VerdictMapAction]


@dataclass(frozen=True, slots=True)
class KRule:
    """One rule as read back: position (1-based), criteria, action, the ``cali:`` hash, comments."""

    position: int
    criteria: tuple[AnyCriterion, ...]
    action: AnyAction | None
    hash: str = ""
    comments: tuple[str, ...] = ()
    text: str = ""


@dataclass(frozen=True, slots=True)
class HookEntry:
    """A base chain at a hook: ``label`` as an operator reads it (``filter FORWARD``)."""

    label: str
    chain: str
    priority: int
    policy: str = "accept"   # "accept" | "drop"


class LazyChains:
    """Chain name → rules, parsed on first use from whatever the reader kept."""

    def __init__(self, raw: Mapping[str, object], parse: Callable[[str, object], list[KRule]]) -> None:
        self._raw = raw
        self._parse = parse
        self._parsed: dict[str, list[KRule]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._raw

    def names(self) -> list[str]:
        return list(self._raw)

    def get(self, name: str) -> list[KRule] | None:
        rules = self._parsed.get(name)
        if rules is None:
            raw = self._raw.get(name)
            if raw is None:
                return None
            rules = self._parsed[name] = self._parse(name, raw)
        return rules


Member = tuple[str, object]  # ("net", IPv4Network) / ("ipport", (ip, proto, port))


@dataclass(slots=True)
class IPSetContents:
    """An IP set's kind and members, indexed for membership tests."""

    name: str
    kind: str                                    # "net" | "ip" | "ipport"
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = field(default_factory=list)
    ipports: set[tuple[str, int, int]] = field(default_factory=set)   # (ip text, proto, port)

    def contains_ip(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        """The member that matched (text), or None."""
        for net in self.nets:
            if net.version == ip.version and ip in net:
                return str(net) if net.num_addresses > 1 else str(net.network_address)
        return None

    def contains_ipport(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, proto: int,
                        port: int) -> str | None:
        if (ip.compressed, proto, port) in self.ipports:
            return f"{ip},{proto}:{port}"
        return None


SetLookup = Callable[[str], "IPSetContents | None"]


@dataclass(slots=True)
class Ruleset:
    """One IP family's rules as one backend holds them.

    ``resolve(current_chain, target)`` names the chain a jump goes to (iptables
    targets are relative to the table; nft names are global in the table).
    """

    backend: str
    ip_version: int
    chains: LazyChains
    hooks: dict[str, list[HookEntry]]
    sets: SetLookup
    maps: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    resolve: Callable[[str, str], str] = lambda current, target: target
    display: Callable[[str], str] = lambda name: name
    local_addrs: frozenset[str] = frozenset()
    notes: list[str] = field(default_factory=list)

    def hook_chains(self, hook: str) -> Sequence[HookEntry]:
        return self.hooks.get(hook, ())
