"""Chains, rule hashes and foreign objects from nft's terse *text* listing of the table (pure functions).

``nft -t -y list table F T`` (terse: no set or map elements; ``-y``: priorities as numbers) prints the
table's chains and rules in about 0.7 s at the large node where ``nft -j list table`` takes 1.1 s, and
reading 2.6 MB of lines costs ~10 ms where ``json.loads`` of the JSON costs ~0.6 s (the rules'
expression trees).  The restart's read-back (:mod:`.snapshotworker`) takes chains and rules from here
and sets and maps from their own JSON listings, which carry their elements.

What is read is only what :func:`~.readback.parse_table` keeps: per chain its base-chain shape and the
``cali:`` hash of each rule's comment (``""`` for none), and the names of objects we never write.
Set and map blocks are skipped (their declarations carry nothing the JSON listings do not).

The reader is strict: every line must be one it can classify, else :class:`Unreadable` and the caller
reads the JSON listing instead — a failed fast path, never a wrong snapshot.  nft prints strings
without escaping them, so a rule's comment is taken only where it cannot be anything else: a rule is
one line, its quotes pair up, and the only string preceded by the ``comment`` keyword is the last
thing on the line.  A string holding a quote (or a comment holding a newline) can still mislead a
parse of text; such a rule can only be made on purpose by someone who can write the table, and the
JSON path trusts the same comment as the rule's identity, so the text adds no way to fool the read
that the JSON listing does not already allow.
"""

from __future__ import annotations

import re

from felixpy.drivers.nftables.names import BaseChainSpec, hash_from_comment
from felixpy.drivers.nftables.readback import OBJECT_KINDS_WE_DELETE as _OTHER_KINDS
from felixpy.drivers.nftables.readback import ChainSnapshot

# nft's block keywords: the objects parse_table reports as foreign (_OTHER_KINDS, which nft's text names
# as its JSON does), and the sets, maps and chains.
_NAME = r"([^\s\"{}]+)"
_TABLE = re.compile(r"table (\S+) " + _NAME + r" \{")
_BLOCK = re.compile(r"\t(set|map|chain|" + "|".join(_OTHER_KINDS) + r") " + _NAME + r" \{")
# How nft starts a chain's own properties (no rule starts so; a rule of only a comment starts " comment").
_CHAIN_PROPERTIES = ("type ", "policy ", "flags ", "comment ", "devices ", "device ")
_BASE = re.compile(r"\t\ttype (\S+) hook (\S+) priority (-?\d+);(?: policy (accept|drop);)?")


class Unreadable(ValueError):
    """The text holds a line the reader cannot classify: read the table's JSON listing instead."""

    def __init__(self, lineno: int, line: str, why: str) -> None:
        super().__init__(f"line {lineno}: {why}: {line[:200]!r}")


def rule_hash(body: str) -> str | None:
    """The ``cali:`` hash of the rule printed as *body* (its line without the leading two tabs): ``""``
    for a rule without a comment or with a comment not ours; None when the line is not unambiguous."""
    if '"' not in body:
        return ""
    parts = body.split('"')
    if len(parts) % 2 == 0:
        return None                     # an odd number of quotes: a string spans lines or holds a quote
    outside = parts[0::2]               # nft's own syntax, between the strings
    last = len(parts) // 2 - 1          # index of the last string
    comment: str | None = None
    for i, text in enumerate(outside[:-1]):
        if (" " + text).endswith(" comment "):
            if i != last or outside[-1] != "":
                return None             # "comment" before a string that does not end the line
            comment = parts[2 * i + 1]
    if "comment" in outside[-1]:
        return None
    return hash_from_comment(comment)


def parse_terse_text(text: str, family: str, table: str) -> tuple[dict[str, ChainSnapshot], list[tuple[str, str]]]:
    """The chains (base shape, rule hashes in order) and foreign objects of ``nft -t -y list table
    family table``'s output; :class:`Unreadable` for anything it does not recognise."""
    if "\ufffd" in text:       # an undecodable byte (the runner's replacement): the JSON would differ
        at = text.index("\ufffd")
        raise Unreadable(text.count("\n", 0, at) + 1, text[text.rfind("\n", 0, at) + 1:at + 1], "not UTF-8")
    lines = text.split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise Unreadable(0, "", "empty listing")
    m = _TABLE.fullmatch(lines[0])
    if m is None or m.group(1) != family or m.group(2) != table:
        raise Unreadable(1, lines[0], f"not the listing of table {family} {table}")
    if lines[-1] != "}":
        raise Unreadable(len(lines), lines[-1], "the table block does not end the listing")
    chains: dict[str, ChainSnapshot] = {}
    others: list[tuple[str, str]] = []
    i, end = 1, len(lines) - 1
    while i < end:
        line = lines[i]
        if line == "":
            i += 1
            continue
        m = _BLOCK.fullmatch(line)
        if m is None:
            raise Unreadable(i + 1, line, "not a block of the table")
        kind, name = m.group(1), m.group(2)
        i += 1
        if kind == "chain":
            if name in chains:
                raise Unreadable(i, line, "a chain listed twice")
            chain = chains[name] = ChainSnapshot()
            if i < end:
                b = _BASE.fullmatch(lines[i])
                if b is not None:
                    chain.base = BaseChainSpec(b.group(1), b.group(2), int(b.group(3)), b.group(4) or "accept")
                    i += 1
            while i < end and lines[i] != "\t}":
                line = lines[i]
                if not line.startswith("\t\t") or line.startswith("\t\t\t"):
                    raise Unreadable(i + 1, line, "not a rule of the chain")
                if line.startswith(_CHAIN_PROPERTIES, 2):
                    raise Unreadable(i + 1, line, "a chain property this reader does not know")
                h = rule_hash(line[2:])
                if h is None:
                    raise Unreadable(i + 1, line, "a rule whose comment cannot be told apart")
                chain.hashes.append(h)
                i += 1
        else:
            if kind in _OTHER_KINDS:
                others.append((kind, name))
            while i < end and lines[i] != "\t}":
                if not lines[i].startswith("\t\t"):
                    raise Unreadable(i + 1, lines[i], f"not a line of the {kind} block")
                i += 1
        if i >= end:
            raise Unreadable(i, lines[i - 1], f"the {kind} {name} block does not end")
        i += 1          # the block's "\t}"
    return chains, others
