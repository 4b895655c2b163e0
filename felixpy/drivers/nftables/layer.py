"""A layer view (``filter``, ``nat``, ``mangle``, ``raw``) of the root ``calico`` table.

The rules layer is written against the iptables world, where these are four
tables with kernel chains ``INPUT``, ``FORWARD``…  In nftables mode they share
one table, so this view (Felix's ``nftables/table_layer.go``) rewrites names on
the way in: chain ``cali-x`` becomes ``<layer>-cali-x``, ``INPUT`` becomes the
base chain ``<layer>-INPUT``, jump/goto targets and verdict-map references are
namespaced the same way, and map elements' goto targets too.  Everything else
is forwarded to the root, which owns the transaction; :meth:`apply` applies
the root (any later layer's apply then finds nothing to do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from felixpy.drivers.generictables import model as m
from felixpy.drivers.generictables.table import MapMetadata
from felixpy.drivers.nftables.names import LAYERS, map_name_for, namespaced
from felixpy.drivers.nftables.table import NftablesTable


class NftablesLayer:
    """Implements the Table protocol (bare names) and MapsDataplane for one layer."""

    def __init__(self, layer: str, root: NftablesTable) -> None:
        if layer not in LAYERS:
            raise ValueError(f"unknown nftables layer {layer!r}")
        self.name = layer
        self.ip_version = root.ip_version
        self.root = root

    # -- names --------------------------------------------------------------------------
    def _ns(self, name: str) -> str:
        return namespaced(self.name, name)

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
        return tuple(self._ns_rule(r) for r in rules)

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
