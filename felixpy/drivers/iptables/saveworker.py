"""The child that runs an ``ip[6]tables-save`` and parses it, so that a big save's text never enters the daemon.

``python -m felixpy.drivers.iptables.saveworker [--hash-prefix P] [--owned-prefix X ...] [--extra-cleanup R]
-- SAVE [ARGS ...]`` runs ``SAVE ARGS`` (through :class:`~felixpy.drivers.cmdshim.SubprocessRunner`, so the
text is decoded exactly as the daemon would decode it), cuts a full save into its tables
(:func:`~.savefile.split_tables`; one ``-t`` table's output is that table, parsed while the save writes
it: :meth:`~felixpy.drivers.cmdshim.SubprocessRunner.follow`), parses each with
:func:`~.savefile.parse_save` and prints a report: per table, its :class:`~.savefile.SaveState` in wire
form, or an error when the parser refuses it (iptables-nft's "is incompatible").  The save's own
failure is passed on: exit status :data:`EXIT_SAVE_FAILED`, its status and stderr as JSON on stderr.  It
inherits the caller's network namespace and writes nothing to the kernel.

The report is JSON a few chains to a line (:func:`encode_report`), and the daemon decodes it a line at a
time (:func:`state_from_wire`), keeping its own list of hashes for a chain the save shows as it expects: at
a restart of the stress profile the report is ~145,000 hashes, ~12 MiB as strings in lists, which a decode
of the whole report at once held beside the table's own equal lists until the apply compared them.

Why a process (issue #17): at the stress profile a filter table of ~145,000 rules saves as ~28 MB of text.
Read and parsed in the daemon that is ~55 MB above the steady state while it lasts, and the parse's small
strings interleave with the result's in the allocator's arenas, so much of it stays resident afterwards;
every refresh and post-write check paid it again.  Here it lives and dies with the child, and the daemon
decodes only the hashes (a few MB of JSON).  The table uses the child only above a size
(``IptablesTable(save_worker_min_rules=…)``): for a small table the child's start (~60 ms) would cost more
than the parse.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from felixpy.drivers.iptables.savefile import (
    DEFAULT_OWNED_PREFIXES,
    SaveParseError,
    SaveState,
    hash_comment_regex,
    old_insert_regex,
    owned_chain_regex,
    parse_save,
    split_tables,
)

EXIT_SAVE_FAILED = 3
MODULE = "felixpy.drivers.iptables.saveworker"


def worker_argv(python: str, save_argv: Sequence[str], *, hash_prefix: str,
                owned_prefixes: Sequence[str], extra_cleanup_regex: str) -> list[str]:
    """The command line that has the child run *save_argv* and parse it with these settings."""
    argv = [python, "-m", MODULE, "--hash-prefix", hash_prefix]
    for p in owned_prefixes:
        argv += ["--owned-prefix", p]
    if extra_cleanup_regex:
        argv += ["--extra-cleanup", extra_cleanup_regex]
    return [*argv, "--", *save_argv]


def report(text: str | Iterable[str], table: str | None, *, hash_prefix: str, owned_prefixes: Sequence[str],
           extra_cleanup_regex: str) -> dict[str, Any]:
    """Each table of *text* (or, for a ``-t`` save, *table*) parsed, in wire form.  A ``-t`` save's text may
    come in pieces of whole lines (:func:`~.savefile.parse_save`); a full save's is cut into tables first,
    so it is joined."""
    if table is None:
        sections: dict[str, str | Iterable[str]] = dict(split_tables(text if isinstance(text, str) else "".join(text)))
    else:
        sections = {table: text}
    hash_re, owned_re = hash_comment_regex(hash_prefix), owned_chain_regex(owned_prefixes)
    old_re = old_insert_regex(owned_prefixes, extra_cleanup_regex)
    out: dict[str, Any] = {}
    for name, section in sections.items():
        try:
            state = parse_save(section, hash_re=hash_re, owned_re=owned_re, old_insert_re=old_re)
        except SaveParseError as e:
            out[name] = {"error": str(e)}
            continue
        out[name] = {"hashes": state.hashes, "full": state.full_rules}
    return out


# ------------------------------------------------------------------------------ the wire form
# One JSON value a line:
#   {"table": NAME} or {"table": NAME, "error": MSG}   opens a table's section;
#   ["h", CHAIN, [HASH, ...], CHAIN, [HASH, ...], ...]  chains' hashes (SaveState.hashes), "" = foreign;
#   ["f", CHAIN, [RULE, ...], ...]                      chains' kept rule text (SaveState.full_rules);
#   {"end": N}                                          the last line, after N sections: without it, torn.
# A chain line holds chains up to LINE_ITEMS hashes or rules (a bigger chain is a line of its own): small
# enough that a line's decoded copy is nothing beside the table, big enough that decoding ~31,000 chains
# is not ~31,000 calls (a line a chain decoded the stress profile's report at about half the speed).
LINE_ITEMS = 2_000
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # built once: the C encoder, no per-call setup
_OBJECT_LINE = re.compile(r"^\{.*$", re.M)  # section headers and the end line; chain lines are arrays


def _chain_lines(kind: str, chains: dict[str, list[str]]) -> Iterator[str]:
    line: list[Any] = [kind]
    items = 0
    for chain, values in chains.items():
        if items and items + len(values) > LINE_ITEMS:
            yield _ENCODE(line)
            line, items = [kind], 0
        line += (chain, values)
        items += len(values)
    if len(line) > 1:
        yield _ENCODE(line)


def encode_report(out: dict[str, Any]) -> str:
    """*out* (:func:`report`) as the child prints it."""
    lines = []
    for name, entry in out.items():
        if "error" in entry:
            lines.append(_ENCODE({"table": name, "error": entry["error"]}))
            continue
        lines.append(_ENCODE({"table": name}))
        lines.extend(_chain_lines("h", entry["hashes"]))
        lines.extend(_chain_lines("f", entry["full"]))
    lines.append(_ENCODE({"end": len(out)}))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class WireTable:
    """One table's section of a report, not decoded yet: *text*[*start*:*end*], a chain a line."""

    text: str
    start: int
    end: int
    error: str | None = None


def parse_output(stdout: str) -> dict[str, WireTable]:
    """The child's stdout cut into its tables' sections; :class:`SaveParseError` if it is not a complete
    report.  Only the section headers are decoded here: a table decodes its own section
    (:func:`state_from_wire`), so a shared dump's four tables never all sit decoded at once."""
    heads: list[tuple[int, int, Any]] = []
    try:
        for m in _OBJECT_LINE.finditer(stdout):
            heads.append((m.start(), m.end(), json.loads(m.group())))
    except ValueError as e:
        raise SaveParseError(f"save worker printed no report: {e}") from e
    if not heads or not isinstance(heads[-1][2], dict) or heads[-1][2].get("end") != len(heads) - 1 \
            or stdout[heads[-1][1]:] != "\n":
        raise SaveParseError("save worker printed no complete report")
    out: dict[str, WireTable] = {}
    for (_, body, head), (nxt, _, _) in zip(heads, heads[1:]):
        if not isinstance(head, dict) or not isinstance(head.get("table"), str):
            raise SaveParseError(f"save worker: not a table header: {head!r}")
        error = head.get("error")
        out[head["table"]] = WireTable(stdout, body + 1, nxt, None if error is None else str(error))
    return out


def state_from_wire(entry: Any, known: Callable[[str], list[str] | None] | None = None) -> SaveState:
    """One table's section (:func:`parse_output`) decoded a chain at a time; :class:`SaveParseError` for a
    refused table or a torn section.  Where *known* (the table's expected hashes of a chain, if it has
    them) equals what the save shows, the state holds that very list and the decoded copy is dropped at
    once: a restart with nothing to change then holds no second copy of the table's hashes."""
    if not isinstance(entry, WireTable):
        raise SaveParseError(f"save worker: not a table entry: {type(entry).__name__}")
    if entry.error is not None:
        raise SaveParseError(entry.error)
    hashes: dict[str, list[str]] = {}
    full: dict[str, list[str]] = {}
    text, pos, end = entry.text, entry.start, entry.end
    loads = json.loads
    while pos < end:
        nl = text.find("\n", pos, end)
        nl = end if nl < 0 else nl
        try:
            line = loads(text[pos:nl])
        except ValueError as e:
            raise SaveParseError(f"save worker: torn chain line: {e}") from e
        if not isinstance(line, list) or len(line) % 2 != 1 or line[0] not in ("h", "f"):
            raise SaveParseError(f"save worker: not a chain line: {text[pos:nl][:200]!r}")
        into = hashes if line[0] == "h" else full
        for i in range(1, len(line), 2):
            chain, values = line[i], line[i + 1]
            if not isinstance(chain, str) or not isinstance(values, list):
                raise SaveParseError(f"save worker: not a chain line: {text[pos:nl][:200]!r}")
            if into is hashes and known is not None:
                mine = known(chain)
                if mine is not None and mine == values:
                    values = mine
            into[chain] = values
        del line  # the decoded copies of what *known* had go now, not with the next line
        pos = nl + 1
    return SaveState(hashes, full)


def _table_of(save_argv: Sequence[str]) -> str | None:
    args = list(save_argv)
    for i, a in enumerate(args):
        if a in ("-t", "--table") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--table="):
            return a.split("=", 1)[1]
    return None


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    ap.add_argument("--hash-prefix", default="cali:")
    ap.add_argument("--owned-prefix", action="append", default=None)
    ap.add_argument("--extra-cleanup", default="")
    ap.add_argument("save", nargs=argparse.REMAINDER)
    ns = ap.parse_args(list(argv))
    save = list(ns.save[1:] if ns.save[:1] == ["--"] else ns.save)
    if not save:
        ap.print_usage(sys.stderr)
        return 2
    from felixpy.drivers.cmdshim import SubprocessRunner

    settings: dict[str, Any] = {"hash_prefix": ns.hash_prefix, "extra_cleanup_regex": ns.extra_cleanup,
                                "owned_prefixes": tuple(ns.owned_prefix or DEFAULT_OWNED_PREFIXES)}
    table = _table_of(save)
    # One table's save is parsed while it is written (the parse keeps up with iptables-legacy-save on a
    # core of its own, so it ends about when the save does instead of starting then: ~0.2 s of a
    # 145,000-rule table's ~1.0 s read, issue #17).  The parser stops reading at a refused table (its
    # "is incompatible" comment); the save is still waited for, and its own failure comes first.
    with SubprocessRunner().follow(save) as running:
        out = report(running.pieces(), table, **settings) if table is not None else None
        res = running.result()
        if out is None and res.ok:  # a full save: cut into its tables, so read whole
            out = report("".join(running.pieces()), None, **settings)
    if not res.ok:
        json.dump({"returncode": res.returncode, "stderr": res.stderr}, sys.stderr)
        return EXIT_SAVE_FAILED
    assert out is not None
    sys.stdout.write(encode_report(out))
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown: freeing a 145,000-rule table's parse one object at a time is
    # ~30 ms more on the daemon's read for nothing (the report is written and flushed; nothing else is open).
    os._exit(status)
