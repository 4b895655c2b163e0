"""Parse a listed ``calico`` table into what identifies our state (pure functions).

Only what the reconciliation needs is kept: per chain its base-chain shape and
the ``cali:`` hash of each rule (``""`` for a rule without one — not ours);
per set its kind and members (packed, see :mod:`.packed`); per
verdict map its key type and elements; and any other object, which is not ours
and will be deleted.  Rule bodies are never parsed: as in Felix, the hash in
the comment is the identity of a rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from felixpy.drivers.nftables.members import KeyCodec, SetKind, codec_for_kind, member_from_element
from felixpy.drivers.nftables.names import BaseChainSpec, hash_from_comment
from felixpy.drivers.nftables.packed import PackedMembers

Verdict = tuple[str, ...]  # ("goto", chain) / ("jump", chain) / ("return",) ...


@dataclass(slots=True)
class ChainSnapshot:
    base: BaseChainSpec | None = None
    hashes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class SetSnapshot:
    kind: SetKind | None            # None: flags or type we never write
    # Immutable: PackedMembers (a written set's are the desired ones), or for a listed set of another kind
    # or with an element of a shape we never write (a range) a frozenset of canonical strings.
    members: AbstractSet[str]
    unparsed: int = 0               # elements we could not read back


@dataclass(slots=True)
class MapSnapshot:
    key_type: str
    data_type: str
    elements: dict[str, Verdict]
    unparsed: int = 0


@dataclass(slots=True)
class TableSnapshot:
    chains: dict[str, ChainSnapshot] = field(default_factory=dict)
    sets: dict[str, SetSnapshot] = field(default_factory=dict)
    maps: dict[str, MapSnapshot] = field(default_factory=dict)
    others: list[tuple[str, str]] = field(default_factory=list)   # (kind, name)

    @property
    def num_rules(self) -> int:
        return sum(len(c.hashes) for c in self.chains.values())


OBJECT_KINDS_WE_DELETE = ("flowtable", "counter", "quota", "limit", "ct helper", "ct timeout",
                          "ct expectation", "secmark", "synproxy")


def _set_kind(obj: dict[str, Any]) -> SetKind | None:
    typ = obj.get("type")
    types = tuple(typ) if isinstance(typ, list) else (typ,) if isinstance(typ, str) else ()
    flags = set(obj.get("flags", ()))
    if not types or flags - {"interval"} or any(k in obj for k in ("timeout", "gc-interval", "size")):
        return None
    return SetKind(types, "interval" in flags)


def _set_members(elems: Sequence[Any], kind: SetKind | None, ip_version: int) -> tuple[AbstractSet[str], int]:
    """A listed set's members and the number of its elements we could not read.  Packed when the set is
    of a kind we write and every element of a shape we write; else canonical strings (a foreign range as
    ``a-b``), which never equal what we want, so the set is rewritten."""
    codec = codec_for_kind(kind)
    if codec is not None and codec.ip_version == ip_version:
        keys = _keys(codec, elems)
        if keys is not None:
            return PackedMembers.from_keys(codec, keys), 0
    return _member_strings(elems, ip_version)


def _keys(codec: KeyCodec, elems: Sequence[Any]) -> list[bytes] | None:
    keys = []
    for e in elems:
        key = codec.key_from_element(e)
        if key is None:
            return None
        keys.append(key)
    return keys


def _member_strings(elems: Sequence[Any], ip_version: int) -> tuple[frozenset[str], int]:
    members: set[str] = set()
    unparsed = 0
    for e in elems:
        mem = member_from_element(e, ip_version)
        if mem is None:
            unparsed += 1
        else:
            members.add(mem)
    return frozenset(members), unparsed


def verdict_from_json(v: Any) -> Verdict | None:
    if not isinstance(v, dict) or len(v) != 1:
        return None
    (kind, arg), = v.items()
    if kind in ("goto", "jump") and isinstance(arg, dict) and isinstance(arg.get("target"), str):
        return (kind, arg["target"])
    if kind in ("accept", "drop", "return", "continue") and arg is None:
        return (kind,)
    return None


def verdict_json(v: Verdict) -> dict[str, Any]:
    if len(v) == 2:
        return {v[0]: {"target": v[1]}}
    return {v[0]: None}


def parse_table(objs: Iterable[dict[str, Any]], ip_version: int) -> TableSnapshot:
    snap = TableSnapshot()
    chains = snap.chains
    for obj in objs:
        if "rule" in obj:
            r = obj["rule"]
            chain = chains.get(r["chain"])
            if chain is None:
                chain = chains[r["chain"]] = ChainSnapshot()
            chain.hashes.append(hash_from_comment(r.get("comment")))
        elif "chain" in obj:
            c = obj["chain"]
            base = None
            if "hook" in c:
                base = BaseChainSpec(c.get("type", ""), c["hook"], int(c.get("prio", 0)), c.get("policy", "accept"))
            existing = chains.get(c["name"])
            if existing is None:
                chains[c["name"]] = ChainSnapshot(base)
            else:
                existing.base = base
        elif "set" in obj:
            s = obj["set"]
            set_kind = _set_kind(s)
            snap.sets[s["name"]] = SetSnapshot(set_kind, *_set_members(s.get("elem", ()), set_kind, ip_version))
        elif "map" in obj:
            mp = obj["map"]
            elements: dict[str, Verdict] = {}
            unparsed = 0
            for e in mp.get("elem", ()):
                verdict = verdict_from_json(e[1]) if isinstance(e, list) and len(e) == 2 else None
                if verdict is None or not isinstance(e[0], str):
                    unparsed += 1
                else:
                    elements[e[0]] = verdict
            key = mp.get("type")
            snap.maps[mp["name"]] = MapSnapshot(key if isinstance(key, str) else repr(key),
                                                str(mp.get("map")), elements, unparsed)
        else:
            for kind in OBJECT_KINDS_WE_DELETE:
                if kind in obj:
                    snap.others.append((kind, obj[kind]["name"]))
    return snap


# ------------------------------------------------------------------------------------ wire form
# A snapshot as plain JSON values, for a listing parsed in a child process (:mod:`.snapshotworker`): the
# child holds nft's JSON (27 MB and ~500 MiB of objects at 135k rules) and sends only this — per chain
# its base spec and rule hashes, per set its kind and members (packed ones as one base64 string of their
# keys: the daemon decodes no member string at a restart), per map its elements.  The form is numbered:
# one from another version of this code (members as lists of strings, before 2) is refused, as a torn one.
WIRE_FORM = 2


def snapshot_to_wire(snap: TableSnapshot) -> dict[str, Any]:
    def base(b: BaseChainSpec | None) -> list[Any] | None:
        return None if b is None else [b.type, b.hook, b.prio, b.policy]

    return {
        "form": WIRE_FORM,
        "chains": {n: [base(c.base), c.hashes] for n, c in snap.chains.items()},
        "sets": {n: [None if s.kind is None else [list(s.kind.type), s.kind.interval], _members_to_wire(s.members),
                     s.unparsed]
                 for n, s in snap.sets.items()},
        "maps": {n: [m.key_type, m.data_type, {k: list(v) for k, v in m.elements.items()}, m.unparsed]
                 for n, m in snap.maps.items()},
        "others": [list(o) for o in snap.others],
    }


def _members_to_wire(members: AbstractSet[str]) -> str | list[str]:
    return members.to_wire() if isinstance(members, PackedMembers) else sorted(members)


def _members_from_wire(kind: SetKind | None, members: Any) -> AbstractSet[str]:
    if isinstance(members, list):
        return frozenset(members)
    codec = codec_for_kind(kind)
    if codec is None or not isinstance(members, str):
        raise ValueError(f"packed members for a set of kind {kind!r}")
    return PackedMembers.from_wire(codec, members)


def snapshot_from_wire(wire: dict[str, Any]) -> TableSnapshot:
    """The snapshot :func:`snapshot_to_wire` sent; ValueError, KeyError or TypeError for anything else."""
    if wire.get("form") != WIRE_FORM:
        raise ValueError(f"a snapshot of form {wire.get('form')!r}, not {WIRE_FORM}")
    snap = TableSnapshot()
    for name, (base, hashes) in wire["chains"].items():
        snap.chains[name] = ChainSnapshot(None if base is None else BaseChainSpec(base[0], base[1], int(base[2]), base[3]),
                                          list(hashes))
    for name, (kind_wire, members, unparsed) in wire["sets"].items():
        kind = None if kind_wire is None else SetKind(tuple(kind_wire[0]), bool(kind_wire[1]))
        snap.sets[name] = SetSnapshot(kind, _members_from_wire(kind, members), int(unparsed))
    for name, (key_type, data_type, elements, unparsed) in wire["maps"].items():
        snap.maps[name] = MapSnapshot(key_type, data_type, {k: tuple(v) for k, v in elements.items()}, int(unparsed))
    snap.others = [(kind, name) for kind, name in wire["others"]]
    return snap
