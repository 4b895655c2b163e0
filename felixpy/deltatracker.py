"""A pure desired-vs-dataplane tracker, written once and shared by drivers.

A port of the idea behind Felix's ``deltatracker``: a driver records what it
*wants* (``desired``) and what it *believes the kernel holds* (``dataplane``);
the tracker maintains, incrementally, the two work lists that reconcile them:

* ``pending_updates`` — keys whose desired value is absent from the dataplane
  or differs from it (to add or replace);
* ``pending_deletions`` — keys present in the dataplane but not desired.

Drivers call :meth:`set_desired` / :meth:`delete_desired` from their cheap
update methods, then in ``apply()`` walk the pending lists, write the kernel,
and report success with :meth:`set_dataplane` / :meth:`delete_dataplane`.  A
resync replaces the whole dataplane view with :meth:`replace_dataplane` (after
reading the kernel back), which recomputes both lists: this is the
mark-and-sweep.  Every operation is O(1) per key except the resync and the
"replace all desired" helper.

Values are compared with ``==``; use immutable values (tuples, frozen
dataclasses).  There is no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

_ABSENT = object()  # distinct from any stored value, None included

K = TypeVar("K")
V = TypeVar("V")


class DeltaTracker(Generic[K, V]):
    __slots__ = ("_desired", "_dataplane", "_pending_updates", "_pending_deletions", "_equal")

    def __init__(self, values_equal: Callable[[V, V], bool] | None = None) -> None:
        self._desired: dict[K, V] = {}
        self._dataplane: dict[K, V] = {}
        # Dicts used as insertion-ordered sets: stable, deterministic apply order.
        self._pending_updates: dict[K, None] = {}
        self._pending_deletions: dict[K, None] = {}
        self._equal = values_equal or (lambda a, b: a == b)

    # -- desired side -----------------------------------------------------
    def set_desired(self, key: K, value: V) -> None:
        self._desired[key] = value
        self._pending_deletions.pop(key, None)
        if key in self._dataplane and self._equal(self._dataplane[key], value):
            self._pending_updates.pop(key, None)
        else:
            self._pending_updates[key] = None

    def delete_desired(self, key: K) -> None:
        if self._desired.pop(key, _ABSENT) is _ABSENT and key not in self._dataplane:
            return
        self._pending_updates.pop(key, None)
        if key in self._dataplane:
            self._pending_deletions[key] = None

    def replace_all_desired(self, items: Mapping[K, V]) -> None:
        """Declare the complete desired state (keys not in *items* go)."""
        for key in [k for k in self._desired if k not in items]:
            self.delete_desired(key)
        for key, value in items.items():
            self.set_desired(key, value)

    def get_desired(self, key: K) -> V | None:
        return self._desired.get(key)

    def desired_items(self) -> Iterator[tuple[K, V]]:
        return iter(self._desired.items())

    def desired_len(self) -> int:
        return len(self._desired)

    # -- dataplane side ---------------------------------------------------
    def set_dataplane(self, key: K, value: V) -> None:
        """Record that the kernel now holds *value* for *key*."""
        self._dataplane[key] = value
        self._recompute(key)

    def delete_dataplane(self, key: K) -> None:
        """Record that the kernel no longer holds *key*."""
        self._dataplane.pop(key, None)
        self._recompute(key)

    def replace_dataplane(self, items: Mapping[K, V] | Iterable[tuple[K, V]]) -> None:
        """Resync: the kernel holds exactly *items* (only objects we own)."""
        self._dataplane = dict(items.items() if isinstance(items, Mapping) else items)
        self._pending_updates.clear()
        self._pending_deletions.clear()
        for key, value in self._desired.items():
            if key not in self._dataplane or not self._equal(self._dataplane[key], value):
                self._pending_updates[key] = None
        for key in self._dataplane:
            if key not in self._desired:
                self._pending_deletions[key] = None

    def get_dataplane(self, key: K) -> V | None:
        return self._dataplane.get(key)

    def dataplane_items(self) -> Iterator[tuple[K, V]]:
        return iter(self._dataplane.items())

    def dataplane_len(self) -> int:
        return len(self._dataplane)

    # -- work lists ---------------------------------------------------------
    def pending_updates(self) -> list[tuple[K, V]]:
        """Snapshot of (key, desired value) still to write."""
        return [(k, self._desired[k]) for k in self._pending_updates]

    def pending_deletions(self) -> list[K]:
        """Snapshot of keys still to remove from the kernel."""
        return list(self._pending_deletions)

    def num_pending_updates(self) -> int:
        return len(self._pending_updates)

    def num_pending_deletions(self) -> int:
        return len(self._pending_deletions)

    def in_sync(self) -> bool:
        return not self._pending_updates and not self._pending_deletions

    def _recompute(self, key: K) -> None:
        self._pending_updates.pop(key, None)
        self._pending_deletions.pop(key, None)
        if key in self._desired:
            if key not in self._dataplane or not self._equal(self._dataplane[key], self._desired[key]):
                self._pending_updates[key] = None
        elif key in self._dataplane:
            self._pending_deletions[key] = None
