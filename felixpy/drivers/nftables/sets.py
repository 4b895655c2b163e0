"""Desired nft sets of one family, and the transaction fragments that reconcile them.

This is the IP-set half of the root table (Felix's ``nftables/ipsets.go``):
managers address sets by Calico set ID; the set lives in the ``calico`` table
as ``cali40<id>`` (``:`` → ``-``).  Nothing here talks to the kernel: the root
table asks for a :class:`SetPlan` against its view of the dataplane, puts the
fragments into its one transaction (creates and member changes before the
rules, recreations after the referencing chains are flushed, deletions last)
and calls :meth:`SetPlan.commit` once the kernel accepted it.

Bad input never fails the table: a member that is malformed or of the other
family is skipped, a set whose type is unknown is skipped, a set that would
exceed its ``max_size`` keeps its previous contents (or is created empty so
that rules referencing it stay valid); each is logged with the set ID.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import structlog

from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.nftables.members import BadMember, KeyCodec, SetKind, codec_for
from felixpy.drivers.nftables.names import TABLE_NAME, family_for, set_name_for_id
from felixpy.drivers.nftables.packed import PackedMembers, pack_members, reduce_nets
from felixpy.drivers.nftables.readback import SetSnapshot
from felixpy.drivers.nftables.script import ElementsCmd

# A set's command in a plan: a dict for the set itself, members as an ElementsCmd (written from their keys).
SetCommand = dict[str, Any] | ElementsCmd

log = structlog.get_logger(__name__)

MAX_SET_DELETIONS_PER_APPLY = 500   # Felix's nftables IPSets.ApplyDeletions cap
_MAX_LOGGED_BAD = 5


@dataclass(slots=True)
class _SetState:
    meta: IPSetMetadata
    # Packed (packed.py) and immutable, replaced on every change: the dataplane view of a written set
    # (SetSnapshot.members) is this very object, not a copy.
    desired: PackedMembers

    @property
    def kind(self) -> SetKind:
        return self.desired.codec.kind

    def effective(self) -> PackedMembers:
        """What to write: nets covered by another member are left out (interval sets refuse overlaps)."""
        return reduce_nets(self.desired) if self.kind.interval else self.desired


@dataclass(slots=True)
class SetPlan:
    create: list[SetCommand] = field(default_factory=list)      # new sets + members, member deltas
    recreate: list[SetCommand] = field(default_factory=list)    # delete + add (+ members)
    delete: list[dict[str, Any]] = field(default_factory=list)
    written: dict[str, SetSnapshot] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.create or self.recreate or self.delete)


class NftSets:
    def __init__(self, ip_version: int) -> None:
        self.ip_version = ip_version
        self._family = family_for(ip_version)
        self._sets: dict[str, _SetState] = {}
        self.dirty: set[str] = set()
        self._log = log.bind(table=TABLE_NAME, ip_version=ip_version)

    # -- desired state ---------------------------------------------------------------
    def name_for(self, set_id: str) -> str:
        return set_name_for_id(set_id, self.ip_version)

    def _pack(self, set_id: str, codec: KeyCodec, members: Iterable[str]) -> PackedMembers:
        packed, bad = pack_members(codec, members)
        if bad:
            self._log.warning("Skipping invalid IP set members", set_id=set_id, num_skipped=len(bad),
                              examples=bad[:_MAX_LOGGED_BAD])
        return packed

    def add_or_replace(self, meta: IPSetMetadata, members: Iterable[str]) -> None:
        try:
            codec = codec_for(meta.type, self.ip_version)
        except BadMember as e:
            self._log.error("Skipping IP set of unsupported type", set_id=meta.set_id, error=str(e))
            return
        name = self.name_for(meta.set_id)
        packed = self._pack(meta.set_id, codec, members)
        old = self._sets.get(name)
        if len(packed) > meta.max_size:
            self._log.error("IP set exceeds its maximum size; not updating it", set_id=meta.set_id,
                            size=len(packed), max_size=meta.max_size)
            if old is not None and old.kind == codec.kind:
                return
            packed = PackedMembers(codec)
        self._sets[name] = _SetState(meta, packed)
        self.dirty.add(name)

    def add_members(self, set_id: str, members: Iterable[str]) -> None:
        name = self.name_for(set_id)
        st = self._sets.get(name)
        if st is None:
            self._log.warning("Members added to an unknown IP set; ignoring", set_id=set_id)
            return
        new = self._pack(set_id, st.desired.codec, members) - st.desired
        if len(st.desired) + len(new) > st.meta.max_size:
            self._log.error("IP set would exceed its maximum size; skipping the additions", set_id=set_id,
                            size=len(st.desired) + len(new), max_size=st.meta.max_size)
            return
        if new:
            st.desired = st.desired.union(new)     # a new object: never mutated in place
            self.dirty.add(name)

    def remove_members(self, set_id: str, members: Iterable[str]) -> None:
        name = self.name_for(set_id)
        st = self._sets.get(name)
        if st is None:
            self._log.warning("Members removed from an unknown IP set; ignoring", set_id=set_id)
            return
        gone = self._pack(set_id, st.desired.codec, members) & st.desired
        if gone:
            st.desired = st.desired - gone
            self.dirty.add(name)

    def remove(self, set_id: str) -> None:
        name = self.name_for(set_id)
        if self._sets.pop(name, None) is not None:
            self.dirty.add(name)

    def get_type_of(self, set_id: str) -> IPSetType | None:
        st = self._sets.get(self.name_for(set_id))
        return st.meta.type if st else None

    def get_desired_members(self, set_id: str) -> AbstractSet[str] | None:
        st = self._sets.get(self.name_for(set_id))
        return st.desired if st else None

    def is_desired(self, name: str) -> bool:
        return name in self._sets

    def names(self) -> Iterable[str]:
        return self._sets.keys()

    def __len__(self) -> int:
        return len(self._sets)

    # -- reconciliation --------------------------------------------------------------------
    def resync(self, dp: dict[str, SetSnapshot]) -> None:
        """After a listing: dirty is exactly what differs from the dataplane."""
        self.dirty = {n for n in dp if n not in self._sets}
        for name, st in self._sets.items():
            snap, eff = dp.get(name), st.effective()
            if snap is None or snap.kind != st.kind or snap.unparsed or snap.members != eff:
                self.dirty.add(name)
            else:  # the view shares the desired members, as after a write, and the listing's copy goes
                snap.members = eff

    def drift(self, believed: dict[str, SetSnapshot], found: dict[str, SetSnapshot]) -> tuple[int, int]:
        """(sets, members) changed behind our back (*believed* → *found*) that the next plan rewrites."""
        sets = members = 0
        for name in self.dirty:
            old, new, st = believed.get(name), found.get(name), self._sets.get(name)
            if old is None and new is None:
                continue
            if old is None or new is None or old.kind != new.kind:
                sets += 1  # created, deleted or retyped by someone else
                continue
            if old.members == new.members:
                continue
            want: AbstractSet[str] = st.effective() if st is not None else frozenset()
            members += len((old.members - new.members) & want) + len((new.members - old.members) - want)
        return sets, members

    def needs_recreate(self, dp: dict[str, SetSnapshot], full: bool) -> list[str]:
        """Desired, dirty sets that exist in the dataplane with another kind (type change)."""
        if full:
            return []
        out = []
        for name in self.dirty:
            st, snap = self._sets.get(name), dp.get(name)
            if st is not None and snap is not None and (snap.kind != st.kind or snap.unparsed):
                out.append(name)
        return out

    def _add_set(self, name: str, st: _SetState, tbl: dict[str, str]) -> list[SetCommand]:
        spec: dict[str, Any] = {**tbl, "name": name,
                                "type": st.kind.type[0] if len(st.kind.type) == 1 else list(st.kind.type)}
        if st.kind.interval:
            spec["flags"] = ["interval"]
        cmds: list[SetCommand] = [{"add": {"set": spec}}]
        eff = st.effective()
        if eff:
            cmds.append(ElementsCmd("add", tbl["family"], tbl["table"], name, eff))
        return cmds

    def plan_ahead(self, dp: dict[str, SetSnapshot], min_elements: int) -> SetPlan | None:
        """Creates and member changes of the dirty sets, for a transaction of their own ahead of the
        table's (``NftablesTable.apply_updates``); None when they come to fewer than *min_elements*
        elements (a small change stays in the table's one transaction).  Never a deletion or a type
        change: both need the rules that use the set flushed in the same transaction."""
        recreate = set(self.needs_recreate(dp, False))
        names: list[str] = []
        elements = 0
        for name in sorted(self.dirty):
            st = self._sets.get(name)
            if st is None or name in recreate:
                continue
            names.append(name)
            snap = dp.get(name)
            eff = st.effective()
            elements += len(eff) if snap is None else len(eff ^ snap.members)
        if elements < min_elements:
            return None
        return self.plan(dp, False, lambda _name: True, only=names)

    def plan(self, dp: dict[str, SetSnapshot], full: bool,
             still_referenced: Callable[[str], bool], *, only: list[str] | None = None) -> SetPlan:
        """Fragments for the dirty sets (all desired sets if *full*: the table is being recreated; just
        *only*, and no deletions, if given)."""
        plan = SetPlan()
        tbl = {"family": self._family, "table": TABLE_NAME}
        names = only if only is not None else list(self._sets) if full else list(self.dirty)
        recreate = set(self.needs_recreate(dp, full))
        for name in names:
            st = self._sets.get(name)
            snap = None if full else dp.get(name)
            if st is None:
                continue
            eff = st.effective()
            if snap is None:
                plan.create.extend(self._add_set(name, st, tbl))
            elif name in recreate:
                plan.recreate.append({"delete": {"set": {**tbl, "name": name}}})
                plan.recreate.extend(self._add_set(name, st, tbl))
            else:
                dels = snap.members - eff
                adds = eff - snap.members
                if dels:  # deletions first: a net may be replaced by one it overlaps
                    plan.create.append(ElementsCmd("delete", self._family, TABLE_NAME, name, dels))
                if adds:
                    plan.create.append(ElementsCmd("add", self._family, TABLE_NAME, name, adds))
            plan.written[name] = SetSnapshot(st.kind, eff)   # shared with the desired state (immutable)
        if not full and only is None:
            for name in sorted(n for n in self.dirty if n not in self._sets and n in dp):
                if still_referenced(name):
                    self._log.warning("IP set still referenced by a rule; deferring its deletion", set=name)
                    plan.deferred.append(name)
                elif len(plan.deleted) >= MAX_SET_DELETIONS_PER_APPLY:
                    plan.deferred.append(name)
                else:
                    plan.delete.append({"delete": {"set": {**tbl, "name": name}}})
                    plan.deleted.append(name)
        return plan

    def commit_ahead(self, plan: SetPlan) -> None:
        """A transaction carrying a :meth:`plan_ahead` succeeded: those sets are written."""
        self.dirty.difference_update(plan.written)

    def commit(self, plan: SetPlan, full: bool) -> None:
        """The transaction carrying *plan* succeeded: only deferred deletions stay dirty."""
        self.dirty = set(plan.deferred)
        if full:
            self.dirty = set()
