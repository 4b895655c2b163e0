"""The child that runs an ``ip[6]tables-save`` and parses it, so that a big save's text never enters the daemon.

``python -m felixpy.drivers.iptables.saveworker [--hash-prefix P] [--owned-prefix X ...] [--extra-cleanup R]
-- SAVE [ARGS ...]`` runs ``SAVE ARGS`` (through :class:`~felixpy.drivers.cmdshim.SubprocessRunner`, so the
text is decoded exactly as the daemon would decode it), cuts a full save into its tables
(:func:`~.savefile.split_tables`; one ``-t`` table's output is that table), parses each with
:func:`~.savefile.parse_save` and prints one JSON object: per table, its :class:`~.savefile.SaveState` in wire
form, or ``{"error": …}`` when the parser refuses it (iptables-nft's "is incompatible").  The save's own
failure is passed on: exit status :data:`EXIT_SAVE_FAILED`, its status and stderr as JSON on stderr.  It
inherits the caller's network namespace and writes nothing to the kernel.

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
import sys
from collections.abc import Sequence
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


def report(text: str, table: str | None, *, hash_prefix: str, owned_prefixes: Sequence[str],
           extra_cleanup_regex: str) -> dict[str, Any]:
    """Each table of *text* (or, for a ``-t`` save, *table*) parsed, in wire form."""
    sections = {table: text} if table is not None else split_tables(text)
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


def state_from_wire(entry: Any) -> SaveState:
    """One table's entry of :func:`report`; :class:`SaveParseError` for a refused table or a torn entry."""
    if not isinstance(entry, dict):
        raise SaveParseError(f"save worker: not a table entry: {type(entry).__name__}")
    if "error" in entry:
        raise SaveParseError(str(entry["error"]))
    hashes, full = entry.get("hashes"), entry.get("full")
    if not isinstance(hashes, dict) or not isinstance(full, dict):
        raise SaveParseError("save worker: table entry without hashes")
    return SaveState(hashes, full)


def parse_output(stdout: str) -> dict[str, Any]:
    """The child's stdout; :class:`SaveParseError` if it is not a complete report."""
    try:
        out = json.loads(stdout)
    except ValueError as e:
        raise SaveParseError(f"save worker printed no report: {e}") from e
    if not isinstance(out, dict):
        raise SaveParseError("save worker printed no report")
    return out


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

    res = SubprocessRunner().run(save)
    if not res.ok:
        json.dump({"returncode": res.returncode, "stderr": res.stderr}, sys.stderr)
        return EXIT_SAVE_FAILED
    out = report(res.stdout, _table_of(save), hash_prefix=ns.hash_prefix,
                 owned_prefixes=tuple(ns.owned_prefix or DEFAULT_OWNED_PREFIXES),
                 extra_cleanup_regex=ns.extra_cleanup)
    sys.stdout.write(json.dumps(out, separators=(",", ":")))  # one C-encoder call (json.dump is chunked Python)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
