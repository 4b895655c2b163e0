"""The ipset driver (iptables mode): Calico IP sets as kernel ``ipset`` sets.

* :mod:`.driver` — :class:`IPSets`, one per IP family (the IPSetsDataplane).
* :mod:`.resync` — its read-back of the kernel's sets (start of day, refresh).
* :mod:`.naming` — Felix's set names and ownership prefixes.
* :mod:`.members` — member validation and canonical forms.
* :mod:`.parse` — parsers of ``ipset list`` / ``ipset save`` output.
* :mod:`.digest` — the digest that finds an unchanged set in sync at the start of day.
* :mod:`.saveread` — an ``ipset save`` as the full resync takes it, digested ahead when read before InSync.
* :mod:`.meta` — a set's metadata as the driver believes it.
* :mod:`.resync_queue` — the two-tier re-read queue of the incremental refresh.
* :mod:`.fake` — a stateful fake ``ipset`` for tests.
* :mod:`.metrics` — Felix's ipset metrics.

The driver is given a :class:`felixpy.drivers.cmdshim.CommandRunner`.
"""

from felixpy.drivers.ipsets.driver import MAX_IPSET_DELETIONS_PER_ITERATION, MAX_RETRY_ATTEMPTS, IPSets
from felixpy.drivers.ipsets.meta import DataplaneMeta
from felixpy.drivers.ipsets.naming import IPVersionConfig

__all__ = [
    "MAX_IPSET_DELETIONS_PER_ITERATION", "MAX_RETRY_ATTEMPTS",
    "DataplaneMeta", "IPSets", "IPVersionConfig",
]
