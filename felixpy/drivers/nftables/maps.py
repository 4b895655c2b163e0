"""Verdict maps of the ``calico`` table (Felix's ``nftables/maps.go``).

A map is keyed by interface name and yields a verdict (``goto <chain>``,
``return``…).  Map elements keep their target chains alive: the root table
passes ``incref``/``decref`` callbacks so that a chain reachable only through a
map is still programmed.  As for sets, this module only plans transaction
fragments; element additions go after the chains exist, element deletions and
map deletions before the chains they point to are deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from felixpy.drivers.generictables import model as m
from felixpy.drivers.generictables.table import MapMetadata
from felixpy.drivers.nftables.names import TABLE_NAME, family_for
from felixpy.drivers.nftables.readback import MapSnapshot, Verdict, verdict_json

log = structlog.get_logger(__name__)


def verdict_for(action: m.Action) -> Verdict:
    if isinstance(action, m.Goto):
        return ("goto", action.target)
    if isinstance(action, m.Jump):
        return ("jump", action.target)
    if isinstance(action, m.Return):
        return ("return",)
    if isinstance(action, m.Accept):
        return ("accept",)
    if isinstance(action, m.Drop):
        return ("drop",)
    raise ValueError(f"action {action!r} cannot be a verdict map element")


@dataclass(slots=True)
class MapPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    recreate: list[dict[str, Any]] = field(default_factory=list)
    elements: list[dict[str, Any]] = field(default_factory=list)
    delete: list[dict[str, Any]] = field(default_factory=list)
    written: dict[str, MapSnapshot] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)


class NftMaps:
    def __init__(self, ip_version: int, incref: Callable[[str], None], decref: Callable[[str], None]) -> None:
        self._family = family_for(ip_version)
        self._incref, self._decref = incref, decref
        self._maps: dict[str, tuple[MapMetadata, dict[str, Verdict]]] = {}
        self.dirty: set[str] = set()

    def add_or_replace(self, meta: MapMetadata, members: Mapping[str, m.Action]) -> None:
        new = {k: verdict_for(a) for k, a in members.items()}
        for v in new.values():
            if len(v) == 2:
                self._incref(v[1])
        old = self._maps.get(meta.name)
        if old is not None:
            for v in old[1].values():
                if len(v) == 2:
                    self._decref(v[1])
        self._maps[meta.name] = (meta, new)
        self.dirty.add(meta.name)

    def remove(self, name: str) -> None:
        old = self._maps.pop(name, None)
        if old is not None:
            for v in old[1].values():
                if len(v) == 2:
                    self._decref(v[1])
            self.dirty.add(name)

    def is_desired(self, name: str) -> bool:
        return name in self._maps

    def __len__(self) -> int:
        return len(self._maps)

    def _kind_ok(self, meta: MapMetadata, snap: MapSnapshot) -> bool:
        return snap.key_type == meta.key_type and snap.data_type == "verdict" and not snap.unparsed

    def resync(self, dp: dict[str, MapSnapshot]) -> None:
        self.dirty = {n for n in dp if n not in self._maps}
        for name, (meta, elems) in self._maps.items():
            snap = dp.get(name)
            if snap is None or not self._kind_ok(meta, snap) or snap.elements != elems:
                self.dirty.add(name)

    def needs_recreate(self, dp: dict[str, MapSnapshot], full: bool) -> list[str]:
        if full:
            return []
        return [n for n in self.dirty if n in self._maps and n in dp and not self._kind_ok(self._maps[n][0], dp[n])]

    def plan(self, dp: dict[str, MapSnapshot], full: bool) -> MapPlan:
        plan = MapPlan()
        tbl = {"family": self._family, "table": TABLE_NAME}
        recreate = set(self.needs_recreate(dp, full))
        for name in (list(self._maps) if full else list(self.dirty)):
            if name not in self._maps:
                if not full and name in dp:
                    plan.delete.append({"delete": {"map": {**tbl, "name": name}}})
                    plan.deleted.append(name)
                continue
            meta, elems = self._maps[name]
            snap = None if full else dp.get(name)
            spec = {"add": {"map": {**tbl, "name": name, "type": meta.key_type, "map": "verdict"}}}
            if snap is None or name in recreate:
                if snap is None:
                    plan.create.append(spec)
                else:
                    plan.recreate.extend([{"delete": {"map": {**tbl, "name": name}}}, spec])
                adds = elems
            else:
                stale = [k for k, v in snap.elements.items() if elems.get(k) != v]
                if stale:
                    plan.elements.append({"delete": {"element": {**tbl, "name": name, "elem": stale}}})
                adds = {k: v for k, v in elems.items() if snap.elements.get(k) != v}
            if adds:
                plan.elements.append({"add": {"element": {**tbl, "name": name,
                                                          "elem": [[k, verdict_json(v)] for k, v in adds.items()]}}})
            plan.written[name] = MapSnapshot(meta.key_type, "verdict", dict(elems))
        return plan

    def commit(self) -> None:
        self.dirty = set()
