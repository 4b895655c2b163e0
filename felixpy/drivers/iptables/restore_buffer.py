"""Builds ``iptables-restore`` input: per-table transactions, dropped when empty.

As Felix's ``RestoreInputBuilder``: ``*<table>`` is written lazily before the
first line of a transaction and ``COMMIT`` only if something was written, so a
transaction with no changes leaves the buffer empty and the table runs no
command at all.
"""

from __future__ import annotations


class RestoreBuffer:
    __slots__ = ("_lines", "_table", "_opened", "lines_written")

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._table = ""
        self._opened = False
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

    def take_lines(self) -> list[str]:
        """The input as lines (each to be followed by a newline: :meth:`text` joined), the buffer emptied."""
        if self._table:
            raise RuntimeError("take_lines() inside a transaction")
        lines, self._lines = self._lines, []
        self._opened = False
        self.lines_written = 0
        return lines

    def text(self) -> str:
        if self._table:
            raise RuntimeError("text() inside a transaction")
        lines = self._lines
        if not lines:
            return ""
        # The final newline comes from joining one empty line more: ``join(...) + "\n"`` would copy the
        # whole text a second time (at a start of day of the largest nodes, tens of MB at the peak).
        lines.append("")
        try:
            return "\n".join(lines)
        finally:
            lines.pop()
