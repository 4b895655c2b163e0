"""What the ipset driver believes of a set's metadata (Felix's ``dataplaneMetadata``), and small helpers."""

from __future__ import annotations

from dataclasses import dataclass

from felixpy.drivers.ipsets_api import IPSetType

_KNOWN_TYPES = frozenset(t.value for t in IPSetType)


@dataclass(frozen=True, slots=True)
class DataplaneMeta:
    """A set's metadata, desired or as read from the kernel (Felix's dataplaneMetadata)."""

    type: str
    family: str
    max_size: int
    list_failed: bool = False
    delete_failed: bool = False

    def swappable_with(self, other: DataplaneMeta) -> bool:
        """Whether the kernel will ``swap`` these: only sets of the same type and family.

        A set we could not read (``list_failed``: typically made by a newer
        ipset, a newer *revision* of the same type) is assumed swappable, as
        Felix assumes; if it is not, the swap fails and the retries escalate.
        """
        if self.list_failed:
            return True
        return self.type == other.type and self.family == other.family and self.type in _KNOWN_TYPES


# A set seen in a name listing but not read yet.
UNREAD = DataplaneMeta("", "", 0)


def stdin_excerpt(stdin: str, line_no: int | None, context: int = 2) -> str:
    lines = stdin.splitlines()
    if line_no is None:
        return "\n".join(lines[:5])
    lo = max(0, line_no - 1 - context)
    return "\n".join(f"{i + 1}: {lines[i]}" for i in range(lo, min(len(lines), line_no + context)))
