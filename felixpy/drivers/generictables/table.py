"""The Table protocol both *tables backends implement, and the MapsDataplane protocol (nft verdict maps).

Contract (after Felix's ``generictables.Table``):

* Update methods only record desired state; nothing reaches the kernel until
  :meth:`Table.apply`.
* Chains named with our prefixes are owned outright and reconciled exactly.
  Into kernel-owned chains (``INPUT``, ``FORWARD``…) a table only inserts (or
  appends, per ``ChainInsertMode``) its own rules, recognised by hash comment.
* A chain is programmed only while it is *referenced*: from a rule inserted or
  appended into a kernel chain, from another programmed chain (jump/goto), or
  from a verdict-map element (nftables); unreferenced chains are remembered
  and written once something refers to them.
* ``apply()`` reconciles in one transaction per table and returns the delay
  (seconds) after which it wants to be called again, or ``None``.  Persistent
  failure after the backend's retries raises ``FatalDataplaneError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from felixpy.drivers.generictables.model import Action, Chain, Rule


@runtime_checkable
class Table(Protocol):
    name: str
    ip_version: int

    def insert_or_append_rules(self, chain_name: str, rules: Sequence[Rule]) -> None: ...

    def append_rules(self, chain_name: str, rules: Sequence[Rule]) -> None: ...

    def update_chain(self, chain: Chain) -> None: ...

    def update_chains(self, chains: Iterable[Chain]) -> None: ...

    def remove_chains(self, chains: Iterable[Chain]) -> None: ...

    def remove_chain_by_name(self, name: str) -> None: ...

    def invalidate_dataplane_cache(self, reason: str) -> None: ...

    def apply(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class MapMetadata:
    """An nftables verdict map keyed by interface name (e.g. the workload dispatch map)."""

    name: str
    key_type: str = "ifname"


@runtime_checkable
class MapsDataplane(Protocol):
    """nftables verdict maps: ``members`` maps a key (interface) to a Goto/Jump action."""

    def add_or_replace_map(self, meta: MapMetadata, members: Mapping[str, Action]) -> None: ...

    def remove_map(self, name: str) -> None: ...
