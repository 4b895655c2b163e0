"""An ``ipset save`` as the full resync takes it, and its digests taken ahead (pure but for the file it reads).

The full resync (:mod:`.resync`) reads one ``ipset save``.  At a start of day the driver may start that
save before ``InSync`` (``IPSets.prefetch_before_insync``), and then, on the same thread, also cut every
owned set's members out of it and digest them (:func:`digest_save`, :mod:`.digest`) while the feed is
still arriving.  The apply after ``InSync`` then compares each wanted set's digest with the one its
desired members were given when they arrived, and reads members out of the save again only for the sets
whose digests differ (changed since, or drifted before the save): at a large node (1,000 sets, 200,000
members) the apply's IP-set read-back went from cutting out and hashing every member (~60 ms of the
loop's CPU, beside the FDB and the routes on the GIL) to a comparison per set.

Nothing here touches the driver's state: :func:`digest_save` runs on the read-ahead thread while the
loop updates the sets, so it decides what to digest by name alone (every owned set that is not a
temporary one) and returns what it found.  The save's file is held until the resync is done with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from felixpy.drivers.cmdshim import Output
from felixpy.drivers.ipsets.digest import local_digest
from felixpy.drivers.ipsets.meta import DataplaneMeta
from felixpy.drivers.ipsets.naming import IPVersionConfig
from felixpy.drivers.ipsets.parse import ListedSet, parse_save

Digest = tuple[int, int, int]


@dataclass
class SaveDigests:
    """What :func:`digest_save` found: every owned set in the save's order with its metadata, and the
    digest of its members (None: some came outside its own run of add lines; absent: a temporary set;
    either way the resync reads that set's members again from the save)."""

    sets: list[tuple[str, DataplaneMeta]] = field(default_factory=list)
    digests: dict[str, Digest | None] = field(default_factory=dict)


@dataclass
class SaveRead:
    """One ``ipset save``: its :class:`Output` (the text still in its file) and, if it was read ahead,
    its :class:`SaveDigests`.  ``with`` (or :meth:`close`) lets the file go."""

    output: Output
    digested: SaveDigests | None = None

    def __enter__(self) -> SaveRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.output.close()


def digest_save(output: Output, names: IPVersionConfig) -> SaveDigests | None:
    """Every owned set of a successful save, with the digest of its members, one set's member strings
    held at a time; None if the save failed (the resync then falls back as without it).  A save that
    will not parse raises ValueError (the read ahead is then logged as failed and the apply reads again)."""
    if not output.result.ok:
        return None
    found = SaveDigests()

    def wanted(name: str) -> bool:
        return names.owns(name) and not names.is_temp(name)

    def sink(s: ListedSet, members: list[str], whole: bool) -> None:
        if whole and s.name not in found.digests:
            found.digests[s.name] = local_digest(members)
        else:  # more members out of order: leave this set to the key-by-key comparison
            found.digests[s.name] = None

    for s in parse_save(output.pieces(b"create "), wanted, sink):
        if names.owns(s.name):
            found.sets.append((s.name, DataplaneMeta(s.type, s.family, s.max_size)))
    return found
