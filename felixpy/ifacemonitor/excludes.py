"""``InterfaceExclude``: which interfaces get no address tracking.

Entries are Felix's regex-list syntax: ``/pattern/`` is a regular expression
(searched, unanchored, as Go's ``regexp.Match``); anything else is a literal
interface name matched exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from felixpy.errors import ConfigError


def compile_excludes(entries: Iterable[str]) -> list[re.Pattern[str]]:
    patterns: list[re.Pattern[str]] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        if len(entry) >= 2 and entry.startswith("/") and entry.endswith("/"):
            try:
                patterns.append(re.compile(entry[1:-1]))
            except re.error as exc:
                raise ConfigError(f"InterfaceExclude: bad regular expression {entry!r}: {exc}") from exc
        else:
            patterns.append(re.compile("^" + re.escape(entry) + "$"))
    return patterns


def exclusion_matcher(entries: Iterable[str]) -> Callable[[str], bool]:
    """A predicate: is this interface name excluded from address tracking?"""
    patterns = compile_excludes(entries)

    def excluded(name: str) -> bool:
        return any(p.search(name) for p in patterns)

    return excluded
