"""``ipset save`` output → IP-set contents (pure; members parsed only for sets a packet meets)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from felixpy.explain.packet import protocol_number
from felixpy.explain.ruleset import IPSetContents

_KINDS = {"hash:net": "net", "hash:ip": "ip", "hash:ip,port": "ipport"}


def group_save(text: str) -> dict[str, tuple[str, list[str]]]:
    """Set name → (ipset type, its raw member texts), from one ``ipset save`` dump."""
    out: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if line.startswith("add "):
            _, name, member = (line.split(" ", 3) + [""])[:3]
            entry = out.get(name)
            if entry is not None:
                entry[1].append(member)
        elif line.startswith("create "):
            parts = line.split()
            if len(parts) >= 3:
                out[parts[1]] = (parts[2], [])
    return out


def parse_ipport(member: str) -> tuple[str, int, int] | None:
    """``10.65.0.3,tcp:8081`` → ("10.65.0.3", 6, 8081); None if malformed."""
    ip_text, _, pp = member.rpartition(",")
    proto, _, port = pp.partition(":")
    num = protocol_number(proto) if port else 6  # "ip,8080" means tcp
    port = port or proto
    try:
        return ipaddress.ip_address(ip_text).compressed, int(num if num is not None else -1), int(port)
    except ValueError:
        return None


def contents(name: str, ipset_type: str, members: Iterable[str]) -> IPSetContents | None:
    """The set's members for membership tests; None for a type felixpy never writes."""
    kind = _KINDS.get(ipset_type)
    if kind is None:
        return None
    s = IPSetContents(name, kind)
    for m in members:
        if kind == "ipport":
            parsed = parse_ipport(m)
            if parsed is not None:
                s.ipports.add(parsed)
            continue
        try:
            s.nets.append(ipaddress.ip_network(m, strict=False))
        except ValueError:
            continue
    return s


class IPSetSave:
    """Membership over one ``ipset save`` dump; a set's lines are found (``create`` then its ``add``
    lines, as ``ipset save`` prints them) and parsed only when a packet meets the set."""

    def __init__(self, text: str) -> None:
        self._text = text if text.startswith("\n") else "\n" + text
        self._parsed: dict[str, IPSetContents | None] = {}

    def _lines(self, name: str) -> tuple[str, list[str]] | None:
        t = self._text
        i = t.find(f"\ncreate {name} ")
        if i < 0:
            return None
        eol = t.find("\n", i + 1)
        eol = len(t) if eol < 0 else eol
        parts = t[i + 1:eol].split()
        prefix = f"\nadd {name} "
        members: list[str] = []
        pos = eol
        while t.startswith(prefix, pos):
            nl = t.find("\n", pos + 1)
            nl = len(t) if nl < 0 else nl
            members.append(t[pos + len(prefix):nl].split(" ", 1)[0])
            pos = nl
        return (parts[2] if len(parts) >= 3 else ""), members

    def __call__(self, name: str) -> IPSetContents | None:
        if name in self._parsed:
            return self._parsed[name]
        raw = self._lines(name)
        got = contents(name, *raw) if raw is not None else None
        self._parsed[name] = got
        return got

    def names(self) -> list[str]:
        return list(group_save(self._text))
