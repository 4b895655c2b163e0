"""A stateful fake of libnftables' JSON interface (:class:`~.shim.NftShim`) for unit tests.

It holds tables, chains, rules, sets and maps, applies each transaction
atomically (all commands or none — like the kernel), and lists a table in the
kernel's JSON shape.  It enforces the constraints that make ordering matter:

* objects must exist before they are used (a rule's jump target, ``@set``
  references, a map element's goto target, elements' set): ``ENOENT``;
* a set, map or chain still referenced by a rule or map element cannot be
  deleted, nor can a chain that still has rules: ``EBUSY``;
* deleting something absent is an error (``delete table`` included), adding a
  set with another type over an existing one is ``EEXIST``, and re-adding a
  base chain with another hook/priority is ``EOPNOTSUPP``;
* interval sets refuse overlapping elements; elements must be of the set's type.

Rule bodies are stored as given (the kernel normalises them; the table only
ever reads comments back).  Each rule gets a fresh handle and a counter, so a
test can tell a rewritten rule from an untouched one.

Failure injection: :meth:`fail_next_runs`, :attr:`fail_all_runs`,
:attr:`fail_when` (a predicate over a transaction), :meth:`fail_next_lists`,
:attr:`fail_all_lists`.  :attr:`run_calls` / :attr:`list_calls` count calls.
"""

from __future__ import annotations

import copy
import ipaddress
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from felixpy.drivers.nftables.shim import NftError

ENOENT = "No such file or directory"
EBUSY = "Device or resource busy"
EEXIST = "File exists"
EOPNOTSUPP = "Operation not supported"
_PROTO_NAMES = {6: "tcp", 17: "udp", 132: "sctp", 136: "udplite"}


class _Refused(Exception):
    pass


@dataclass
class _Chain:
    base: dict[str, Any] | None
    rules: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Set:
    type: tuple[str, ...]
    flags: tuple[str, ...]
    elems: dict[str, Any] = field(default_factory=dict)   # key -> listed element


@dataclass
class _Map:
    type: str
    data: str
    elems: dict[str, Any] = field(default_factory=dict)   # key -> verdict


@dataclass
class _Table:
    handle: int
    chains: dict[str, _Chain] = field(default_factory=dict)
    sets: dict[str, _Set] = field(default_factory=dict)
    maps: dict[str, _Map] = field(default_factory=dict)
    others: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


def _walk(obj: Any) -> Iterator[tuple[str, str]]:
    """References in a rule expression: ("chain", name) and ("obj", set-or-map name)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("jump", "goto") and isinstance(v, dict):
                yield ("chain", v["target"])
            else:
                yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)
    elif isinstance(obj, str) and obj.startswith("@"):
        yield ("obj", obj[1:])


def _addr(text: str, typ: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    addr = ipaddress.ip_address(text)
    if (typ == "ipv4_addr") != (addr.version == 4):
        raise _Refused(f"Error: {text} is not a {typ}")
    return addr


class FakeNft:
    def __init__(self) -> None:
        self._tables: dict[tuple[str, str], _Table] = {}
        self._handle = 0
        self.run_calls = 0
        self.list_calls = 0
        self.set_list_calls = 0
        self.last_commands: list[dict[str, Any]] = []
        self.fail_all_runs = False
        self.fail_all_lists = False
        self.fail_when: Callable[[Sequence[dict[str, Any]]], str | None] | None = None
        self._fail_runs = 0
        self._fail_lists = 0

    # -- failure injection ------------------------------------------------------------------
    def fail_next_runs(self, n: int = 1) -> None:
        self._fail_runs = n

    def fail_next_lists(self, n: int = 1) -> None:
        self._fail_lists = n

    # -- the shim protocol --------------------------------------------------------------------
    def run(self, commands: Sequence[dict[str, Any]]) -> None:
        self.run_calls += 1
        self.last_commands = list(commands)
        if self.fail_all_runs or self._fail_runs > 0:
            self._fail_runs = max(0, self._fail_runs - 1)
            raise NftError(-1, "Error: injected failure")
        if self.fail_when is not None:
            msg = self.fail_when(commands)
            if msg:
                raise NftError(-1, msg)
        saved_tables, saved_handle = copy.deepcopy(self._tables), self._handle
        try:
            for cmd in commands:
                self._apply(cmd)
        except _Refused as e:
            self._tables, self._handle = saved_tables, saved_handle
            raise NftError(-1, f"Error: Could not process rule: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            self._tables, self._handle = saved_tables, saved_handle
            raise NftError(-1, f"Error: malformed command {e!r}") from None

    def list_sets(self, family: str, name: str) -> list[dict[str, Any]] | None:
        """The table's sets with their elements (``list sets``); None when the table does not exist."""
        self.set_list_calls += 1
        if self.fail_all_lists or self._fail_lists > 0:
            self._fail_lists = max(0, self._fail_lists - 1)
            raise NftError(-1, "Error: injected list failure")
        if (family, name) not in self._tables:
            return None
        self.list_calls -= 1  # list_table's counter is for full listings only
        return [o for o in self.list_table(family, name) or () if "set" in o]

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        self.list_calls += 1
        if self.fail_all_lists or self._fail_lists > 0:
            self._fail_lists = max(0, self._fail_lists - 1)
            raise NftError(-1, "Error: injected list failure")
        t = self._tables.get((family, name))
        if t is None:
            return None
        base = {"family": family, "table": name}
        out: list[dict[str, Any]] = [{"table": {"family": family, "name": name, "handle": t.handle}}]
        for sname, s in t.sets.items():
            sobj: dict[str, Any] = {"family": family, "name": sname, "table": name,
                                    "type": s.type[0] if len(s.type) == 1 else list(s.type)}
            if s.flags:
                sobj["flags"] = list(s.flags)
            if s.elems:
                sobj["elem"] = copy.deepcopy(list(s.elems.values()))
            out.append({"set": sobj})
        for mname, mp in t.maps.items():
            mobj: dict[str, Any] = {"family": family, "name": mname, "table": name, "type": mp.type, "map": mp.data}
            if mp.elems:
                mobj["elem"] = [[k, copy.deepcopy(v)] for k, v in mp.elems.items()]
            out.append({"map": mobj})
        for (kind, oname), obj in t.others.items():
            out.append({kind: {**base, "name": oname, **copy.deepcopy(obj)}})
        for cname, c in t.chains.items():
            out.append({"chain": {**base, "name": cname, **(c.base or {})}})
        for cname, c in t.chains.items():
            for r in c.rules:
                out.append({"rule": {**base, "chain": cname, **copy.deepcopy(r)}})
        return out

    # -- helpers for tests ---------------------------------------------------------------------
    def table(self, family: str, name: str = "calico") -> _Table | None:
        return self._tables.get((family, name))

    def rule_handles(self, family: str, chain: str, name: str = "calico") -> list[int]:
        t = self._tables[(family, name)]
        return [r["handle"] for r in t.chains[chain].rules]

    # -- command semantics -----------------------------------------------------------------------
    def _next_handle(self) -> int:
        self._handle += 1
        return self._handle

    def _table(self, body: dict[str, Any]) -> _Table:
        t = self._tables.get((body["family"], body["table"]))
        if t is None:
            raise _Refused(ENOENT)
        return t

    def _apply(self, cmd: dict[str, Any]) -> None:
        (verb, obj), = cmd.items()
        (kind, body), = obj.items()
        handler = getattr(self, f"_{verb}_{kind.replace(' ', '_')}", None)
        if handler is None:
            if verb == "delete":
                return self._delete_other(kind, body)
            if verb == "add":
                return self._add_other(kind, body)
            raise _Refused(f"unsupported command {verb} {kind}")
        handler(body)

    def _add_table(self, body: dict[str, Any]) -> None:
        key = (body["family"], body["name"])
        if key not in self._tables:
            self._tables[key] = _Table(self._next_handle())

    def _delete_table(self, body: dict[str, Any]) -> None:
        if self._tables.pop((body["family"], body["name"]), None) is None:
            raise _Refused(ENOENT)

    def _add_chain(self, body: dict[str, Any]) -> None:
        t = self._table(body)
        base: dict[str, Any] | None = {k: body[k] for k in ("type", "hook", "prio", "policy") if k in body} or None
        existing = t.chains.get(body["name"])
        if existing is None:
            t.chains[body["name"]] = _Chain(base)
        elif base is not None and existing.base != base:
            raise _Refused(EOPNOTSUPP)

    def _chain(self, body: dict[str, Any]) -> _Chain:
        c = self._table(body).chains.get(body["name"])
        if c is None:
            raise _Refused(ENOENT)
        return c

    def _flush_chain(self, body: dict[str, Any]) -> None:
        self._chain(body).rules.clear()

    def _chain_refs(self, t: _Table, name: str) -> bool:
        for c in t.chains.values():
            for r in c.rules:
                if ("chain", name) in _walk(r["expr"]):
                    return True
        return any(("chain", name) in _walk(v) for mp in t.maps.values() for v in mp.elems.values())

    def _obj_refs(self, t: _Table, name: str) -> bool:
        return any(("obj", name) in _walk(r["expr"]) for c in t.chains.values() for r in c.rules)

    def _delete_chain(self, body: dict[str, Any]) -> None:
        t = self._table(body)
        c = self._chain(body)
        if c.rules or self._chain_refs(t, body["name"]):
            raise _Refused(EBUSY)
        del t.chains[body["name"]]

    def _add_rule(self, body: dict[str, Any]) -> None:
        t = self._table(body)
        c = t.chains.get(body["chain"])
        if c is None:
            raise _Refused(ENOENT)
        expr = body["expr"]
        if not expr:
            raise _Refused("empty rule")
        for kind, name in _walk(expr):
            if kind == "chain":
                if name not in t.chains:
                    raise _Refused(ENOENT)
                if t.chains[name].base is not None:
                    raise _Refused(EOPNOTSUPP)
            elif name not in t.sets and name not in t.maps:
                raise _Refused(ENOENT)
        stored = [{"counter": {"packets": 0, "bytes": 0}} if "counter" in e else e for e in expr]
        rule: dict[str, Any] = {"handle": self._next_handle()}
        if body.get("comment"):
            if len(body["comment"]) > 128:
                raise _Refused("comment too long")
            rule["comment"] = body["comment"]
        rule["expr"] = copy.deepcopy(stored)
        c.rules.append(rule)

    def _delete_rule(self, body: dict[str, Any]) -> None:
        c = self._chain({**body, "name": body["chain"]})
        for i, r in enumerate(c.rules):
            if r["handle"] == body["handle"]:
                del c.rules[i]
                return
        raise _Refused(ENOENT)

    def _add_set(self, body: dict[str, Any]) -> None:
        t = self._table(body)
        typ = tuple(body["type"]) if isinstance(body["type"], list) else (body["type"],)
        flags = tuple(body.get("flags", ()))
        if body["name"] in t.maps:
            raise _Refused(EEXIST)
        existing = t.sets.get(body["name"])
        if existing is None:
            t.sets[body["name"]] = _Set(typ, flags)
        elif (existing.type, existing.flags) != (typ, flags):
            raise _Refused(EEXIST)

    def _delete_set(self, body: dict[str, Any]) -> None:
        t = self._table(body)
        if body["name"] not in t.sets:
            raise _Refused(ENOENT)
        if self._obj_refs(t, body["name"]):
            raise _Refused(EBUSY)
        del t.sets[body["name"]]

    def _add_map(self, body: dict[str, Any]) -> None:
        t = self._table(body)
        if body["name"] in t.sets:
            raise _Refused(EEXIST)
        existing = t.maps.get(body["name"])
        if existing is None:
            t.maps[body["name"]] = _Map(body["type"], body["map"])
        elif (existing.type, existing.data) != (body["type"], body["map"]):
            raise _Refused(EEXIST)

    def _delete_map(self, body: dict[str, Any]) -> None:
        t = self._table(body)
        if body["name"] not in t.maps:
            raise _Refused(ENOENT)
        if self._obj_refs(t, body["name"]):
            raise _Refused(EBUSY)
        del t.maps[body["name"]]

    def _add_other(self, kind: str, body: dict[str, Any]) -> None:
        t = self._table(body)
        t.others[(kind, body["name"])] = {k: v for k, v in body.items() if k not in ("family", "table", "name")}

    def _delete_other(self, kind: str, body: dict[str, Any]) -> None:
        t = self._table(body)
        if t.others.pop((kind, body["name"]), None) is None:
            raise _Refused(ENOENT)

    # -- elements ---------------------------------------------------------------------------
    def _normalise(self, s: _Set, elem: Any) -> tuple[str, Any, tuple[int, int] | None]:
        """(key, listed form, interval span) of an element for set *s*."""
        if len(s.type) == 3:
            addr, proto, port = elem["concat"]
            a = _addr(addr, s.type[0])
            pnum = proto if isinstance(proto, int) else {v: k for k, v in _PROTO_NAMES.items()}[proto]
            listed = {"concat": [str(a), _PROTO_NAMES.get(pnum, pnum), int(port)]}
            return json.dumps(listed), listed, None
        if isinstance(elem, str):
            a = _addr(elem, s.type[0])
            return str(a), str(a), (int(a), int(a))
        if "prefix" in elem:
            if "interval" not in s.flags:
                raise _Refused("prefix in a set without the interval flag")
            net = ipaddress.ip_network(f"{elem['prefix']['addr']}/{elem['prefix']['len']}", strict=False)
            _addr(str(net.network_address), s.type[0])
            if net.num_addresses == 1:
                return str(net.network_address), str(net.network_address), (int(net.network_address),) * 2
            listed_pfx: dict[str, Any] = {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}
            return str(net), listed_pfx, (int(net.network_address), int(net.broadcast_address))
        if "range" in elem:
            lo, hi = (_addr(x, s.type[0]) for x in elem["range"])
            listed = {"range": [str(lo), str(hi)]}
            return json.dumps(listed), listed, (int(lo), int(hi))
        raise _Refused(f"bad element {elem!r}")

    def _add_element(self, body: dict[str, Any]) -> None:
        t = self._table(body)
        name = body["name"]
        if name in t.maps:
            return self._add_map_elements(t, t.maps[name], body["elem"])
        s = t.sets.get(name)
        if s is None:
            raise _Refused(ENOENT)
        spans: list[tuple[int, int]] = []
        if "interval" in s.flags:
            spans = [self._normalise(s, e)[2] or (0, 0) for e in s.elems.values()]
        for elem in body["elem"]:
            key, listed, span = self._normalise(s, elem)
            if key in s.elems:
                continue
            if span is not None and "interval" in s.flags:
                if any(span[0] <= hi and lo <= span[1] for lo, hi in spans):
                    raise _Refused("interval overlaps with an existing one")
                spans.append(span)
            s.elems[key] = listed

    def _add_map_elements(self, t: _Table, mp: _Map, elems: list[Any]) -> None:
        for key, verdict in elems:
            for kind, target in _walk(verdict):
                if kind == "chain" and target not in t.chains:
                    raise _Refused(ENOENT)
            if key in mp.elems and mp.elems[key] != verdict:
                raise _Refused(EEXIST)
            mp.elems[key] = copy.deepcopy(verdict)

    def _delete_element(self, body: dict[str, Any]) -> None:
        t = self._table(body)
        name = body["name"]
        if name in t.maps:
            mp = t.maps[name]
            for key in body["elem"]:
                k = key[0] if isinstance(key, list) else key
                if mp.elems.pop(k, None) is None:
                    raise _Refused(ENOENT)
            return
        s = t.sets.get(name)
        if s is None:
            raise _Refused(ENOENT)
        for elem in body["elem"]:
            key = self._normalise(s, elem)[0]
            if s.elems.pop(key, None) is None:
                raise _Refused("element does not exist")
