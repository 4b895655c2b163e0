"""Pure parsers of ``ip[6]tables-save`` output (no I/O; tested with captured text).

The table reads back only what identifies its rules, as Felix does:

* ``:<chain> …`` declares a chain (possibly empty);
* ``-A <chain> …`` is a rule; its hash is the first ``--comment "cali:<hash>"``
  on the line, ``""`` for a foreign rule, or :data:`OLD_INSERT` for a rule an
  older Felix inserted without a hash (matched by the historic-prefix regex);
* for chains that are *not* ours but hold some of our rules, the full text of
  each of our rules is kept (``"-"`` for foreign ones) so they can be deleted by
  value rather than by position;
* iptables-nft's ``# Table … is incompatible, use 'nft' tool.`` is an error.

Counters (``-c``: ``[pkts:bytes] -A …``) are tolerated everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

OLD_INSERT = "OLD INSERT RULE"
FOREIGN = ""
FOREIGN_PLACEHOLDER = "-"

DEFAULT_OWNED_PREFIXES: tuple[str, ...] = (
    "cali-", "califw-", "calitw-", "califh-", "calith-", "calipi-", "calipo-", "felix-",
)
# Python Felix's MASQ rule and the pre-hash tunl0 MASQ rule in nat POSTROUTING.
HISTORIC_INSERTED_NAT_RULE_REGEX = (
    r"-A POSTROUTING .* felix-masq-ipam-pools .*|"
    r"-A POSTROUTING -o tunl0 -m addrtype ! --src-type LOCAL --limit-iface-out -m addrtype "
    r"--src-type LOCAL -j MASQUERADE"
)
KUBE_PROXY_INSERT_RULE_REGEX = r"-j KUBE-[a-zA-Z0-9-]*SERVICES|-j KUBE-FORWARD"

_NFT_INCOMPATIBLE = re.compile(r"^# Table .* is incompatible, use 'nft' tool\.")
_COUNTERS = re.compile(r"^\[(\d+):(\d+)\] ")


class SaveParseError(ValueError):
    """The save output cannot be trusted (e.g. iptables-nft cannot represent the table)."""


def owned_chain_regex(prefixes: Sequence[str] = DEFAULT_OWNED_PREFIXES) -> re.Pattern[str]:
    return re.compile("^(" + "|".join(re.escape(p) for p in prefixes) + ")")


def hash_comment_regex(hash_prefix: str = "cali:") -> re.Pattern[str]:
    return re.compile(r'--comment "?' + re.escape(hash_prefix) + r'([a-zA-Z0-9_-]+)"?')


def old_insert_regex(prefixes: Sequence[str] = DEFAULT_OWNED_PREFIXES,
                     extra: str = "") -> re.Pattern[str]:
    parts = [f"(?:-j|--jump) {re.escape(p)}" for p in prefixes]
    if extra:
        parts.append(extra)
    return re.compile("|".join(parts))


@dataclass(slots=True)
class SaveState:
    """What a save told us: per chain, one hash per rule (``""`` = foreign)."""

    hashes: dict[str, list[str]] = field(default_factory=dict)
    # Only non-owned chains that contain at least one of our rules; "-" for foreign rules.
    full_rules: dict[str, list[str]] = field(default_factory=dict)


# A run of one chain's rules as *-save prints them: consecutive "-A <chain> …" lines.
_RULE_RUN = re.compile(r"^-A (\S+) [^\n]*\n(?:-A \1 [^\n]*\n)*", re.M)
# Line boundaries str.splitlines() honours besides "\n" (in ASCII text).
_OTHER_LINE_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")


def parse_save(text: str | Iterable[str], *, hash_re: re.Pattern[str], owned_re: re.Pattern[str],
               old_insert_re: re.Pattern[str] | None = None) -> SaveState:
    """What a save says: per chain, one hash per rule; full text where :class:`SaveState` keeps it.

    Equivalent to reading ``text.splitlines()`` one line at a time.  In the usual
    text (ASCII, ``\n`` line ends) each run of one chain's rules is found with one
    regex match and hashed with one ``map`` of the hash regex; everything between
    runs (headers, declarations, counters, comments) goes through the line loop.

    *text* may also come in pieces, each of whole lines (the save worker parses a
    save while it is being written, :meth:`~felixpy.drivers.cmdshim.SubprocessRunner.follow`):
    the result is the joined text's.
    """
    hashes: dict[str, list[str]] = {}
    full: dict[str, list[str]] = {}
    has_ours: set[str] = set()
    owned_cache: dict[str, bool] = {}
    search = hash_re.search
    old_search = old_insert_re.search if old_insert_re is not None else None

    def is_owned(chain: str) -> bool:
        owned = owned_cache.get(chain)
        if owned is None:
            owned = owned_cache[chain] = owned_re.match(chain) is not None
        return owned

    def rule_hash(m: re.Match[str] | None, line: str) -> str:
        if m is not None:
            return m[1]
        if old_search is not None and old_search(line):
            return OLD_INSERT
        return FOREIGN

    def add_run(chain: str, lines: list[str]) -> None:
        """Rules of *chain*, every line starting ``-A <chain> ``."""
        matches = list(map(search, lines))
        if None in matches:
            run_hashes = [rule_hash(m, line) for m, line in zip(matches, lines)]
        else:
            run_hashes = [m[1] for m in matches]  # type: ignore[index]
        lst = hashes.get(chain)
        if lst is None:
            hashes[chain] = run_hashes
        else:
            lst.extend(run_hashes)
        if not is_owned(chain):
            fl = full.get(chain)
            if fl is None:
                fl = full[chain] = []
            for h, line in zip(run_hashes, lines):
                if h:
                    has_ours.add(chain)
                    fl.append(line)
                else:
                    fl.append(FOREIGN_PLACEHOLDER)

    def add_lines(lines: list[str]) -> None:
        """Any lines, one at a time."""
        cur_prefix = "\n"  # "-A <chain> " of the last rule line (no line starts with it initially)
        cur_chain = ""
        cur_hashes: list[str] = []
        cur_full: list[str] | None = None  # the chain's full-rule list, if it is not owned
        for line in lines:
            if not line.startswith(cur_prefix):
                if not line:
                    continue
                c0 = line[0]
                if c0 == "#":
                    if _NFT_INCOMPATIBLE.match(line):
                        raise SaveParseError("iptables-save failed: incompatible nft rules in the table")
                    continue
                if c0 == ":":
                    end = line.find(" ")
                    hashes[line[1:end] if end > 0 else line[1:]] = []
                    cur_prefix = "\n"  # the declaration may have replaced the current chain's list
                    continue
                if c0 == "[":
                    m = _COUNTERS.match(line)
                    if not m:
                        continue
                    line = line[m.end():]
                if not line.startswith(cur_prefix):
                    if not line.startswith("-A "):
                        continue
                    end = line.find(" ", 3)
                    if end > 0:
                        cur_chain = line[3:end]
                        cur_prefix = line[:end + 1]
                    else:  # "-A <chain>" and nothing else: no fast path for it
                        cur_chain = line[3:]
                        cur_prefix = "\n"
                    lst = hashes.get(cur_chain)
                    if lst is None:
                        lst = hashes[cur_chain] = []
                    cur_hashes = lst
                    if is_owned(cur_chain):
                        cur_full = None
                    else:
                        fl = full.get(cur_chain)
                        if fl is None:
                            fl = full[cur_chain] = []
                        cur_full = fl
            hash_ = rule_hash(search(line), line)
            cur_hashes.append(hash_)
            if cur_full is not None:
                if hash_:
                    has_ours.add(cur_chain)
                    cur_full.append(line)
                else:
                    cur_full.append(FOREIGN_PLACEHOLDER)

    for piece in ((text,) if isinstance(text, str) else text):
        if piece.isascii() and not any(c in piece for c in _OTHER_LINE_BREAKS):
            pos = 0
            for run in _RULE_RUN.finditer(piece):
                start, stop = run.span()
                if start > pos:
                    add_lines(piece[pos:start].splitlines())
                add_run(run[1], piece[start:stop - 1].split("\n"))
                pos = stop
            if pos < len(piece):
                add_lines(piece[pos:].splitlines())
        else:
            add_lines(piece.splitlines())
    return SaveState(hashes, {c: r for c, r in full.items() if c in has_ours})


@dataclass(frozen=True, slots=True)
class CountedRule:
    chain: str
    hash: str
    packets: int
    bytes: int
    text: str


def parse_save_counters(text: str, hash_prefix: str = "cali:") -> list[CountedRule]:
    """Rules of a ``*-save -c`` dump with their counters (tests check counters survive)."""
    hre = hash_comment_regex(hash_prefix)
    out = []
    for line in text.splitlines():
        m = _COUNTERS.match(line)
        if not m:
            continue
        rest = line[m.end():]
        if not rest.startswith("-A "):
            continue
        chain = rest[3:].split(" ", 1)[0]
        hm = hre.search(rest)
        out.append(CountedRule(chain, hm.group(1) if hm else "", int(m.group(1)), int(m.group(2)), rest))
    return out


# --------------------------------------------------------------------- a full save, per table
_INCOMPATIBLE = re.compile(r"^# Table `([^']+)' is incompatible, use 'nft' tool\.$", re.MULTILINE)
_COMMIT = "\nCOMMIT\n"


def split_tables(text: str) -> dict[str, str]:
    """A full ``*-save`` output cut into each table's own section, as ``-t <table>`` prints it minus the
    ``#`` comments: ``*name`` through ``COMMIT``; or, for a table iptables-nft cannot show, its
    "is incompatible" line (which the parser rejects, as it does in a ``-t`` output)."""
    out: dict[str, str] = {}
    start = _next_header(text, 0)
    while start >= 0:
        nl = text.find("\n", start)
        if nl < 0:
            break  # a header and nothing after it: a torn output, no section
        name = text[start + 1:nl].strip()
        end = text.find(_COMMIT, nl)
        if end < 0:
            out[name] = text[start:]  # no COMMIT: the parser sees what there is
            break
        stop = end + len(_COMMIT)
        out[name] = text[start:stop]
        start = _next_header(text, stop)
    if "' is incompatible, use 'nft' tool." in text:
        for m in _INCOMPATIBLE.finditer(text):
            out[m.group(1)] = m.group(0) + "\n"
    return out


def _next_header(text: str, pos: int) -> int:
    """Where the next ``*table`` line at or after line start *pos* begins; -1 if none."""
    if text.startswith("*", pos):
        return pos
    i = text.find("\n*", pos)
    return -1 if i < 0 else i + 1
