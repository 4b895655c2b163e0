"""A transaction as an nft script: the fast path for large transactions.

The table builds every transaction as libnftables JSON commands, except that
rule additions stay :class:`RuleCmd` until serialised.  Small transactions go
to libnftables as JSON (its JSON path needs no cache of the table, so a
one-chain change costs ~1 ms with 10,000 rules installed, against ~15 ms as
text).  Large ones — a cold start, a table rebuild — are written as one nft
script instead: libnftables parses text about 1.3x faster than JSON, and the
rule text is what we render for the hash anyway.  Both forms describe the same
kernel objects (``tests/nftables/test_nft_render_kernel.py`` and the
text-vs-JSON table test check it); if a script is refused, the retries use
JSON.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from felixpy.drivers.generictables import model as m
from felixpy.drivers.nftables.render import rule_comment, rule_expr, rule_text


@dataclass(frozen=True, slots=True)
class RuleCmd:
    """``add rule`` for one of our rules, serialised on demand."""

    family: str
    table: str
    chain: str
    rule: m.Rule
    hash: str

    def to_json(self, ip_version: int, fully_random: bool) -> dict[str, Any]:
        return {"add": {"rule": {"family": self.family, "table": self.table, "chain": self.chain,
                                 "expr": rule_expr(self.rule, ip_version, fully_random),
                                 "comment": rule_comment(self.hash, self.rule.comments)}}}

    def to_text(self, ip_version: int, fully_random: bool) -> str:
        body = rule_text(self.rule, ip_version, fully_random)
        return (f"add rule {self.family} {self.table} {self.chain} {body} "
                f'comment "{rule_comment(self.hash, self.rule.comments)}"')


Command = dict[str, Any] | RuleCmd


def _elem_text(e: Any) -> str:
    if isinstance(e, list):   # map element [key, verdict]
        key, verdict = e
        (kind, arg), = verdict.items()
        v = f"{kind} {arg['target']}" if isinstance(arg, dict) else kind
        return f'"{key}" : {v}'
    if isinstance(e, dict):
        if "prefix" in e:
            return f"{e['prefix']['addr']}/{e['prefix']['len']}"
        if "range" in e:
            return f"{e['range'][0]}-{e['range'][1]}"
        if "concat" in e:
            return " . ".join(str(x) for x in e["concat"])
    text = str(e)
    return text if _is_address(text) else f'"{text}"'   # a map key (interface name) is a string


def _is_address(text: str) -> bool:
    for af in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(af, text)
            return True
        except OSError:
            pass
    return False


def command_text(cmd: dict[str, Any]) -> str:
    """One JSON command (of the kinds the table emits) as an nft script line."""
    (verb, obj), = cmd.items()
    (kind, b), = obj.items()
    if kind == "table":
        return f"{verb} table {b['family']} {b['name']}"
    where = f"{b['family']} {b['table']} {b['name']}"
    if kind == "chain":
        if verb == "add" and "hook" in b:
            return (f"add chain {where} {{ type {b['type']} hook {b['hook']} priority {b['prio']}; "
                    f"policy {b['policy']}; }}")
        return f"{verb} chain {where}"
    if kind == "set" and verb == "add":
        typ = b["type"] if isinstance(b["type"], str) else " . ".join(b["type"])
        flags = f" flags {', '.join(b['flags'])};" if b.get("flags") else ""
        return f"add set {where} {{ type {typ};{flags} }}"
    if kind == "map" and verb == "add":
        return f"add map {where} {{ type {b['type']} : {b['map']}; }}"
    if kind == "element":
        return f"{verb} element {where} {{ {', '.join(_elem_text(e) for e in b['elem'])} }}"
    return f"{verb} {kind} {where}"


def to_script(commands: list[Command], ip_version: int, fully_random: bool) -> str:
    lines = [c.to_text(ip_version, fully_random) if isinstance(c, RuleCmd) else command_text(c) for c in commands]
    return "\n".join(lines) + "\n"


def to_json(commands: list[Command], ip_version: int, fully_random: bool) -> list[dict[str, Any]]:
    return [c.to_json(ip_version, fully_random) if isinstance(c, RuleCmd) else c for c in commands]
