"""Endpoint status combined across IP families, as Felix's EndpointStatusCombiner.

Each family's endpoint manager reports its own view of an endpoint's status;
the combined status is the worst of them (error > down > up), and an endpoint
no family knows any more is reported removed (status "").  Only changes are
reported.  This is a cross-cutting component: wiring registers *every*
family's endpoint manager with it (a missing family would silently report
IPv4 only).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from felixpy.managers.base import EndpointStatus

_RANK = {"up": 0, "down": 1, "error": 2}


class EndpointStatusCombiner:
    def __init__(self) -> None:
        # (kind, key) -> {ip_version: status}
        self._per_family: dict[tuple[str, Hashable], dict[int, str]] = {}
        self._ids: dict[tuple[str, Hashable], Any] = {}
        self._reported: dict[tuple[str, Hashable], str] = {}
        self._dirty: set[tuple[str, Hashable]] = set()
        self.families: set[int] = set()

    def register_family(self, ip_version: int) -> None:
        self.families.add(ip_version)

    def on_endpoint_status(self, ip_version: int, kind: str, key: Hashable, endpoint_id: Any, status: str) -> None:
        """One family's view; status "" = that family no longer has the endpoint."""
        k = (kind, key)
        fam = self._per_family.setdefault(k, {})
        if status:
            fam[ip_version] = status
        else:
            fam.pop(ip_version, None)
        # Held until the next report only: a removal names its id too, and a message per endpoint kept
        # between reports was ~1 KiB an endpoint (#17).
        self._ids[k] = endpoint_id
        self._dirty.add(k)

    # Manager protocol (it receives no datastore messages itself).
    update_types: tuple[type, ...] = ()  # it takes no messages (managers/base.py)

    def on_update(self, msg: Any) -> None:
        pass

    def complete_deferred_work(self) -> None:
        pass

    def pop_status_updates(self) -> list[EndpointStatus]:
        out = []
        for k in sorted(self._dirty, key=repr):
            fam = self._per_family.get(k, {})
            combined = max(fam.values(), key=lambda s: _RANK.get(s, 2)) if fam else ""
            endpoint_id = self._ids.pop(k)
            if self._reported.get(k, "") != combined:
                out.append(EndpointStatus(k[0], endpoint_id, combined))
                if combined:
                    self._reported[k] = combined
                else:
                    self._reported.pop(k, None)
            if not fam:
                self._per_family.pop(k, None)
        self._dirty.clear()
        return out
