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
dataclasses) that equal themselves (the bulk operations compare whole dicts,
which treats an object as equal to itself, as every Python container does).
There is no I/O here.

Bulk operations (:meth:`replace_all_desired`, :meth:`replace_dataplane` and
their ``*_keys`` forms for set-like trackers whose values are all one constant)
leave exactly the state, pending lists and their order included, that the
equivalent sequence of one-key calls would, but do the work in dict and set
operations rather than a Python call per key: an IP set of 100,000 members is
filled, or resynced, in a few milliseconds.
"""

from __future__ import annotations

import operator
import socket as _socket
import struct as _struct
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

_ABSENT: Any = object()  # distinct from any stored value, None included

K = TypeVar("K")
V = TypeVar("V")


class _WorkLists(Generic[K]):
    """The work-list queries both trackers answer the same way from their two pending dicts."""

    __slots__ = ()
    _pending_updates: dict[K, Any]
    _pending_deletions: dict[K, Any]

    def pending_update_keys(self) -> list[K]:
        """Snapshot of the keys still to write, in order (:meth:`pending_updates` without values)."""
        return list(self._pending_updates)

    def pending_deletions(self) -> list[K]:
        """Snapshot of keys still to remove from the kernel."""
        return list(self._pending_deletions)

    def num_pending_updates(self) -> int:
        return len(self._pending_updates)

    def num_pending_deletions(self) -> int:
        return len(self._pending_deletions)

    def in_sync(self) -> bool:
        return not self._pending_updates and not self._pending_deletions


class DeltaTracker(_WorkLists[K], Generic[K, V]):
    __slots__ = ("_desired", "_dataplane", "_pending_updates", "_pending_deletions", "_equal", "_plain_eq")

    def __init__(self, values_equal: Callable[[V, V], bool] | None = None) -> None:
        self._desired: dict[K, V] = {}
        self._dataplane: dict[K, V] = {}
        # Dicts used as insertion-ordered sets: stable, deterministic apply order.  Only
        # the keys mean anything (a bulk operation may copy a whole dict, values and all).
        self._pending_updates: dict[K, object] = {}
        self._pending_deletions: dict[K, object] = {}
        self._equal: Callable[[V, V], bool] = values_equal or operator.eq
        # Plain ==: whole-dict comparisons may stand in for per-key ones.
        self._plain_eq = values_equal is None

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
        """Declare the complete desired state (keys not in *items* go).

        The same as :meth:`delete_desired` of each desired key not in *items*
        (in desired order) then :meth:`set_desired` of each item (in *items*
        order), done in bulk.
        """
        self._replace_all_desired(items, owned=False)

    def replace_all_desired_keys(self, keys: Iterable[K], value: V) -> None:
        """:meth:`replace_all_desired` with *value* for every key (a set-like tracker's members)."""
        self._replace_all_desired(dict.fromkeys(keys, value), owned=True)

    def _replace_all_desired(self, items: Mapping[K, V], owned: bool) -> None:
        desired = self._desired
        dp = self._dataplane
        pu = self._pending_updates
        pd = self._pending_deletions
        # 1. Desired keys that go: no longer to write; to delete if the kernel has them.
        if desired and not desired.keys() <= items.keys():
            removed = [k for k in desired if k not in items]
            for k in removed:
                del desired[k]
                pu.pop(k, None)
            if dp:
                pd.update(dict.fromkeys([k for k in removed if k in dp]))
        # 2. The new values: existing keys keep their place, new ones follow in *items* order.
        if not desired:
            self._desired = items if owned and isinstance(items, dict) else dict(items)
        else:
            desired.update(items)
        # 3. Desired keys are never pending deletion.
        if pd:
            drop = [k for k in pd if k in items] if len(pd) <= len(items) else [k for k in items if k in pd]
            for k in drop:
                del pd[k]
        # 4. Pending updates: every item unless the kernel already holds that value.
        if not dp:
            if pu:
                pu.update(items)
            else:
                self._pending_updates = dict(items)  # a copy of a dict is one memcpy
            return
        get = dp.get
        eq = self._equal
        if pu:
            # Items the kernel already matches are no longer pending.
            for k in [k for k in pu if k in items and (d := get(k, _ABSENT)) is not _ABSENT
                      and eq(d, items[k])]:
                del pu[k]
        if self._plain_eq:
            if items.items() <= dp.items():
                return  # the kernel holds every item already (a re-sent, unchanged state)
            need = [k for k, v in items.items() if (d := get(k, _ABSENT)) is _ABSENT or not d == v]
        else:
            need = [k for k, v in items.items() if (d := get(k, _ABSENT)) is _ABSENT or not eq(d, v)]
        pu.update(dict.fromkeys(need))

    def get_desired(self, key: K) -> V | None:
        return self._desired.get(key)

    def desired_items(self) -> Iterator[tuple[K, V]]:
        return iter(self._desired.items())

    def desired_keys(self) -> list[K]:
        """Every desired key, in order (a snapshot)."""
        return list(self._desired)

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
        if isinstance(items, dict):
            self._dataplane = dict(items)  # the fast whole-table copy
        else:
            self._dataplane = dict(items.items() if isinstance(items, Mapping) else items)
        self._recompute_all()

    def replace_dataplane_keys(self, keys: Iterable[K], value: V) -> None:
        """:meth:`replace_dataplane` with *value* for every key (a set-like tracker's members)."""
        self._dataplane = dict.fromkeys(keys, value)
        self._recompute_all()

    def _recompute_all(self) -> None:
        """Both work lists from scratch: updates in desired order, deletions in dataplane order.

        With plain ``==``, a dataplane value equal to the desired one is replaced by the desired object
        itself: after a restart's read-back the kernel's copies (a large node's 5,000 routes and 10,000
        FDB and neighbour entries, with their strings) are let go instead of held beside equal desired
        values for as long as nothing changes (~2.5 MiB at a large node, #17)."""
        desired = self._desired
        dp = self._dataplane
        if not dp:
            self._pending_updates = dict(desired)
            self._pending_deletions = {}
            return
        if not desired:
            self._pending_updates = {}
            self._pending_deletions = dict(dp)
            return
        if self._plain_eq and len(desired) == len(dp) and desired == dp:
            self._dataplane = dict(zip(dp, map(desired.__getitem__, dp)))  # one object a value, dataplane order
            self._pending_updates = {}  # in sync: the common case after a restart
            self._pending_deletions = {}
            return
        get = dp.get
        if self._plain_eq:
            need = []
            for k, v in desired.items():
                d = get(k, _ABSENT)
                if d is _ABSENT or not d == v:
                    need.append(k)
                elif d is not v:
                    dp[k] = v  # equal: hold the desired object, not the read-back's copy
        else:
            eq = self._equal
            need = [k for k, v in desired.items() if (d := get(k, _ABSENT)) is _ABSENT or not eq(d, v)]
        self._pending_updates = dict.fromkeys(need)
        if dp.keys() <= desired.keys():
            self._pending_deletions = {}
        else:
            self._pending_deletions = dict.fromkeys([k for k in dp if k not in desired])

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

    def _recompute(self, key: K) -> None:
        self._pending_updates.pop(key, None)
        self._pending_deletions.pop(key, None)
        if key in self._desired:
            if key not in self._dataplane or not self._equal(self._dataplane[key], self._desired[key]):
                self._pending_updates[key] = None
        elif key in self._dataplane:
            self._pending_deletions[key] = None


def _pack_ipv4(keys: Iterable[Any]) -> tuple[bytes, array[int]] | None:
    """*keys* as 4-byte IPv4 addresses in their order, and the same as sorted ints (for lookups and
    comparison); None unless every key is a dotted-quad IPv4 string (nets, ip,port, IPv6, not str).
    ``inet_pton`` accepts only the canonical spelling, so :func:`_unpack_ipv4` gives back the very strings."""
    pton, af = _socket.inet_pton, _socket.AF_INET
    try:
        packed = b"".join([pton(af, k) for k in keys])
    except (OSError, ValueError, TypeError):
        return None
    return packed, array("I", sorted(_struct.unpack(f">{len(packed) // 4}I", packed)))


def _unpack_ipv4(packed: bytes) -> list[str]:
    ntoa = _socket.inet_ntoa
    return [ntoa(packed[i:i + 4]) for i in range(0, len(packed), 4)]


class MemberTracker(_WorkLists[K]):
    """:class:`DeltaTracker` for set-like state (every value ``True``: IP-set members) that stores only the
    difference: the desired keys and the two work lists, never a second copy of the keys for the dataplane.

    The dataplane is implied: ``(desired - pending updates) | pending deletions``.  In sync (the steady
    state) that is the desired set itself, so a 200,000-member node holds one dict of members, not two
    (issue #17: the second was ~6 MiB at large node).  Same API as the :class:`DeltaTracker` calls the IP-set
    driver makes, with the same results *and orders* (the restore text is written in pending order): the
    property tests run both side by side.
    """

    __slots__ = ("_desired", "_pending_updates", "_pending_deletions", "_packed", "_sorted", "_all_pending")

    def __init__(self) -> None:
        self._desired: dict[K, object] = {}
        self._pending_updates: dict[K, object] = {}     # desired, not in the dataplane
        self._pending_deletions: dict[K, object] = {}   # in the dataplane, not desired
        # Compact form (see compact()): the desired keys as 4-byte IPv4 addresses in desired order, and the
        # same addresses as sorted ints for lookups.  While set, the three dicts are empty and the dataplane
        # is either the desired set (in sync) or, with _all_pending, empty (every key a pending update, in
        # desired order: a set not yet written).
        self._packed: bytes | None = None
        self._sorted: array[int] | None = None
        self._all_pending = False

    # -- compact form -------------------------------------------------------
    def compact(self, min_keys: int = 16) -> bool:
        """Every key a dotted-quad IPv4 string, and the set in sync or not yet in the dataplane at all (every
        key pending, in desired order: a set just received): hold the keys packed (4 + 4 bytes a key instead
        of a str and a dict slot, ~90 bytes, or twice that while pending; issue #17).  Invisible to every
        query, orders included; the next change unpacks them.  ``inet_pton`` accepts only the canonical
        spelling, so unpacking gives back the very strings.  Returns whether the keys are (now) packed."""
        if self._packed is not None:
            return True
        desired, pu = self._desired, self._pending_updates
        if len(desired) < min_keys or self._pending_deletions:
            return False
        all_pending = bool(pu)
        if all_pending and (len(pu) != len(desired) or not all(map(operator.eq, pu, desired))):
            return False   # partly written, or pending in another order than desired
        got = _pack_ipv4(desired)
        if got is None:
            return False
        self._packed, self._sorted = got
        self._desired, self._all_pending = {}, all_pending
        self._pending_updates = {}
        return True

    def packed_snapshot(self) -> bytes | None:
        """The packed keys, if held packed: a token for :meth:`mark_written`."""
        return self._packed

    def mark_written(self, snapshot: bytes) -> None:
        """The dataplane now holds exactly the keys *snapshot* (from :meth:`packed_snapshot`) packed: a
        whole set written from its packed keys.  If nothing changed since, that is the desired set and it
        stays packed, now in sync, without a str per key; otherwise as :meth:`replace_dataplane_keys`."""
        if self._packed is snapshot:
            self._all_pending = False
            return
        self.replace_dataplane_keys(_unpack_ipv4(snapshot))  # type: ignore[arg-type]

    def _unpacked_keys(self) -> list[K]:
        assert self._packed is not None
        return _unpack_ipv4(self._packed)  # type: ignore[return-value]

    def _inflate(self) -> None:
        if self._packed is not None:
            self._desired = dict.fromkeys(self._unpacked_keys())
            if self._all_pending:
                self._pending_updates = dict.fromkeys(self._desired)
            self._packed = self._sorted = None
            self._all_pending = False

    def _packed_has(self, key: object) -> bool:
        ints = self._sorted
        assert ints is not None
        try:
            (value,) = _struct.unpack(">I", _socket.inet_pton(_socket.AF_INET, key))  # type: ignore[arg-type]
        except (OSError, ValueError, TypeError):
            return False
        i = bisect_left(ints, value)
        return i < len(ints) and ints[i] == value

    def _packed_equals(self, keys: Mapping[K, object]) -> bool:
        """Whether *keys* are exactly the packed desired keys (a read-back of a set in sync: compared as
        sorted addresses, without unpacking the set into a str and a dict slot per member)."""
        ints = self._sorted
        assert ints is not None
        if len(keys) != len(ints):
            return False
        got = _pack_ipv4(keys)
        return got is not None and got[1] == ints

    def _is_desired(self, key: K) -> bool:
        if self._packed is not None:
            return self._packed_has(key)
        return key in self._desired

    def _in_dataplane(self, key: K) -> bool:
        if self._packed is not None:
            # In sync the dataplane is the desired set; all pending, it is empty.
            return not self._all_pending and self._packed_has(key)
        if key in self._desired:
            return key not in self._pending_updates
        return key in self._pending_deletions

    # -- desired side -----------------------------------------------------
    def set_desired(self, key: K, value: object = True) -> None:
        self._inflate()
        if key in self._desired:
            return
        self._desired[key] = None
        if self._pending_deletions.pop(key, _ABSENT) is _ABSENT:
            self._pending_updates[key] = None      # not in the dataplane (it was not desired)

    def delete_desired(self, key: K) -> None:
        self._inflate()
        if self._desired.pop(key, _ABSENT) is _ABSENT:
            return
        if self._pending_updates.pop(key, _ABSENT) is _ABSENT:
            self._pending_deletions[key] = None    # it was in the dataplane

    def replace_all_desired(self, items: Mapping[K, object]) -> None:
        self.replace_all_desired_keys(items.keys())

    def replace_all_desired_keys(self, keys: Iterable[K], value: object = True) -> None:
        self._inflate()
        items: dict[K, object] = dict.fromkeys(keys)
        desired, pu, pd = self._desired, self._pending_updates, self._pending_deletions
        # 1. Desired keys that go: those the dataplane holds become deletions (in desired order).
        if desired and not desired.keys() <= items.keys():
            for k in [k for k in desired if k not in items]:
                del desired[k]
                if pu.pop(k, _ABSENT) is _ABSENT:
                    pd[k] = None
        # 2. Which items the dataplane lacks, judged before the lists change below (items order).
        need = [k for k in items if not ((k in desired and k not in pu) or k in pd)]
        # 3. The new desired state: existing keys keep their place, new ones follow in *items* order.
        if not desired:
            self._desired = items
        else:
            desired.update(items)
        # 4. Desired keys are never pending deletion; the lacking ones are pending updates.
        if pd:
            drop = [k for k in pd if k in items] if len(pd) <= len(items) else [k for k in items if k in pd]
            for k in drop:
                del pd[k]
        if pu:
            pu.update(dict.fromkeys(need))
        else:
            self._pending_updates = dict.fromkeys(need)

    def get_desired(self, key: K) -> bool | None:
        return True if self._is_desired(key) else None

    def desired_items(self) -> Iterator[tuple[K, bool]]:
        keys = self._unpacked_keys() if self._packed is not None else self._desired
        return ((k, True) for k in keys)

    def desired_keys(self) -> list[K]:
        return self._unpacked_keys() if self._packed is not None else list(self._desired)

    def desired_len(self) -> int:
        return len(self._packed) // 4 if self._packed is not None else len(self._desired)

    # -- dataplane side ---------------------------------------------------
    def dataplane_items(self) -> Iterator[tuple[K, bool]]:
        """What the dataplane holds as far as the tracker believes (the implied set, never stored)."""
        pu = self._pending_updates
        if self._all_pending:
            return
        for k in (self._unpacked_keys() if self._packed is not None else self._desired):
            if k not in pu:
                yield k, True
        for k in self._pending_deletions:
            yield k, True

    # (A key that stays pending moves to the end of its list, as DeltaTracker's recompute does.)
    def set_dataplane(self, key: K, value: object = True) -> None:
        self._inflate()
        if key in self._desired:
            self._pending_updates.pop(key, None)
        else:
            self._pending_deletions.pop(key, None)
            self._pending_deletions[key] = None

    def delete_dataplane(self, key: K) -> None:
        self._inflate()
        if key in self._desired:
            self._pending_updates.pop(key, None)
            self._pending_updates[key] = None
        else:
            self._pending_deletions.pop(key, None)

    def replace_dataplane(self, items: Mapping[K, object]) -> None:
        self.replace_dataplane_keys(items.keys())

    def replace_dataplane_keys(self, keys: Iterable[K], value: object = True) -> None:
        dp: dict[K, object] = dict.fromkeys(keys)   # transient: dropped once the work lists are known
        if self._packed is not None:
            if not dp and self._all_pending:
                return   # packed, none of it in the dataplane: so it stays
            if self._packed_equals(dp):
                self._all_pending = False   # the dataplane holds exactly the desired keys: in sync, still packed
                return
        self._inflate()
        desired = self._desired
        if not dp:
            self._pending_updates = dict(desired)
            self._pending_deletions = {}
            return
        if len(desired) == len(dp) and desired.keys() == dp.keys():
            self._pending_updates = {}
            self._pending_deletions = {}
            return
        self._pending_updates = dict.fromkeys([k for k in desired if k not in dp])
        self._pending_deletions = {} if dp.keys() <= desired.keys() else \
            dict.fromkeys([k for k in dp if k not in desired])

    def mark_dataplane_desired(self) -> None:
        """The dataplane holds exactly the desired keys (a read-back found them equal without handing them
        over: the IP-set save worker's digest): the state :meth:`replace_dataplane_keys` of the desired keys
        would leave, in O(1), and a packed set stays packed."""
        if self._packed is not None:
            self._all_pending = False
            return
        self._pending_updates = {}
        self._pending_deletions = {}

    def get_dataplane(self, key: K) -> bool | None:
        return True if self._in_dataplane(key) else None

    def dataplane_len(self) -> int:
        if self._all_pending:
            return 0
        return self.desired_len() - len(self._pending_updates) + len(self._pending_deletions)

    # -- work lists ---------------------------------------------------------
    def pending_updates(self) -> list[tuple[K, bool]]:
        return [(k, True) for k in self.pending_update_keys()]

    def pending_update_keys(self) -> list[K]:
        return self._unpacked_keys() if self._all_pending else list(self._pending_updates)

    def num_pending_updates(self) -> int:
        return self.desired_len() if self._all_pending else len(self._pending_updates)

    def in_sync(self) -> bool:
        return not self._all_pending and not self._pending_updates and not self._pending_deletions

