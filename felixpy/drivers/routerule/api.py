"""The route-rule contract producers are written against, and the pure rule builders.

:class:`~felixpy.drivers.routerule.rules.RouteRules` implements :class:`RouteRulesAPI`;
managers depend on this module only (values and a Protocol, no kernel access).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from felixpy.drivers.netlink.types import Rule, canon_cidr, family_of


class RouteRulesAPI(Protocol):
    ip_version: int

    def set_rule(self, rule: Rule) -> None: ...

    def remove_rule(self, rule: Rule) -> None: ...

    def queue_resync(self) -> None: ...

    def apply(self) -> None: ...


RulesMatch = Callable[[Rule, Rule], bool]


def match_src_fwmark(a: Rule, b: Rule) -> bool:
    return (a.priority == b.priority and a.family == b.family and a.invert == b.invert and a.mark == b.mark
            and a.mask == b.mask and a.src == b.src)


def match_src_fwmark_table(a: Rule, b: Rule) -> bool:
    return match_src_fwmark(a, b) and a.table == b.table


def make_rule(ip_version: int, priority: int, table: int, *, mark: int | None = None, mask: int | None = None,
              invert: bool = False, src: str | None = None) -> Rule:
    """Build a rule as Felix's ``NewRule(...).MatchFWMark...GoToTable`` chain does."""
    if mark is not None:
        mask = mark if mask is None else mask
        if mask == 0 or mark & mask != mark:
            raise ValueError(f"bad mark/mask {mark:#x}/{mask:#x}")
    return Rule(family=family_of(ip_version), priority=priority, table=table, invert=invert,
                mark=mark or 0, mask=mask if mark is not None else None, src=canon_cidr(src) if src else None)
