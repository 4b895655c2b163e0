"""Pure parsers for the text ``ipset`` prints (tested with captured output).

* ``ipset list -name`` — one set name per line.
* ``ipset list [NAME]`` — blocks of ``Name:``/``Type:``/``Revision:``/
  ``Header:``/…/``Members:`` followed by one member per line, blocks separated
  by a blank line::

      Name: cali40s:abc
      Type: hash:net
      Revision: 7
      Header: family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x98a5359e
      Size in memory: 600
      References: 0
      Number of entries: 2
      Members:
      10.0.1.0/24
      10.0.0.1

* ``ipset save [NAME]`` — ``create NAME TYPE OPTIONS…`` then ``add NAME MEMBER``
  lines.
* ``ipset restore`` errors — ``ipset v7.17: Error in line N: message``.

Members are returned exactly as printed: the kernel's text *is* our canonical
form (see :mod:`.members`).  Callers choose, per set name, whether members are
wanted at all (``want_members``), so foreign and temporary sets cost almost
nothing to skip.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

NOT_FOUND_MSG = "The set with the given name does not exist"
_RESTORE_ERR_LINE = re.compile(r"Error in line (\d+):")


@dataclass(slots=True)
class ListedSet:
    """One set as ``ipset list``/``ipset save`` describes it."""

    name: str
    type: str = ""
    family: str = ""
    max_size: int = 0
    revision: int | None = None
    references: int | None = None
    members: list[str] | None = field(default=None)  # None: not parsed (not wanted)


def parse_list_names(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def _parse_header_options(tokens: list[str], s: ListedSet) -> None:
    """Fill family/maxelem from ``family inet hashsize 1024 maxelem 65536 …`` tokens."""
    for i in range(len(tokens) - 1):
        key = tokens[i]
        if key == "family":
            s.family = tokens[i + 1]
        elif key == "maxelem":
            try:
                s.max_size = int(tokens[i + 1])
            except ValueError:
                raise ValueError(f"bad maxelem {tokens[i + 1]!r} for set {s.name}") from None


def parse_list(text: str, want_members: Callable[[str], bool] = lambda _n: True) -> list[ListedSet]:
    """Parse ``ipset list`` output (one or many sets)."""
    out: list[ListedSet] = []
    lines = text.split("\n")
    n = len(lines)
    i = 0
    cur: ListedSet | None = None
    while i < n:
        line = lines[i]
        i += 1
        if line.startswith("Name: "):
            cur = ListedSet(line[6:].strip())
            out.append(cur)
        elif cur is None:
            continue
        elif line.startswith("Type: "):
            cur.type = line[6:].strip()
        elif line.startswith("Revision: "):
            cur.revision = int(line[10:])
        elif line.startswith("Header: "):
            _parse_header_options(line[8:].split(), cur)
        elif line.startswith("References: "):
            cur.references = int(line[12:])
        elif line.startswith("Members:"):
            # Members run to the next blank line (or the end of the output).
            end = i
            while end < n and lines[end]:
                end += 1
            if want_members(cur.name):
                cur.members = lines[i:end]
            i = end
            cur = None
    return out


MemberSink = Callable[[ListedSet, list[str], bool], None]


def parse_save(text: str | Iterable[str], want_members: Callable[[str], bool] = lambda _n: True,
               sink: MemberSink | None = None) -> list[ListedSet]:
    """Parse ``ipset save`` output: create lines, then that set's add lines.

    *text* is the whole output, or the output in pieces of whole lines, each piece after the first
    beginning with a create line (:meth:`~felixpy.drivers.cmdshim.Output.pieces` cuts so): a set's
    block is never split, and the whole output need never be held at once (#17).

    The text is cut at its ``create`` lines; a set's members are the run of
    ``add NAME `` lines that follows its create line.  When that run is the
    whole of the set's block (as ``ipset save`` writes it) the members are cut
    out with one ``split`` instead of line by line.

    With *sink*, members are not kept on the sets: ``sink(set, members, True)`` is
    called with each wanted set's run as soon as its block is read, and an add
    line out of order for a set already given comes as ``sink(set, [member],
    False)`` (members to add to what it was given).  A restart of a node with
    200,000 members then holds one set's member strings at a time, not all (#17).
    """
    out: list[ListedSet] = []
    by_name: dict[str, ListedSet] = {}
    given: set[int] = set()  # id() of the sets handed to the sink

    def take(s: ListedSet, members: list[str]) -> None:
        if sink is None:
            s.members = members
        else:
            given.add(id(s))
            sink(s, members, True)

    def loose_lines(lines: list[str]) -> None:
        """Lines outside a set's run: an add line out of order is attached to its set."""
        for line in lines:
            if line.startswith("add "):
                _, name, member = line.split(" ", 2)
                s2 = by_name.get(name)
                if s2 is not None and want_members(name):
                    if id(s2) in given:
                        assert sink is not None
                        sink(s2, [member], False)
                        continue
                    if s2.members is None:
                        s2.members = []
                    s2.members.append(member)

    def piece(text: str) -> None:
        # Offsets of the create lines (each starts the text or follows a newline).
        starts = [0] if text.startswith("create ") else []
        pos = text.find("\ncreate ")
        while pos >= 0:
            starts.append(pos + 1)
            pos = text.find("\ncreate ", pos + 1)
        if not starts:
            loose_lines(text.split("\n"))
            return
        if starts[0] > 0:
            loose_lines(text[:starts[0] - 1].split("\n"))
        last = len(starts) - 1
        for idx, begin in enumerate(starts):
            stop = starts[idx + 1] - 1 if idx < last else len(text)  # excludes the newline before the next create
            nl = text.find("\n", begin, stop)
            line = text[begin:stop] if nl < 0 else text[begin:nl]
            body = "" if nl < 0 else text[nl + 1:stop]
            if idx == last and body.endswith("\n"):
                body = body[:-1]  # the piece's final newline: an empty last line, ignored either way
            tokens = line.split()
            if len(tokens) < 3:
                raise ValueError(f"bad create line {line!r}")
            s = ListedSet(tokens[1], type=tokens[2])
            _parse_header_options(tokens[3:], s)
            out.append(s)
            by_name[s.name] = s
            if not body:
                continue
            prefix = f"add {s.name} "
            plen = len(prefix)
            wanted = want_members(s.name)
            if body.startswith(prefix):
                # Usually every line of the block is one of this set's add lines.
                sep = "\n" + prefix
                if wanted:
                    members = body[plen:].split(sep)
                    if body.count("\n") == len(members) - 1:  # every newline began an add line
                        take(s, members)
                        del members
                        continue
                elif body.count(sep) == body.count("\n"):
                    continue
            lines = body.split("\n")
            n = len(lines)
            run = 0
            while run < n and lines[run].startswith(prefix):
                run += 1
            if wanted:
                take(s, [m[plen:] for m in lines[:run]])
            loose_lines(lines[run:])

    for p in ([text] if isinstance(text, str) else text):
        piece(p)
    for s in out:
        if id(s) in given or not want_members(s.name):
            continue
        if sink is not None:  # a set with no run of its own (members only out of order, or none)
            members, s.members = s.members or [], None
            sink(s, members, True)
        elif s.members is None:
            s.members = []
    return out


def restore_error_line(stderr: str) -> int | None:
    """The 1-based input line an ``ipset restore`` failure names, if any."""
    m = _RESTORE_ERR_LINE.search(stderr)
    return int(m.group(1)) if m else None


def is_not_found(stderr: str) -> bool:
    return NOT_FOUND_MSG in stderr


def is_in_use(stderr: str) -> bool:
    return "in use" in stderr
