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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, Union

from felixpy.drivers.generictables.model import Action, Criterion
from felixpy.explain.packet import PROTOCOL_NAMES

V = TypeVar("V")
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
    """Chain name → rules, parsed on first use.

    The raw form comes from what a full dump left in ``raw``, or — when ``fetch`` is
    given — from the kernel chain by chain (``iptables -S <chain>``, ``nft list chain``),
    so a large ruleset is read only where the packet goes.
    """

    def __init__(self, raw: Mapping[str, object], parse: Callable[[str, object], list[KRule]],
                 fetch: Callable[[str], object | None] | None = None) -> None:
        self._raw = dict(raw)
        self._parse = parse
        self._fetch = fetch
        self._missing: set[str] = set()
        self._parsed: dict[str, list[KRule]] = {}

    def _raw_of(self, name: str) -> object | None:
        raw = self._raw.get(name)
        if raw is None and self._fetch is not None and name not in self._missing:
            raw = self._fetch(name)
            if raw is None:
                self._missing.add(name)
            else:
                self._raw[name] = raw
        return raw

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._raw_of(name) is not None

    def names(self) -> list[str]:
        """The chains known so far (all of them after a full dump)."""
        return list(self._raw)

    def get(self, name: str) -> list[KRule] | None:
        rules = self._parsed.get(name)
        if rules is None:
            raw = self._raw_of(name)
            if raw is None:
                return None
            rules = self._parsed[name] = self._parse(name, raw)
        return rules


class FetchingMap(Mapping[str, V]):
    """A read-only mapping whose values are fetched (and cached) on first lookup."""

    def __init__(self, fetch: Callable[[str], V | None]) -> None:
        self._fetch = fetch
        self._got: dict[str, V | None] = {}

    def __getitem__(self, key: str) -> V:
        if key not in self._got:
            self._got[key] = self._fetch(key)
        value = self._got[key]
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter([k for k, v in self._got.items() if v is not None])

    def __len__(self) -> int:
        return sum(1 for v in self._got.values() if v is not None)


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
            return f"{ip},{PROTOCOL_NAMES.get(proto, proto)}:{port}"
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

    hook_source: Callable[[str], list[HookEntry]] | None = None

    def hook_chains(self, hook: str) -> Sequence[HookEntry]:
        if hook not in self.hooks and self.hook_source is not None:
            self.hooks[hook] = self.hook_source(hook)
        return self.hooks.get(hook, ())
