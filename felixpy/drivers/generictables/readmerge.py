"""The merge rule for a read-back that ran while the table was being written.

Both backends read the kernel off the apply path (nftables' refresh listings, iptables' refresh and
post-write checks) while applies go on writing.  Such a read may predate a write made meanwhile, so:
an object written meanwhile keeps what the write left (newer than anything the read can have seen);
every other object is taken as read, and what differs there from our belief is drift, repaired by
the next write.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TypeVar

V = TypeVar("V")


def merge_written(read: Mapping[str, V], ours: Mapping[str, V], written: Collection[str]) -> dict[str, V]:
    """*read*, except the names in *written*, which keep *ours* (or stay absent if we deleted them)."""
    out = {n: x for n, x in read.items() if n not in written}
    for n in written:
        if n in ours:
            out[n] = ours[n]
    return out
