"""A layer view (``filter``, ``nat``, ``mangle``, ``raw``) of the root ``calico`` table.

The rules layer is written against the iptables world, where these are four
tables with kernel chains ``INPUT``, ``FORWARD``…  In nftables mode they share
one table, so this view (Felix's ``nftables/table_layer.go``) rewrites names on
the way in: chain ``cali-x`` becomes ``<layer>-cali-x``, ``INPUT`` becomes the
base chain ``<layer>-INPUT``, jump/goto targets and verdict-map references are
namespaced the same way, and map elements' goto targets too.  Everything else
is forwarded to the root, which owns the transaction; :meth:`apply` applies
the root (any later layer's apply then finds nothing to do).

How a fresh process recognises its objects
    A layer owns nothing of its own: its chains are the root's chains whose
    names carry the ``<layer>-`` prefix, and the root
    (:mod:`felixpy.drivers.nftables.table`) recognises and sweeps them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence

from felixpy.drivers.generictables import model as m
from felixpy.drivers.generictables.table import MapMetadata
from felixpy.drivers.nftables.names import LAYERS, map_name_for, namespaced
from felixpy.drivers.nftables.shim import NftListerFactory, NftShim
from felixpy.drivers.nftables.table import NftablesTable

NS_MEMO_SIZE = 1024


class NftablesLayer:
    """Implements the Table protocol (bare names) and MapsDataplane for one layer."""

    def __init__(self, layer: str, root: NftablesTable) -> None:
        if layer not in LAYERS:
            raise ValueError(f"unknown nftables layer {layer!r}")
        self.name = layer
        self.ip_version = root.ip_version
        self.root = root
        # id(rules) -> (rules, namespaced rules); the source is kept so its id stays its own.
        self._ns_memo: dict[int, tuple[tuple[m.Rule, ...], tuple[m.Rule, ...]]] = {}

    # -- names --------------------------------------------------------------------------
    def _ns(self, name: str) -> str:
        # Interned: a chain's name and every jump/goto to it are one string.
        return sys.intern(namespaced(self.name, name))

    def _ns_action(self, action: m.Action) -> m.Action:
        if isinstance(action, m.Jump):
            return m.Jump(self._ns(action.target))
        if isinstance(action, m.Goto):
            return m.Goto(self._ns(action.target))
        return action

    def _ns_rule(self, rule: m.Rule) -> m.Rule:
        action = self._ns_action(rule.action) if rule.action is not None else None
        crits = rule.match.criteria
        if any(isinstance(c, (m.InInterfaceVMAP, m.OutInterfaceVMAP)) for c in crits):
            crits = tuple(
                dataclasses.replace(c, map_name=map_name_for(self.name, c.map_name))
                if isinstance(c, (m.InInterfaceVMAP, m.OutInterfaceVMAP)) else c
                for c in crits
            )
        if action is rule.action and crits is rule.match.criteria:
            return rule   # unchanged: keep identity
        return m.Rule(m.Match(crits), action, rule.comments)

    def _ns_rules(self, rules: Sequence[m.Rule]) -> tuple[m.Rule, ...]:
        """The rules with names namespaced; a tuple is namespaced once and its result shared.

        Endpoint chains with the same policies share one rule tuple (the rules layer memoises
        their bodies); without this each chain would get its own copy of every jump here.
        """
        if not isinstance(rules, tuple):
            return self._ns_rules_uncached(rules)
        hit = self._ns_memo.get(id(rules))
        if hit is not None and hit[0] is rules:
            return hit[1]
        out = self._ns_rules_uncached(rules)
        memo = self._ns_memo
        memo[id(rules)] = (rules, out)
        if len(memo) > NS_MEMO_SIZE:
            del memo[next(iter(memo))]
        return out

    def _ns_rules_uncached(self, rules: Sequence[m.Rule]) -> tuple[m.Rule, ...]:
        out = tuple(self._ns_rule(r) for r in rules)
        if isinstance(rules, tuple) and all(a is b for a, b in zip(out, rules)):
            return rules  # nothing renamed: keep identity
        return out

    # -- Table protocol -----------------------------------------------------------------
    def insert_or_append_rules(self, chain_name: str, rules: Sequence[m.Rule]) -> None:
        self.root.insert_or_append_rules(self._ns(chain_name), self._ns_rules(rules))

    def append_rules(self, chain_name: str, rules: Sequence[m.Rule]) -> None:
        self.root.append_rules(self._ns(chain_name), self._ns_rules(rules))

    def update_chain(self, chain: m.Chain) -> None:
        self.root.update_chain(m.Chain(self._ns(chain.name), self._ns_rules(chain.rules)))

    def update_chains(self, chains: Iterable[m.Chain]) -> None:
        for chain in chains:
            self.update_chain(chain)

    def remove_chains(self, chains: Iterable[m.Chain]) -> None:
        for chain in chains:
            self.remove_chain_by_name(chain.name)

    def remove_chain_by_name(self, name: str) -> None:
        self.root.remove_chain_by_name(self._ns(name))

    def invalidate_dataplane_cache(self, reason: str) -> None:
        self.root.invalidate_dataplane_cache(reason)

    def apply(self) -> float | None:
        return self.root.apply()

    # -- MapsDataplane --------------------------------------------------------------------
    def add_or_replace_map(self, meta: MapMetadata, members: Mapping[str, m.Action]) -> None:
        ns_members = {k: self._ns_action(a) for k, a in members.items()}
        self.root.add_or_replace_map(dataclasses.replace(meta, name=map_name_for(self.name, meta.name)),
                                     ns_members)

    def remove_map(self, name: str) -> None:
        self.root.remove_map(map_name_for(self.name, name))


def new_nftables_tables(
    ip_version: int, shim: NftShim, *, refresh_interval: float = 180.0, fully_random: bool = True,
) -> tuple[NftablesTable, dict[str, NftablesLayer]]:
    """The root table of a family plus its four layer views, keyed by layer name.

    ``refresh_interval`` is Felix's ``NftablesRefreshInterval`` (0 disables the refresh).  A shim that
    can hand out a lister (:class:`~.shim.NftListerFactory`) gets its refresh listings off the apply path.
    """
    lister = shim.lister() if isinstance(shim, NftListerFactory) else None
    root = NftablesTable(ip_version, shim, refresh_interval=refresh_interval, fully_random=fully_random,
                         lister=lister)
    return root, {layer: NftablesLayer(layer, root) for layer in LAYERS}
