"""Route rule driver: Calico's ``ip rule`` entries for one IP family.

What it owns
    Only rules that jump to one of the route tables Calico owns (the table
    indices it is constructed with — e.g. the WireGuard table).  Main, local
    and default (254/255/253) are refused at construction: rules pointing there
    are never ours.

How it recognises them after a restart
    By table index alone (the weakest identification the kernel allows: rules
    carry no comment or owner).  Every apply that is not in sync lists all
    rules of the family, keeps those matching a desired rule and deletes every
    other rule pointing at an owned table — including rules an earlier
    instance left with a different priority, mark or source.

Apply contract
    ``set_rule``/``remove_rule`` only record (a rule is identified for update
    by priority, family, invert, mark/mask, source and table; for removal
    without the table, as Felix's ``RulesMatchSrcFWMark[Table]``).
    ``apply()`` is a full read-back-and-reconcile whenever anything changed or
    a resync was queued (rules are few); a failure leaves it out of sync and
    raises :class:`~felixpy.errors.DataplaneError` after trying every rule.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from felixpy.drivers.drift import DriftTally
from felixpy.drivers.netlink.api import NetlinkFactory
from felixpy.drivers.netlink.handle import CachedHandle
from felixpy.drivers.netlink.errors import NetlinkCallError
from felixpy.drivers.netlink.types import Rule, family_of
from felixpy.drivers.routerule.api import RulesMatch, match_src_fwmark, match_src_fwmark_table
from felixpy.errors import DataplaneError

log = structlog.get_logger(__name__)

RT_TABLE_DEFAULT, RT_TABLE_MAIN, RT_TABLE_LOCAL = 253, 254, 255

class RouteRules:
    def __init__(self, *, ip_version: int, table_indices: Iterable[int], new_handle: NetlinkFactory,
                 match_for_update: RulesMatch = match_src_fwmark_table,
                 match_for_remove: RulesMatch = match_src_fwmark) -> None:
        tables = frozenset(table_indices)
        if not tables or any(t <= 0 or t >= 0xFFFFFFFF or t in (RT_TABLE_DEFAULT, RT_TABLE_MAIN, RT_TABLE_LOCAL)
                             for t in tables):
            raise ValueError(f"route rules need owned, non-reserved table indices, got {sorted(tables)}")
        self.ip_version = ip_version
        self.family = family_of(ip_version)
        self.tables = tables
        self._nl = CachedHandle(new_handle)
        self._match_update = match_for_update
        self._match_remove = match_for_remove
        self._active: list[Rule] = []
        self._in_sync = False
        self.log = log.bind(ip_version=ip_version)
        self._programmed: list[Rule] | None = None  # what the last successful apply left (None: never applied)
        self._drift = DriftTally(self.log)

    def _find(self, rule: Rule, match: RulesMatch) -> Rule | None:
        return next((r for r in self._active if match(r, rule)), None)

    def set_rule(self, rule: Rule) -> None:
        if rule.family != self.family:
            raise ValueError(f"IPv{self.ip_version} rules given family {rule.family}")
        if rule.table not in self.tables:
            raise ValueError(f"rule points at table {rule.table}, not one of ours {sorted(self.tables)}")
        if self._find(rule, self._match_update) is None:
            self._active.append(rule)
            self._in_sync = False

    def remove_rule(self, rule: Rule) -> None:
        existing = self._find(rule, self._match_remove)
        if existing is not None:
            self._active.remove(existing)
            self._in_sync = False

    def desired_rules(self) -> list[Rule]:
        return list(self._active)

    def queue_resync(self) -> None:
        self._in_sync = False

    def apply(self) -> None:
        if self._in_sync:
            return
        try:
            nl = self._nl.get()
            kernel = nl.rule_list(self.family)
        except DataplaneError:
            self._drop_handle()
            raise
        to_add = list(self._active)
        to_remove: list[Rule] = []
        for rule in kernel:
            if rule.table not in self.tables:
                continue  # not pointing at a table we own: never ours
            active = next((r for r in to_add if self._match_update(r, rule)), None)
            if active is not None:
                to_add.remove(active)
            elif self._find(rule, self._match_update) is None:
                to_remove.append(rule)
        self._drift.forget()
        if self._programmed is not None:
            # Believed there and still wanted, yet missing; or one of ours appeared that we never wrote.
            self._drift.found("ip_rule", sum(1 for r in to_add
                                             if any(self._match_update(p, r) for p in self._programmed)))
            self._drift.found("ip_rule", sum(1 for r in to_remove
                                             if not any(self._match_update(p, r) for p in self._programmed)))
        failures = []
        for rule in to_remove:
            try:
                nl.rule_del(rule)
            except NetlinkCallError as exc:
                if not exc.not_found:
                    failures.append(f"del {rule.describe()}: {exc}")
        for rule in to_add:
            try:
                nl.rule_add(rule)
            except NetlinkCallError as exc:
                failures.append(f"add {rule.describe()}: {exc}")
        if failures:
            self._drop_handle()
            self.log.warning("route rule updates failed", failures=failures)
            raise DataplaneError(f"route rule updates failed: {failures}")
        if to_add or to_remove:
            self.log.info("route rules reconciled", added=len(to_add), removed=len(to_remove))
        self._drift.repaired()
        self._programmed = list(self._active)
        self._in_sync = True

    def _drop_handle(self) -> None:
        self._nl.drop()
