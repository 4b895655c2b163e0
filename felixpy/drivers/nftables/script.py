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

A long run of additions (a cold start, a rebuild: everything but the
flushes and deletions) is written as one ``table <family> <name> { ... }``
block, sets and maps with their ``elements = { ... }`` and chains with their
rules, the form ``nft list ruleset`` prints, instead of one ``add`` line per
object: nft takes the block form of the large-node cold start (20,000 rules,
200,000 set members) in ~2.3 s and ~250 MB against ~3.2 s and ~400 MB as
``add`` lines (docs/benchmarks.md).  One block per run, never one per chain:
every table block costs nft a pass proportional to the table (1,800 small
blocks took 6.5 s and 1.3 GB), and only in big transactions: short runs
and every steady-state transaction stay ``add`` lines.
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
    text: str | None = None   # the rule's nft text (rule_text), when the table kept it from hashing

    def to_json(self, ip_version: int, fully_random: bool) -> dict[str, Any]:
        return {"add": {"rule": {"family": self.family, "table": self.table, "chain": self.chain,
                                 "expr": rule_expr(self.rule, ip_version, fully_random),
                                 "comment": rule_comment(self.hash, self.rule.comments)}}}

    def to_text(self, ip_version: int, fully_random: bool) -> str:
        body = self.text if self.text is not None else rule_text(self.rule, ip_version, fully_random)
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


def _set_spec(b: dict[str, Any]) -> str:
    """A set's declaration body, as both the ``add set`` line and a table block write it."""
    typ = b["type"] if isinstance(b["type"], str) else " . ".join(b["type"])
    flags = f" flags {', '.join(b['flags'])};" if b.get("flags") else ""
    return f"type {typ};{flags}"


def _map_spec(b: dict[str, Any]) -> str:
    return f"type {b['type']} : {b['map']};"


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
        return f"add set {where} {{ {_set_spec(b)} }}"
    if kind == "map" and verb == "add":
        return f"add map {where} {{ {_map_spec(b)} }}"
    if kind == "element":
        return f"{verb} element {where} {{ {', '.join(_elem_text(e) for e in b['elem'])} }}"
    return f"{verb} {kind} {where}"


# A run of at least this many consecutive additions to one table is written as one table block.
BLOCK_MIN_COMMANDS = 1000

_BLOCKABLE = frozenset({"table", "chain", "set", "map", "element"})


def _addition_of(cmd: Command) -> tuple[str, str] | None:
    """The (family, table) that *cmd* adds to, if it is an addition a table block can hold."""
    if isinstance(cmd, RuleCmd):
        return cmd.family, cmd.table
    (verb, obj), = cmd.items()
    if verb != "add":
        return None
    (kind, b), = obj.items()
    if kind not in _BLOCKABLE:
        return None
    return (b["family"], b["name"]) if kind == "table" else (b["family"], b["table"])


def _block(family: str, table: str, run: list[Command], ip_version: int, fully_random: bool) -> list[str]:
    """A run of additions to one table as one ``table`` block, plus the element additions to sets or
    maps the run did not declare (after the block: an element may name a chain the block adds, and no
    addition in the run depends on an element)."""
    # Objects in the order the run first names them, so the kernel creates them in the same order
    # as the line form would (listings stay in the same order).
    sets: dict[str, str] = {}                       # set or map name -> declaration head
    maps: set[str] = set()
    elems: dict[str, list[str]] = {}
    chains: dict[str, list[str]] = {}               # chain name -> its lines (spec first, if any)
    after: list[str] = []
    for c in run:
        if isinstance(c, RuleCmd):
            body = c.text if c.text is not None else rule_text(c.rule, ip_version, fully_random)
            chains.setdefault(c.chain, []).append(f'{body} comment "{rule_comment(c.hash, c.rule.comments)}"')
            continue
        (kind, b), = c["add"].items()
        if kind == "chain":
            lines = chains.setdefault(b["name"], [])
            if "hook" in b:
                lines.insert(0, f"type {b['type']} hook {b['hook']} priority {b['prio']}; policy {b['policy']};")
        elif kind == "set":
            sets[b["name"]] = f"set {b['name']} {{ {_set_spec(b)}"
        elif kind == "map":
            sets[b["name"]] = f"map {b['name']} {{ {_map_spec(b)}"
            maps.add(b["name"])
        elif kind == "element":
            if b["name"] in sets:
                # A set member string is always an address (only a map key, an interface name, needs quotes;
                # map elements are [key, verdict] pairs): no inet_pton per member of 200,000.
                elems.setdefault(b["name"], []).extend(e if type(e) is str and b["name"] not in maps else _elem_text(e)
                                                       for e in b["elem"])
            else:
                after.append(command_text(c))
        # kind == "table": the block adds the table itself.
    out = [f"table {family} {table} {{"]
    for name, head in sets.items():
        members = elems.get(name)
        out.append(f"{head} elements = {{ {', '.join(members)} }}; }}" if members else f"{head} }}")
    for name, lines in chains.items():
        out.append(f"chain {name} {{")
        out.extend(lines)
        out.append("}")
    out.append("}")
    out.extend(after)
    return out


def to_script(commands: list[Command], ip_version: int, fully_random: bool, *, blocks: bool = True) -> str:
    """*commands* as an nft script; with *blocks*, long runs of additions as table blocks (the table asks
    for them in big transactions only: a block costs nft a pass over the table, which a small
    transaction into a big table would pay for nothing)."""
    lines: list[str] = []
    i, n = 0, len(commands)
    while i < n:
        where = _addition_of(commands[i])
        j = i + 1
        if where is not None:
            while j < n and _addition_of(commands[j]) == where:
                j += 1
        if blocks and where is not None and j - i >= BLOCK_MIN_COMMANDS:
            lines.extend(_block(where[0], where[1], commands[i:j], ip_version, fully_random))
        else:
            lines.extend(c.to_text(ip_version, fully_random) if isinstance(c, RuleCmd) else command_text(c)
                         for c in commands[i:j])
        i = j
    return "\n".join(lines) + "\n"


def to_json(commands: list[Command], ip_version: int, fully_random: bool) -> list[dict[str, Any]]:
    return [c.to_json(ip_version, fully_random) if isinstance(c, RuleCmd) else c for c in commands]
