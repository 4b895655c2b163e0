"""Builds ``iptables-restore`` input: per-table transactions, dropped when empty.

As Felix's ``RestoreInputBuilder``: ``*<table>`` is written lazily before the
first line of a transaction and ``COMMIT`` only if something was written, so a
transaction with no changes leaves the buffer empty and the table runs no
command at all.

A whole chain's lines may be recorded as a recipe (:meth:`RestoreBuffer.write_lazy`):
they are formatted only when the input is read (:class:`RestoreInput`), a chain at
a time, so a start of day never holds every formatted line at once (at the
largest nodes they are tens of MB next to the rendered bodies they are made from).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

# A line, or (how many lines, the function that formats them) for lines formatted on demand.
_Segment = str | tuple[int, Callable[[], list[str]]]


class RestoreInput:
    """The input of one restore: iterable as many times as needed (the command, then a failure's log),
    formatting recorded chains as it goes; ``len()`` is the number of lines."""

    __slots__ = ("_segments", "_count")

    def __init__(self, segments: list[_Segment], count: int) -> None:
        self._segments = segments
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        for seg in self._segments:
            if isinstance(seg, str):
                yield seg
            else:
                yield from seg[1]()

    def text(self) -> str:
        return "".join(line + "\n" for line in self)


class RestoreBuffer:
    __slots__ = ("_lines", "_table", "_opened", "_started_at", "lines_written")

    def __init__(self) -> None:
        self._lines: list[_Segment] = []
        self._table = ""
        self._opened = False
        self._started_at = 0  # lines_written when the current transaction started
        self.lines_written = 0

    def empty(self) -> bool:
        return not self._lines

    def reset(self) -> None:
        self._lines.clear()
        self._table = ""
        self._opened = False
        self.lines_written = 0

    def start_transaction(self, table: str) -> None:
        if self._table:
            raise RuntimeError("start_transaction() without ending the previous transaction")
        self._table = table
        self._opened = False
        self._started_at = self.lines_written

    def split_if_over(self, limit: int) -> None:
        """End the current transaction and start another of the same table once it holds *limit* lines or
        more (0: never).  Only for a write no traffic can see half done: each ``COMMIT`` takes effect on
        its own (iptables/table.py, the unhooked write)."""
        if limit and self.lines_written - self._started_at >= limit:
            table = self._table
            self.end_transaction()
            self.start_transaction(table)

    def end_transaction(self) -> None:
        if not self._table:
            raise RuntimeError("end_transaction() without an active transaction")
        if self._opened:
            self._write("COMMIT")
        self._table = ""

    def _write(self, line: str) -> None:
        self._lines.append(line)
        self.lines_written += 1

    def _open(self) -> None:
        if not self._table:
            raise RuntimeError("write outside a transaction")
        if not self._opened:
            self._write(f"*{self._table}")
            self._opened = True

    def write_forward_reference(self, chain: str) -> None:
        """``:<chain> - -``: create the chain if missing, flush it if present."""
        self._open()
        self._write(f":{chain} - -")

    def write_line(self, line: str) -> None:
        self._open()
        self._write(line)

    def write_lines(self, lines: list[str]) -> None:
        """:meth:`write_line` for each of *lines*, in order (one call for a whole chain)."""
        if lines:
            self._open()
            self._lines.extend(lines)
            self.lines_written += len(lines)

    def write_lazy(self, count: int, make: Callable[[], list[str]]) -> None:
        """*count* lines that ``make()`` formats when the input is read (and again each time it is read: it
        must return the same lines every time)."""
        if count:
            self._open()
            self._lines.append((count, make))
            self.lines_written += count

    def take_input(self) -> RestoreInput:
        """The input (:class:`RestoreInput`), the buffer emptied."""
        if self._table:
            raise RuntimeError("take_input() inside a transaction")
        out = RestoreInput(self._lines, self.lines_written)
        self._lines = []
        self._opened = False
        self.lines_written = 0
        return out

    def text(self) -> str:
        if self._table:
            raise RuntimeError("text() inside a transaction")
        return RestoreInput(self._lines, self.lines_written).text()
