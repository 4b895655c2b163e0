"""The IP-set dataplane contract, shared by the ipset driver and nftables sets.

Managers hand a driver the desired sets by *Calico set ID* (``s:abc…``,
``this-host``...); the driver owns naming (``cali40s:abc…`` for ipset,
``cali40s-abc…`` in nftables), the kernel write ordering and resync.  The
update methods only record; the loop calls :meth:`IPSetsDataplane.apply_updates`
before the tables are applied and :meth:`IPSetsDataplane.apply_deletions` after
them, so a rule never references a set that does not exist yet and a set is
never destroyed while a rule still uses it.

:class:`IPSetFilter` is the one extra a dataplane may offer (Felix's ``IPSets.SetFilter``): BPF
mode keeps its sets in maps and writes to the kernel only the Linux IP sets that untracked egress
policy matches (:mod:`felixpy.drivers.ipsets_filter`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class IPSetType(enum.Enum):
    """Kernel set types, valued by their ipset names (proto IP / NET / IP_AND_PORT)."""

    HASH_IP = "hash:ip"
    HASH_NET = "hash:net"
    HASH_IP_PORT = "hash:ip,port"


@dataclass(frozen=True, slots=True)
class IPSetMetadata:
    set_id: str
    type: IPSetType
    max_size: int = 1048576


@runtime_checkable
class IPSetsDataplane(Protocol):
    ip_version: int

    def add_or_replace_ip_set(self, meta: IPSetMetadata, members: Iterable[str]) -> None: ...

    def add_members(self, set_id: str, members: Iterable[str]) -> None: ...

    def remove_members(self, set_id: str, members: Iterable[str]) -> None: ...

    def remove_ip_set(self, set_id: str) -> None: ...

    def get_type_of(self, set_id: str) -> IPSetType | None: ...

    def get_desired_members(self, set_id: str) -> AbstractSet[str] | None:
        """The desired members, immutable (nftables holds them packed, not as a frozenset); None for an unknown set."""
        ...

    def queue_resync(self) -> None:
        """Re-read the kernel on the next apply (periodic refresh or after errors)."""
        ...

    def apply_updates(self) -> None:
        """Create/update sets.  Raises DataplaneError (work kept) or FatalDataplaneError."""
        ...

    def apply_deletions(self) -> bool:
        """Delete (rate-limited) unwanted sets; True while more deletions remain."""
        ...


@runtime_checkable
class IPSetFilter(Protocol):
    def set_filter(self, names: frozenset[str]) -> None:
        """Program only the sets whose rule-layer names (``cali40s:…``, as match criteria carry them:
        :func:`felixpy.rules.ipset_names.main_ipset_name`) are in *names*; every other set is not
        desired in the kernel.  Only records, like the update methods."""
        ...
