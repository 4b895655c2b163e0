"""A policy program's *source*: the input it was built from, as ``felixpy explain`` reads it back
(:func:`parse_source`) and a restart recognises the program by (``PolicyPrograms.adopt`` compares
:func:`recorded_parts` with :func:`input_text`); and where the sources live (:class:`SourceStore`).

A source is JSON, zlib-compressed: the format, program name, hook, IP version, the IP-set name -> id
map the program embeds and the :class:`PolicySet` (:func:`input_text`, in a fixed key order), then the
generator's fingerprint and each part's instruction count and kernel tag (:func:`source_doc`).  In
the kernel a source is ``<pin root>/felixpy-policy/<program name>``, a pinned one-entry array map
(:class:`PinnedSources`: bpffs refuses regular files, ``open(O_CREAT)`` is EPERM); tests and a
process without a pin root use :class:`MemorySources`.  How a fresh process recognises one as ours:
its directory and its map's name (``fpy_polsrc``); ``felixpy`` cleanup removes the directory.

Sources are made on the loop's thread and on the policy writer's thread (``PolicyPrograms``'
background flushes): the policy-set text cache is locked.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import threading
import zlib
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Protocol
from collections.abc import Mapping

from felixpy.bpf import policy_ir as ir
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError
from felixpy.bpf.policy_ir import PolicySet

SOURCE_DIR = "felixpy-policy"
SOURCE_FORMAT = 1
_SOURCE_MAP_NAME = "fpy_polsrc"


_SCALARS = (str, int, bool, float, type(None))
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # IR dataclass -> its field names, in order


_RULE_FIELDS = tuple(f.name for f in fields(ir.Rule) if f.init)
_RULE_PORT_FIELDS = tuple(n for n in _RULE_FIELDS if n.endswith("_ports"))


def _plain_rule(r: ir.Rule) -> dict[str, Any]:
    """A rule as :func:`_plain` gives any dataclass, without a call per field: the rules are most of
    a policy set, and most of their fields are empty tuples or None, which JSON takes as they are."""
    d = {n: getattr(r, n) for n in _RULE_FIELDS}
    d["action"] = r.action.value
    for n in _RULE_PORT_FIELDS:
        if d[n]:
            d[n] = [{"first": p.first, "last": p.last} for p in d[n]]
    return d


def _plain(v: Any) -> Any:
    """``v`` as JSON-able values (dataclasses as dicts of every field, enums as values; tuples of
    scalars are left as they are, JSON writes them as lists).  Called once per program load over
    the whole PolicySet, so the walk avoids ``dataclasses.fields`` per object and a call per field
    of a rule (they dominated a policy change's source writes)."""
    cls = type(v)
    if cls in _SCALARS:
        return v
    if cls is ir.Rule:
        return _plain_rule(v)
    if cls is ir.Action:
        return v.value
    if cls is tuple:
        return [_plain(x) for x in v]
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if is_dataclass(v) and not isinstance(v, type):
            names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(v) if f.init)  # the value, not caches
        elif isinstance(v, enum.Enum):
            return v.value
        elif isinstance(v, tuple):
            return [_plain(x) for x in v]
        else:
            return v
    return {n: _plain(getattr(v, n)) for n in names}


_IR_CLASSES: dict[str, type] = {"tiers": ir.Tier, "host_pre_dnat_tiers": ir.Tier, "host_forward_tiers": ir.Tier,
                                "host_normal_tiers": ir.Tier, "policies": ir.Policy, "rules": ir.Rule,
                                "profiles": ir.Profile, "host_profiles": ir.Profile}
_PORT_FIELDS = frozenset({"src_ports", "not_src_ports", "dst_ports", "not_dst_ports"})


def _build(cls: type, d: Mapping[str, Any]) -> Any:
    kw: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in d or not f.init:
            continue
        v = d[f.name]
        if f.name in _IR_CLASSES:
            v = tuple(_build(_IR_CLASSES[f.name], x) for x in v)
        elif f.name in _PORT_FIELDS:
            v = tuple(ir.PortRange(int(x["first"]), int(x["last"])) for x in v)
        elif f.name in ("action", "default_action"):
            v = ir.Action(v)
        elif isinstance(v, list):
            v = tuple(v)
        kw[f.name] = v
    return cls(**kw)


_JSON = json.JSONEncoder(separators=(",", ":")).encode
_POLICY_TEXT_MAX = 32  # the programs of one policy set are loaded one after another
_policy_texts: dict[PolicySet, str] = {}  # bounded; oldest dropped first
_policy_texts_lock = threading.Lock()  # (sources are made on the loop's thread and the writer's)


def _policy_text(ps: PolicySet) -> str:
    """``ps`` as its source's JSON text (``_plain``), once per distinct policy set: the four programs
    of an endpoint's policy (two hooks, two families) and a restart's adopt share one walk."""
    text = _policy_texts.get(ps)
    if text is None:
        text = _JSON(_plain(ps))
        with _policy_texts_lock:
            if len(_policy_texts) >= _POLICY_TEXT_MAX:
                del _policy_texts[next(iter(_policy_texts))]
            _policy_texts[ps] = text
    return text


def input_text(ps: PolicySet, *, name: str, hook: int, v6: bool, ipset_ids: Mapping[str, int]) -> str:
    """The input part of a source as JSON text without its closing brace (format, program name, hook,
    IP version, IP-set ids, the policy set: :func:`parse_source` reads them back), as
    :func:`source_doc` writes it first and :func:`recorded_parts` compares it."""
    return (f'{{"format":{SOURCE_FORMAT},"program":{_JSON(name)},"hook":{int(hook)},"ip_version":{6 if v6 else 4},'
            f'"ip_set_ids":{_JSON(dict(sorted(ipset_ids.items())))},"policy_set":{_policy_text(ps)}')


def source_doc(ps: PolicySet, *, name: str, hook: int, v6: bool, ipset_ids: Mapping[str, int],
               generator: str = "", insn_counts: list[int] | None = None, tags: list[bytes] | None = None) -> bytes:
    """A program's source as explain reads it back (:func:`parse_source`), and as a restart
    recognises the program by (:meth:`PolicyPrograms.adopt`)."""
    text = (input_text(ps, name=name, hook=hook, v6=v6, ipset_ids=ipset_ids)
            + f',"generator":{_JSON(generator)},"insn_counts":{_JSON(list(insn_counts or []))},'
              f'"tags":{_JSON([t.hex() for t in tags or []])}}}')
    return zlib.compress(text.encode())


def recorded_parts(blob: bytes | None, want: str, generator: str) -> tuple[list[int], list[bytes]] | None:
    """The parts' instruction counts and tags the source *blob* records, if it was written by this
    *generator* for exactly the input *want* (:func:`input_text`); else None.  The input is compared
    as text: :func:`source_doc` writes it first, in a fixed key order, and the parts after it."""
    if blob is None or not generator:
        return None
    prefix = want + ","
    try:
        text = zlib.decompress(blob).decode()
        if not text.startswith(prefix):
            return None
        rest = json.loads("{" + text[len(prefix):])
        if rest.get("generator") != generator:
            return None
        counts, tags = [int(c) for c in rest["insn_counts"]], [bytes.fromhex(t) for t in rest["tags"]]
    except (zlib.error, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return None
    return (counts, tags) if counts and len(counts) == len(tags) else None


@dataclass(frozen=True, slots=True)
class PolicySource:
    program: str
    hook: int
    ip_version: int
    ip_set_ids: dict[str, int]
    policy_set: PolicySet


def parse_source(blob: bytes) -> PolicySource:
    doc = json.loads(zlib.decompress(blob))
    if doc.get("format") != SOURCE_FORMAT:
        raise ValueError(f"policy source format {doc.get('format')!r}, this felixpy reads {SOURCE_FORMAT}")
    return PolicySource(str(doc["program"]), int(doc["hook"]), int(doc["ip_version"]),
                        {str(k): int(v) for k, v in doc["ip_set_ids"].items()},
                        _build(PolicySet, doc["policy_set"]))


class SourceStore(Protocol):
    """Where the loaded programs' sources live (by program name)."""

    def write(self, name: str, blob: bytes) -> None: ...
    def read(self, name: str) -> bytes | None: ...
    def remove(self, name: str) -> None: ...
    def names(self) -> list[str]: ...


@dataclass
class MemorySources:
    """The fakes' store (and a process without a pin root)."""

    blobs: dict[str, bytes] = field(default_factory=dict)

    def write(self, name: str, blob: bytes) -> None:
        self.blobs[name] = blob

    def read(self, name: str) -> bytes | None:
        return self.blobs.get(name)

    def remove(self, name: str) -> None:
        self.blobs.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self.blobs)


@dataclass
class PinnedSources:
    """One pinned array map per program under ``<pin root>/felixpy-policy``: key 0, value =
    4-byte little-endian length + the compressed document (bpffs holds no regular files)."""

    pin_root: str

    @property
    def directory(self) -> str:
        return os.path.join(self.pin_root, SOURCE_DIR)

    def write(self, name: str, blob: bytes) -> None:
        os.makedirs(self.directory, exist_ok=True)
        value = len(blob).to_bytes(4, "little") + blob
        value += bytes(-len(value) % 8)
        fd = sc.map_create(sc.MAP_TYPE_ARRAY, 4, len(value), 1, name=_SOURCE_MAP_NAME)
        try:
            sc.map_update(fd, bytes(4), value)
            path = os.path.join(self.directory, name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # an earlier run's source of the same name: this one replaces it
            sc.obj_pin(fd, path)
        finally:
            os.close(fd)

    def read(self, name: str) -> bytes | None:
        return read_pinned_source(os.path.join(self.directory, name))

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, name))

    def names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []


def read_pinned_source(path: str) -> bytes | None:
    """The compressed document pinned at ``path`` (None: no such pin)."""
    try:
        fd = sc.obj_get(path)
    except (BPFSyscallError, FileNotFoundError):
        return None
    try:
        info = sc.map_info(fd)
        raw = sc.map_lookup(fd, bytes(4), info.value_size)
    finally:
        os.close(fd)
    if raw is None or len(raw) < 4:
        return None
    n = int.from_bytes(raw[:4], "little")
    return raw[4:4 + n]
