"""The two-tier queue of IP sets whose kernel contents must be re-read.

A port of Felix's ``resyncQueue``.  The *must* tier (start of day, and sets
whose write failed) is drained completely before the driver writes again; the
*background* tier (periodic refresh) is drained a time-boxed batch per apply.
A name sits in at most one tier.  Re-adding a queued name keeps its position,
so a refresh that never fully drains still reaches every set in turn (a
rolling scan); re-adding a background name at *must* promotes it to the back of
the must tier.  There is no demotion.
"""

from __future__ import annotations

import enum
from collections import OrderedDict


class ResyncPriority(enum.IntEnum):
    BACKGROUND = 0
    MUST = 1


class ResyncQueue:
    __slots__ = ("_tiers", "_where")

    def __init__(self) -> None:
        self._tiers: dict[ResyncPriority, OrderedDict[str, None]] = {
            ResyncPriority.MUST: OrderedDict(),
            ResyncPriority.BACKGROUND: OrderedDict(),
        }
        self._where: dict[str, ResyncPriority] = {}

    def add(self, name: str, priority: ResyncPriority) -> None:
        current = self._where.get(name)
        if current is not None:
            if priority <= current:
                return  # Keep its place.
            del self._tiers[current][name]
        self._tiers[priority][name] = None
        self._where[name] = priority

    def remove(self, name: str) -> None:
        current = self._where.pop(name, None)
        if current is not None:
            del self._tiers[current][name]

    def pop(self, priority: ResyncPriority) -> str | None:
        tier = self._tiers[priority]
        if not tier:
            return None
        name, _ = tier.popitem(last=False)
        del self._where[name]
        return name

    def pop_all_must(self) -> list[str]:
        tier = self._tiers[ResyncPriority.MUST]
        names = list(tier)
        tier.clear()
        for name in names:
            del self._where[name]
        return names

    def priority_of(self, name: str) -> ResyncPriority | None:
        return self._where.get(name)

    def clear(self) -> None:
        for tier in self._tiers.values():
            tier.clear()
        self._where.clear()

    def __len__(self) -> int:
        return len(self._where)

    def must_len(self) -> int:
        return len(self._tiers[ResyncPriority.MUST])

    def __contains__(self, name: object) -> bool:
        return name in self._where
