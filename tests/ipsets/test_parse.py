"""Parsers of ipset output, against text captured from ipset 7.17 on kernel 6.18."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from felixpy.drivers.ipsets.parse import (ListedSet, is_in_use, is_not_found, parse_list, parse_list_names,
                                          parse_save, restore_error_line)

LIST_ALL = """\
Name: cali40a
Type: hash:net
Revision: 7
Header: family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x98a5359e
Size in memory: 600
References: 0
Number of entries: 3
Members:
10.0.1.0/24
10.0.0.1
10.0.2.0/24

Name: cali40b
Type: hash:ip,port
Revision: 7
Header: family inet hashsize 1024 maxelem 100 bucketsize 12 initval 0x59c649dc
Size in memory: 360
References: 2
Number of entries: 3
Members:
10.0.0.1,tcp:80
10.0.0.1,udp:53
10.0.0.1,sctp:99

Name: cali60c
Type: hash:ip
Revision: 6
Header: family inet6 hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x67fc1809
Size in memory: 416
References: 0
Number of entries: 3
Members:
fd00::1:0:0:1
::ffff:1.2.3.4
2001:db8::1

Name: empty
Type: hash:ip
Revision: 6
Header: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1
Size in memory: 200
References: 0
Number of entries: 0
Members:
"""

TERSE = """\
Name: cali40a
Type: hash:net
Revision: 7
Header: family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x98a5359e
Size in memory: 600
References: 0
Number of entries: 3
"""

SAVE = """\
create cali40a hash:net family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x98a5359e
add cali40a 10.0.1.0/24
add cali40a 10.0.0.1
add cali40a 10.0.2.0/24
create cali40b hash:ip,port family inet hashsize 1024 maxelem 100 bucketsize 12 initval 0x59c649dc
add cali40b 10.0.0.1,tcp:80
create KUBE-FOO bitmap:port range 1-1024
add KUBE-FOO 80
create cali60c hash:ip family inet6 hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x67fc1809
add cali60c fd00::1:0:0:1
add cali60c ::ffff:1.2.3.4
"""


def test_list_names() -> None:
    assert parse_list_names("cali40a\ncali40b\n\nKUBE-X\n") == ["cali40a", "cali40b", "KUBE-X"]
    assert parse_list_names("") == []


def test_list_all_sets() -> None:
    sets = parse_list(LIST_ALL)
    assert [s.name for s in sets] == ["cali40a", "cali40b", "cali60c", "empty"]
    a, b, c, e = sets
    assert (a.type, a.family, a.max_size, a.revision, a.references) == ("hash:net", "inet", 1048576, 7, 0)
    assert a.members == ["10.0.1.0/24", "10.0.0.1", "10.0.2.0/24"]
    assert (b.type, b.max_size, b.references) == ("hash:ip,port", 100, 2)
    assert b.members == ["10.0.0.1,tcp:80", "10.0.0.1,udp:53", "10.0.0.1,sctp:99"]
    assert c.family == "inet6" and c.members == ["fd00::1:0:0:1", "::ffff:1.2.3.4", "2001:db8::1"]
    assert e.members == []


def test_list_skips_unwanted_members() -> None:
    sets = parse_list(LIST_ALL, want_members=lambda n: n == "cali40b")
    assert [s.members for s in sets] == [None, ["10.0.0.1,tcp:80", "10.0.0.1,udp:53", "10.0.0.1,sctp:99"],
                                         None, None]
    assert sets[2].type == "hash:ip"  # metadata still parsed


def test_list_terse_has_no_members() -> None:
    (s,) = parse_list(TERSE)
    assert s.members is None and s.max_size == 1048576 and s.references == 0


def test_save() -> None:
    sets = parse_save(SAVE, want_members=lambda n: n.startswith("cali"))
    by = {s.name: s for s in sets}
    assert by["cali40a"].members == ["10.0.1.0/24", "10.0.0.1", "10.0.2.0/24"]
    assert (by["cali40b"].type, by["cali40b"].max_size, by["cali40b"].family) == ("hash:ip,port", 100, "inet")
    assert by["KUBE-FOO"].members is None and by["KUBE-FOO"].type == "bitmap:port"
    assert by["cali60c"].family == "inet6" and by["cali60c"].members == ["fd00::1:0:0:1", "::ffff:1.2.3.4"]


def test_save_with_out_of_order_add_and_empty_set() -> None:
    text = "create a hash:ip family inet maxelem 5\ncreate b hash:ip family inet maxelem 5\nadd a 1.1.1.1\n"
    by = {s.name: s for s in parse_save(text)}
    assert by["a"].members == ["1.1.1.1"]
    assert by["b"].members == []


def test_restore_errors() -> None:
    assert restore_error_line("ipset v7.17: Error in line 2: Syntax error: cannot parse bogus\n") == 2
    assert restore_error_line("ipset v7.17: The set with the given name does not exist\n") is None
    assert is_not_found("ipset v7.17: The set with the given name does not exist")
    assert is_in_use("ipset v7.17: Set cannot be destroyed: it is in use by a kernel component")
    assert is_in_use("ipset v7.17: Set cannot be renamed: it is in use by another system")


# ----------------------------------------------------------------------------- save: the bulk path
def _reference_save(text: str, want: Callable[[str], bool]) -> list[tuple[object, ...]]:
    """``parse_save`` as first written, one line at a time (the oracle for the bulk path)."""
    out: list[ListedSet] = []
    by_name: dict[str, ListedSet] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("create "):
            tokens = line.split()
            if len(tokens) < 3:
                raise ValueError("bad create line")
            s = ListedSet(tokens[1], type=tokens[2])
            for k in range(3, len(tokens) - 1):
                if tokens[k] == "family":
                    s.family = tokens[k + 1]
                elif tokens[k] == "maxelem":
                    s.max_size = int(tokens[k + 1])
            out.append(s)
            by_name[s.name] = s
            prefix = f"add {s.name} "
            end = i
            while end < len(lines) and lines[end].startswith(prefix):
                end += 1
            if want(s.name):
                s.members = [m[len(prefix):] for m in lines[i:end]]
            i = end
        elif line.startswith("add "):
            _, name, member = line.split(" ", 2)
            s2 = by_name.get(name)
            if s2 is not None and want(name):
                s2.members = (s2.members or []) + [member]
    for s in out:
        if s.members is None and want(s.name):
            s.members = []
    return [(s.name, s.type, s.family, s.max_size, s.members) for s in out]


_SAVE_PIECES = [
    "create A hash:ip family inet maxelem 5", "create B hash:net family inet6 hashsize 1 maxelem 9", "create C x",
    "create A hash:ip", "add A 1.1.1.1", "add A 2.2.2.2", "add B ::1", "add B x y z", "add C q", "add D 1", "",
    "junk", "add  A 3", " create A hash:ip", "add A 1\r", "create\tA hash:ip maxelem 7", "add A x\nadd B y",
]


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(st.sampled_from(_SAVE_PIECES), max_size=12), end=st.sampled_from(["", "\n", "\n\n"]),
       wanted=st.sampled_from(["all", "not B", "none"]))
def test_save_equals_the_line_by_line_reading(lines: list[str], end: str, wanted: str) -> None:
    def want(name: str) -> bool:
        return wanted == "all" or (wanted == "not B" and name != "B")

    text = "\n".join(lines) + end
    try:
        expected = _reference_save(text, want)
    except ValueError:
        with pytest.raises(ValueError):
            parse_save(text, want)
        return
    assert [(s.name, s.type, s.family, s.max_size, s.members) for s in parse_save(text, want)] == expected
    # With a sink (the driver's restart, one set's members at a time): the same members, none kept on the sets.
    got: dict[int, list[str]] = {}

    def sink(s: ListedSet, members: list[str], whole: bool) -> None:
        if whole:
            assert id(s) not in got, "a set is given whole once"
            got[id(s)] = list(members)
        else:
            got[id(s)].extend(members)

    sets = parse_save(text, want, sink)
    assert all(s.members is None for s in sets)
    assert [(s.name, s.type, s.family, s.max_size, got.get(id(s))) for s in sets] == expected
    # In pieces cut before create lines, as the driver reads a kept ``ipset save``: the same.
    for pieces in (_cut_before_creates(text, every=True), _cut_before_creates(text, every=False)):
        assert "".join(pieces) == text
        assert [(s.name, s.type, s.family, s.max_size, s.members) for s in parse_save(pieces, want)] == expected


def _cut_before_creates(text: str, every: bool) -> list[str]:
    """*text* cut before each of its create lines (``every``), or before every other one."""
    cuts = [i + 1 for i in range(len(text)) if text.startswith("\ncreate ", i)]
    cuts = cuts if every else cuts[::2]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if b > a]


def test_save_of_a_large_set_keeps_every_member_in_order() -> None:
    members = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(50_000)]
    text = "create cali40s:big hash:ip family inet hashsize 1024 maxelem 1048576\n" + "".join(
        f"add cali40s:big {m}\n" for m in members)
    (s,) = parse_save(text)
    assert s.members == members
