"""``nft -j list table <family> calico`` → a :class:`~.ruleset.Ruleset` (pure; rules parsed per chain on use).

The listing is the kernel's normal form, not what felixpy wrote: ``meta mark set mark
or 0x10000`` lists as a ``mangle`` with ``|``, ICMP types come back by name, single
ports as numbers and lists as ``set``.  Each statement is mapped onto the model's
criteria/actions; anything else becomes :class:`~.ruleset.UnknownMatch`.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

from felixpy.drivers.generictables import model as m
from felixpy.explain.packet import ICMP_CODES, ICMP_TYPES, ICMPV6_CODES, ICMPV6_TYPES, protocol_number
from felixpy.explain.ruleset import (
    AnyAction, AnyCriterion, FetchingMap, HookEntry, IPSetContents, KRule, LazyChains, Ruleset, UnknownAction,
    UnknownMatch, VerdictMapAction,
)

HASH_PREFIX = "cali:"
TABLE = "calico"
_MASK32 = 0xFFFFFFFF


def _is_key(expr: Any, kind: str, key: str) -> bool:
    return isinstance(expr, dict) and isinstance(expr.get(kind), dict) and expr[kind].get("key") == key


def _payload(expr: Any) -> tuple[str, str] | None:
    if isinstance(expr, dict) and isinstance(expr.get("payload"), dict):
        p = expr["payload"]
        return str(p.get("protocol")), str(p.get("field"))
    return None


def _int(v: Any) -> int:
    return int(v, 0) if isinstance(v, str) else int(v)


def _iface(name: str) -> str:
    return name[:-1] + "+" if name.endswith("*") else name


def _ports(right: Any) -> tuple[m.PortRange, ...]:
    items = right["set"] if isinstance(right, dict) and "set" in right else [right]
    out = []
    for it in items:
        if isinstance(it, dict) and "range" in it:
            out.append(m.PortRange(_int(it["range"][0]), _int(it["range"][1])))
        else:
            out.append(m.PortRange(_int(it)))
    return tuple(out)


def _net(right: Any) -> str | None:
    if isinstance(right, str):
        return right
    if isinstance(right, dict) and "prefix" in right:
        return f"{right['prefix']['addr']}/{right['prefix']['len']}"
    return None


def _icmp_value(v: Any, names: Mapping[str, int]) -> int:
    return names[v] if isinstance(v, str) and v in names else _int(v)


def _states(right: Any) -> str:
    items = right if isinstance(right, list) else [right]
    return ",".join(str(s).upper() for s in items)


def _match(mt: dict[str, Any], ip_version: int, prev: list[AnyCriterion]) -> AnyCriterion | None:  # noqa: C901
    """One ``match`` statement → a criterion (None: merged into the previous one)."""
    op, left, right = mt.get("op", "=="), mt.get("left"), mt.get("right")
    neg = op == "!="
    icmp_names = ICMP_TYPES if ip_version == 4 else ICMPV6_TYPES
    code_names = ICMP_CODES if ip_version == 4 else ICMPV6_CODES
    if isinstance(left, dict) and "&" in left:
        base, mask = left["&"]
        if isinstance(mask, (int, str)) and _is_key(base, "meta", "mark"):
            return m.MarkMatchesWithMask(_int(right), _int(mask), neg)
        if isinstance(mask, (int, str)) and _is_key(base, "ct", "mark") and not neg:
            return m.ConnMarkMatchesWithMask(_int(right), _int(mask))
        if _payload(base) == ("tcp", "flags") and not neg:
            flags = right if isinstance(right, list) else [right]
            return m.TCPFlagsSet(",".join(str(f).upper() for f in flags))
    if _is_key(left, "meta", "iifname") and isinstance(right, str):
        return m.InInterface(_iface(right), neg)
    if _is_key(left, "meta", "oifname") and isinstance(right, str):
        return m.OutInterface(_iface(right), neg)
    if _is_key(left, "meta", "l4proto") and isinstance(right, (str, int)):
        num = protocol_number(str(right))
        return m.ProtocolNum(num, neg) if num is not None else None
    if isinstance(left, dict) and "ct" in left and left["ct"].get("key") in ("state", "status"):
        return m.ConntrackState(_states(right), neg)
    if isinstance(left, dict) and "fib" in left:
        fib = left["fib"]
        flags = list(fib.get("flags", ()))
        if fib.get("result") == "type" and flags and flags[0] in ("saddr", "daddr") and isinstance(right, str):
            if flags[0] == "daddr":
                return m.DestAddrType(right.upper(), neg)
            return m.SrcAddrType(right.upper(), "oif" in flags, neg)
        if fib.get("result") == "oif" and str(right) == "0" and not neg:
            return m.RPFCheckFailed()
    if isinstance(left, dict) and "concat" in left and isinstance(right, str) and right.startswith("@"):
        parts = [_payload(x) for x in left["concat"]]
        if len(parts) == 3 and parts[0] is not None and parts[2] is not None:
            if parts[0][1] == "saddr":
                return m.SourceIPPortSet(right[1:], neg)
            return m.DestIPPortSet(right[1:], neg)
    if isinstance(left, dict) and "concat" in left and neg and isinstance(right, dict) and "set" in right:
        parts = [_payload(x) for x in left["concat"]]
        elems = right["set"]
        if len(parts) == 2 and parts[0] is not None and parts[0][0] in ("icmp", "icmpv6") and len(elems) == 1:
            t, c = elems[0]["concat"]
            cls = m.ICMPType if parts[0][0] == "icmp" else m.ICMPV6Type
            return cls(_icmp_value(t, icmp_names), _icmp_value(c, code_names), True)
    p = _payload(left)
    if p is not None:
        proto, fld = p
        if proto in ("ip", "ip6") and fld in ("saddr", "daddr"):
            if isinstance(right, str) and right.startswith("@"):
                return (m.SourceIPSet if fld == "saddr" else m.DestIPSet)(right[1:], neg)
            net = _net(right)
            if net is not None:
                return (m.SourceNet if fld == "saddr" else m.DestNet)(net, neg)
        if fld in ("sport", "dport") and proto in ("tcp", "udp", "sctp", "th", "udplite", "dccp"):
            # "udp dport …" carries its own protocol dependency (nft folds "meta l4proto udp" into it).
            num = protocol_number(proto)
            if num is not None and not any(isinstance(c, m.ProtocolNum) and c.num == num and not c.negate
                                           for c in prev):
                prev.append(m.ProtocolNum(num))
            ports = _ports(right)
            return (m.SourcePorts if fld == "sport" else m.DestPorts)(ports, neg)
        if proto in ("icmp", "icmpv6") and fld == "type" and not isinstance(right, dict):
            cls = m.ICMPType if proto == "icmp" else m.ICMPV6Type
            return cls(_icmp_value(right, icmp_names), None, neg)
        if proto in ("icmp", "icmpv6") and fld == "code" and not neg and prev:
            last = prev[-1]
            if isinstance(last, (m.ICMPType, m.ICMPV6Type)) and last.code is None and not last.negate:
                prev[-1] = type(last)(last.type, _icmp_value(right, code_names))
                return None
    return UnknownMatch(f"match {left!r} {op} {right!r}")


def _mangle(mg: dict[str, Any]) -> AnyAction:
    key, value = mg.get("key"), mg.get("value")
    if _is_key(key, "meta", "mark") and isinstance(value, dict):
        if "|" in value and _is_key(value["|"][0], "meta", "mark"):
            bits = _int(value["|"][1])
            return m.SetMaskedMark(bits, bits)
        if "&" in value and _is_key(value["&"][0], "meta", "mark"):
            return m.SetMaskedMark(0, _int(value["&"][1]) ^ _MASK32)
        if "^" in value and isinstance(value["^"][0], dict) and "&" in value["^"][0]:
            inner = value["^"][0]["&"]
            if _is_key(inner[0], "meta", "mark"):
                return m.SetMaskedMark(_int(value["^"][1]), _int(inner[1]) ^ _MASK32)
    if _is_key(key, "meta", "mark") and isinstance(value, (int, str)):
        return m.SetMaskedMark(_int(value), _MASK32)
    if _is_key(key, "ct", "mark"):
        return m.SetConnMark(0, 0)
    if _payload(key) is not None and _payload(key)[1] == "dscp":  # type: ignore[index]
        return m.DSCP(_int(value))
    return UnknownAction(f"mangle {mg!r}")


def parse_rule(expr: Iterable[dict[str, Any]], comment: str | None, ip_version: int,
               position: int) -> KRule:  # noqa: C901
    crit: list[AnyCriterion] = []
    action: AnyAction | None = None
    for st in expr:
        if not isinstance(st, dict) or len(st) != 1:
            crit.append(UnknownMatch(repr(st)))
            continue
        (kind, val), = st.items()
        if kind == "counter":
            continue
        if kind == "match":
            c = _match(val, ip_version, crit)
            if c is not None:
                crit.append(c)
        elif kind == "accept":
            action = m.Accept()
        elif kind == "drop":
            action = m.Drop()
        elif kind == "reject":
            action = m.Reject(m.REJECT_WITH_TCP_RESET if isinstance(val, dict) and val.get("type") == "tcp reset"
                              else "")
        elif kind == "return":
            action = m.Return()
        elif kind == "continue":
            action = m.Continue()
        elif kind == "jump":
            action = m.Jump(val["target"])
        elif kind == "goto":
            action = m.Goto(val["target"])
        elif kind == "vmap":
            key = val.get("key")
            data = val.get("data")
            which = "iifname" if _is_key(key, "meta", "iifname") else "oifname" if _is_key(key, "meta", "oifname") \
                else ""
            if which and isinstance(data, str) and data.startswith("@"):
                action = VerdictMapAction(which, data[1:])
            else:
                action = UnknownAction(f"vmap {val!r}")
        elif kind == "mangle":
            action = _mangle(val)
        elif kind == "notrack":
            action = m.NoTrack()
        elif kind == "log":
            v = val or {}
            action = m.Nflog(int(v["group"]), str(v.get("prefix", ""))) if "group" in v else \
                m.Log(str(v.get("prefix", "")))
        elif kind == "limit":
            v = val or {}
            if v.get("inv"):
                crit.append(m.ConnLimit(int(v.get("rate", 0))))   # "over the rate": not for one new flow
            else:
                crit.append(m.Limit(f"{v.get('rate')}/{v.get('per')}", int(v.get("burst", 0))))
        elif kind == "ct count":
            crit.append(m.ConnLimit(int((val or {}).get("val", 0))))
        elif kind in ("snat", "dnat", "masquerade"):
            v = val or {}
            addr = str(v.get("addr", ""))
            action = m.SNAT(addr) if kind == "snat" else m.DNAT(addr) if kind == "dnat" else m.Masquerade()
        else:
            crit.append(UnknownMatch(f"{kind} {val!r}"))
    hash_, comments = "", cast("tuple[str, ...]", ())
    if comment:
        head, sep, rest = comment.partition(";")
        if head.startswith(HASH_PREFIX) and sep:
            hash_ = head[len(HASH_PREFIX):]
            rest = rest.strip()
            comments = (rest,) if rest else ()
        else:
            comments = (comment,)
    return KRule(position, tuple(crit), action, hash_, comments)


# ------------------------------------------------------------------------------ sets
def _elem_value(e: Any) -> Any:
    if isinstance(e, dict) and "elem" in e:
        return e["elem"].get("val")
    return e


def set_contents(obj: Mapping[str, Any]) -> IPSetContents | None:
    """A listed ``set`` object → its members (None for a type felixpy never writes)."""
    typ = obj.get("type")
    name = str(obj.get("name"))
    elems = [_elem_value(e) for e in obj.get("elem", ())]
    if isinstance(typ, list):
        if len(typ) != 3 or typ[1] != "inet_proto" or typ[2] != "inet_service":
            return None
        s = IPSetContents(name, "ipport")
        for e in elems:
            if isinstance(e, dict) and "concat" in e and len(e["concat"]) == 3:
                ip, proto, port = e["concat"]
                num = protocol_number(str(proto))
                try:
                    s.ipports.add((ipaddress.ip_address(ip).compressed, num if num is not None else -1, _int(port)))
                except (ValueError, TypeError):
                    continue
        return s
    if typ not in ("ipv4_addr", "ipv6_addr"):
        return None
    s = IPSetContents(name, "net")
    for e in elems:
        try:
            if isinstance(e, str):
                s.nets.append(ipaddress.ip_network(e, strict=False))
            elif isinstance(e, dict) and "prefix" in e:
                s.nets.append(ipaddress.ip_network(f"{e['prefix']['addr']}/{e['prefix']['len']}", strict=False))
            elif isinstance(e, dict) and "range" in e:
                lo, hi = (ipaddress.ip_address(x) for x in e["range"])
                s.nets.extend(ipaddress.summarize_address_range(lo, hi))
        except (ValueError, TypeError, KeyError):
            continue
    return s


def map_elements(obj: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """A listed verdict ``map`` → key → ("goto", chain) / ("jump", chain) / ("accept",) …"""
    elems: dict[str, tuple[str, ...]] = {}
    for e in obj.get("elem", ()):
        if isinstance(e, list) and len(e) == 2 and isinstance(e[1], dict) and len(e[1]) == 1:
            (vk, vv), = e[1].items()
            elems[str(e[0])] = (vk, vv["target"]) if isinstance(vv, dict) and "target" in vv else (vk,)
    return elems


def ruleset_from_json(objs: Iterable[Mapping[str, Any]], ip_version: int, backend: str = "nftables") -> Ruleset:
    """One family's ``calico`` table objects (``nft -j list …`` ``nftables`` array) → a Ruleset."""
    family = "ip" if ip_version == 4 else "ip6"
    raw_rules: dict[str, list[tuple[Any, str | None]]] = {}
    hooks: dict[str, list[HookEntry]] = {}
    sets: dict[str, Mapping[str, Any]] = {}
    maps: dict[str, dict[str, tuple[str, ...]]] = {}
    for obj in objs:
        if len(obj) != 1:
            continue
        (kind, o), = obj.items()
        if not isinstance(o, dict) or o.get("family") != family or o.get("table") != TABLE:
            continue
        if kind == "rule":
            raw_rules.setdefault(o["chain"], []).append((o.get("expr", ()), o.get("comment")))
        elif kind == "chain":
            raw_rules.setdefault(o["name"], [])
            if "hook" in o:
                hooks.setdefault(o["hook"], []).append(
                    HookEntry(o["name"], o["name"], int(o.get("prio", 0)), str(o.get("policy", "accept"))))
        elif kind == "set":
            sets[o["name"]] = o
        elif kind == "map":
            maps[o["name"]] = map_elements(o)
    for entries in hooks.values():
        entries.sort(key=lambda h: h.priority)
    parsed_sets: dict[str, IPSetContents | None] = {}

    def lookup(name: str) -> IPSetContents | None:
        legal = name.replace(":", "-")
        if legal not in parsed_sets:
            obj = sets.get(legal)
            parsed_sets[legal] = set_contents(obj) if obj is not None else None
        return parsed_sets[legal]

    def parse(chain: str, raw: object) -> list[KRule]:
        items = raw if isinstance(raw, list) else []
        return [parse_rule(expr, comment, ip_version, i + 1) for i, (expr, comment) in enumerate(items)]

    return Ruleset(backend=backend, ip_version=ip_version, chains=LazyChains(raw_rules, parse), hooks=hooks,
                   sets=lookup, maps=maps)


class FastReader(Protocol):
    """Reads one chain / set / map without the nft CLI (:class:`~.nft_netlink.NftNetlink`); raises
    :class:`~.nft_netlink.Undecodable` for what it cannot decode, which is then listed with nft."""

    def chain(self, name: str) -> tuple[HookEntry | None, list[KRule]] | None: ...
    def set_contents(self, name: str) -> IPSetContents | None: ...
    def map_elements(self, name: str) -> Mapping[str, tuple[str, ...]] | None: ...


def lazy_ruleset(list_object: Callable[[str, str], str | None], ip_version: int,  # noqa: C901
                 base_chains: Mapping[str, Sequence[str]], backend: str = "nftables",
                 fast: FastReader | None = None) -> Ruleset:
    """A ruleset that lists each chain, set and map on use: ``list_object(kind, name)`` → ``nft -j list
    <kind> <family> calico <name>`` output (None if absent); ``base_chains``: hook → base-chain names;
    ``fast``: tried first for every object."""
    from felixpy.explain.nft_netlink import Undecodable

    family = "ip" if ip_version == 4 else "ip6"
    bases: dict[str, HookEntry] = {}

    def objects(kind: str, name: str) -> list[dict[str, Any]] | None:
        text = list_object(kind, name)
        if text is None:
            return None
        return [o for o in json.loads(text).get("nftables", []) if isinstance(o, dict)]

    def fetch_chain(name: str) -> object | None:
        if fast is not None:
            try:
                got = fast.chain(name)
            except Undecodable:
                pass
            else:
                if got is None:
                    return None
                hook, krules = got
                if hook is not None:
                    bases[name] = hook
                return ("decoded", krules)
        objs = objects("chain", name)
        if objs is None:
            return None
        rules = []
        for o in objs:
            if "chain" in o and "hook" in o["chain"]:
                c = o["chain"]
                bases[name] = HookEntry(name, name, int(c.get("prio", 0)), str(c.get("policy", "accept")))
            elif "rule" in o and o["rule"].get("family") == family:
                rules.append((o["rule"].get("expr", ()), o["rule"].get("comment")))
        return ("json", rules)

    def parse(chain: str, raw: object) -> list[KRule]:
        kind, items = raw if isinstance(raw, tuple) else ("json", [])
        if kind == "decoded":
            return list(items)
        return [parse_rule(expr, comment, ip_version, i + 1) for i, (expr, comment) in enumerate(items)]

    chains = LazyChains({}, parse, fetch_chain)

    def hook_source(hook: str) -> list[HookEntry]:
        entries = [bases[n] for n in base_chains.get(hook, ()) if n in chains and n in bases]
        return sorted(entries, key=lambda h: h.priority)

    def fetch_set(name: str) -> IPSetContents | None:
        legal = name.replace(":", "-")
        if fast is not None:
            try:
                return fast.set_contents(legal)
            except Undecodable:
                pass
        objs = objects("set", legal)
        for o in objs or ():
            if "set" in o:
                return set_contents(o["set"])
        return None

    def fetch_map(name: str) -> Mapping[str, tuple[str, ...]] | None:
        if fast is not None:
            try:
                return fast.map_elements(name)
            except Undecodable:
                pass
        objs = objects("map", name)
        for o in objs or ():
            if "map" in o:
                return map_elements(o["map"])
        return None

    set_cache = FetchingMap(fetch_set)
    return Ruleset(backend=backend, ip_version=ip_version, chains=chains, hooks={},
                   sets=lambda name: set_cache.get(name), maps=FetchingMap(fetch_map), hook_source=hook_source)
