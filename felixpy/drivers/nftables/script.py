"""A transaction as an nft script: the fast path for large transactions.

The table builds every transaction as libnftables JSON commands, except that
rule additions stay :class:`RuleCmd` and set members :class:`ElementsCmd` (the
set's packed members) until serialised.  Small transactions go
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

A big transaction is written to nft as :func:`script_lines` makes its lines
(``NftScriptLinesShim``): a set's members become text from their packed keys
one set at a time, and neither the 200,000 members of a large node's start of
day nor its ~3 MB script are ever held whole in the daemon (issue #17: the
JSON elements and the joined script were ~23 MiB of its cold-start peak).
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from felixpy.drivers.generictables import model as m
from felixpy.drivers.nftables.members import element_json
from felixpy.drivers.nftables.packed import PackedMembers
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


@dataclass(frozen=True, slots=True)
class ElementsCmd:
    """``add`` or ``delete element`` for some members of one set, serialised on demand.

    A start of day writes every set's members in one transaction (200,000 at the large node): held as the
    set's packed members (:mod:`.packed`), they become nft text a set at a time as the script is written,
    never 200,000 JSON elements at once (issue #17).  *members* are canonical member strings, packed or not."""

    verb: str
    family: str
    table: str
    name: str
    members: Collection[str]

    def to_json(self) -> dict[str, Any]:
        return {self.verb: {"element": {"family": self.family, "table": self.table, "name": self.name,
                                        "elem": [element_json(e) for e in self.members]}}}

    def texts(self) -> Iterator[str]:
        """The members as nft elements, as a table block writes them (a set member string is always an
        address: only a map key, an interface name, needs quotes, so no inet_pton per member)."""
        ms = self.members
        if isinstance(ms, PackedMembers):
            return ms.codec.nft_texts(ms.iter_keys())
        return (e if type(e) is str else _elem_text(e) for e in map(element_json, ms))

    def to_text(self) -> str:
        ms = self.members
        elems = ms.codec.nft_texts(ms.iter_keys()) if isinstance(ms, PackedMembers) else \
            (_elem_text(element_json(e)) for e in ms)
        return f"{self.verb} element {self.family} {self.table} {self.name} {{ {', '.join(elems)} }}"


Command = dict[str, Any] | RuleCmd | ElementsCmd


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
    if isinstance(cmd, ElementsCmd):
        return (cmd.family, cmd.table) if cmd.verb == "add" else None
    (verb, obj), = cmd.items()
    if verb != "add":
        return None
    (kind, b), = obj.items()
    if kind not in _BLOCKABLE:
        return None
    return (b["family"], b["name"]) if kind == "table" else (b["family"], b["table"])


def _block(family: str, table: str, run: list[Command], ip_version: int, fully_random: bool) -> Iterator[str]:
    """A run of additions to one table as one ``table`` block, plus the element additions to sets or
    maps the run did not declare (after the block: an element may name a chain the block adds, and no
    addition in the run depends on an element).  Lines as they are consumed: the run's members and rules
    become text a set, a rule at a time, never all held as text at once."""
    # Objects in the order the run first names them, so the kernel creates them in the same order
    # as the line form would (listings stay in the same order).
    sets: dict[str, str] = {}                       # set or map name -> declaration head
    maps: set[str] = set()
    elems: dict[str, list[ElementsCmd | dict[str, Any]]] = {}
    chains: dict[str, list[str | RuleCmd]] = {}     # chain name -> its spec (if any), then its rules
    after: list[Command] = []
    for c in run:
        if isinstance(c, RuleCmd):
            chains.setdefault(c.chain, []).append(c)
            continue
        if isinstance(c, ElementsCmd):
            if c.name in sets:
                elems.setdefault(c.name, []).append(c)
            else:
                after.append(c)
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
                elems.setdefault(b["name"], []).append(c)
            else:
                after.append(c)
        # kind == "table": the block adds the table itself.

    def element_texts(name: str) -> Iterator[str]:
        for e in elems.get(name, ()):
            if isinstance(e, ElementsCmd):
                yield from e.texts()
            else:
                # A set member string is always an address (only a map key, an interface name, needs
                # quotes; map elements are [key, verdict] pairs): no inet_pton per member.
                yield from (x if type(x) is str and name not in maps else _elem_text(x)
                            for x in e["add"]["element"]["elem"])

    yield f"table {family} {table} {{"
    for name, head in sets.items():
        members = ", ".join(element_texts(name))
        yield f"{head} elements = {{ {members} }}; }}" if members else f"{head} }}"
    for name, lines in chains.items():
        yield f"chain {name} {{"
        for line in lines:
            if isinstance(line, str):
                yield line
            else:
                body = line.text if line.text is not None else rule_text(line.rule, ip_version, fully_random)
                yield f'{body} comment "{rule_comment(line.hash, line.rule.comments)}"'
        yield "}"
    yield "}"
    yield from (_line(c, ip_version, fully_random) for c in after)


def _line(c: Command, ip_version: int, fully_random: bool) -> str:
    if isinstance(c, RuleCmd):
        return c.to_text(ip_version, fully_random)
    if isinstance(c, ElementsCmd):
        return c.to_text()
    return command_text(c)


def script_lines(commands: list[Command], ip_version: int, fully_random: bool, *,
                 blocks: bool = True) -> Iterator[str]:
    """*commands* as the lines of an nft script (without their newlines), made as they are consumed; with
    *blocks*, long runs of additions as table blocks (the table asks for them in big transactions only: a
    block costs nft a pass over the table, which a small transaction into a big table would pay for
    nothing)."""
    i, n = 0, len(commands)
    while i < n:
        where = _addition_of(commands[i])
        j = i + 1
        if where is not None:
            while j < n and _addition_of(commands[j]) == where:
                j += 1
        if blocks and where is not None and j - i >= BLOCK_MIN_COMMANDS:
            yield from _block(where[0], where[1], commands[i:j], ip_version, fully_random)
        else:
            yield from (_line(commands[k], ip_version, fully_random) for k in range(i, j))
        i = j


def to_script(commands: list[Command], ip_version: int, fully_random: bool, *, blocks: bool = True) -> str:
    """*commands* as one nft script: :func:`script_lines`, joined."""
    return "\n".join(script_lines(commands, ip_version, fully_random, blocks=blocks)) + "\n"


def to_json(commands: list[Command], ip_version: int, fully_random: bool) -> list[dict[str, Any]]:
    return [c.to_json(ip_version, fully_random) if isinstance(c, RuleCmd) else
            c.to_json() if isinstance(c, ElementsCmd) else c for c in commands]
