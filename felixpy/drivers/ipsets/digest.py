"""A digest of an IP set's members that does not depend on their order (pure; no I/O).

The start-of-day resync (``ipset save``) compares each wanted set's members with the kernel's.  Compared
key by key that is a dict of the read-back members and a set comparison per set — or, for a set held
packed, every member packed again with ``inet_pton`` and sorted — all Python work under the GIL, which
the restart's apply shares with the devices, the VXLAN FDB and the routes.  Instead the driver takes a
digest of a set's members when the whole set arrives (``add_or_replace_ip_set``: before ``InSync``, off
the start of day's critical path) and, at the read-back, digests the members it cut out of the save:
equal count and digest, and the set is marked in sync in O(1)
(:meth:`~felixpy.deltatracker.MemberTracker.mark_dataplane_desired`); anything else takes the key-by-key
comparison, exactly as before.  The digests serve that first full resync only and are dropped after it.

The digest is the count and two order-independent combinations of the members' ``str`` hashes: their
sum, and the hash of their ``frozenset`` (CPython mixes each element's hash non-linearly, by a shift, xor
and multiply, before xor-ing them together: a second, non-linear function of the same hashes).
``str`` hashing is SipHash keyed with a per-process random key, so the digest means something only within
this process — which is all it is used for.  Both are C loops over the strings, with no bytecode per
member; the kernel's strings are hashed once (the frozenset reuses the cached hashes): ~20 ms for
200,000 members, where a second salted hash (``hash("\\0" + m)``) cost ~35 ms and a key-by-key
comparison ~80 ms.  Two different member sets of equal size collide only if both 64-bit combinations of
pseudorandom values agree: negligible by accident (at worst ~2⁻⁶⁴ for either alone), and nobody outside
the process knows the key to aim for it.  Even then the set is not left wrong: the periodic refresh
(``IpsetsRefreshInterval``) compares members key by key (it checks for drift), and repairs it.
"""

from __future__ import annotations

from collections.abc import Collection


def local_digest(members: Collection[str]) -> tuple[int, int, int]:
    """Count, hash sum and set hash of *members* (distinct strings, any order); this process only."""
    return len(members), sum(map(hash, members)), hash(frozenset(members))
