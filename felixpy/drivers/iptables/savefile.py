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


def parse_save(text: str, *, hash_re: re.Pattern[str], owned_re: re.Pattern[str],
               old_insert_re: re.Pattern[str] | None = None) -> SaveState:
    hashes: dict[str, list[str]] = {}
    full: dict[str, list[str]] = {}
    has_ours: set[str] = set()
    owned_cache: dict[str, bool] = {}
    for line in text.splitlines():
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
            continue
        if c0 == "[":
            m = _COUNTERS.match(line)
            if not m:
                continue
            line = line[m.end():]
        if not line.startswith("-A "):
            continue
        end = line.find(" ", 3)
        chain = line[3:end] if end > 0 else line[3:]
        m = hash_re.search(line)
        if m is not None:
            hash_ = m.group(1)
        elif old_insert_re is not None and old_insert_re.search(line):
            hash_ = OLD_INSERT
        else:
            hash_ = FOREIGN
        lst = hashes.get(chain)
        if lst is None:
            lst = hashes[chain] = []
        lst.append(hash_)
        owned = owned_cache.get(chain)
        if owned is None:
            owned = owned_cache[chain] = owned_re.match(chain) is not None
        if not owned:
            if hash_:
                has_ours.add(chain)
            full.setdefault(chain, []).append(line if hash_ else FOREIGN_PLACEHOLDER)
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


def chains_of(text: str) -> list[str]:
    """Chain names declared in a save dump, in order."""
    return [line[1:].split(" ", 1)[0] for line in text.splitlines() if line.startswith(":")]


def rules_by_chain(text: str) -> dict[str, list[str]]:
    """Every declared chain → its ``-A`` lines with the ``-A <chain> `` head removed."""
    out: dict[str, list[str]] = {c: [] for c in chains_of(text)}
    for line in text.splitlines():
        m = _COUNTERS.match(line)
        if m:
            line = line[m.end():]
        if line.startswith("-A "):
            chain, _, spec = line[3:].partition(" ")
            out.setdefault(chain, []).append(spec)
    return out


def join_lines(lines: Iterable[str]) -> str:
    return "".join(line + "\n" for line in lines)
