"""The fake ipset holds state and keeps the kernel's rules (so driver tests mean something)."""

from __future__ import annotations

from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets.parse import parse_list, parse_save
from felixpy.testing.clock import FakeClock


def restore(f: FakeIPSet, text: str) -> tuple[int, str]:
    r = f.run(["ipset", "restore"], text)
    return r.returncode, r.stderr


def test_restore_creates_and_fills_and_lists() -> None:
    f = FakeIPSet()
    rc, _ = restore(f, "create s hash:net family inet maxelem 10\nadd s 10.0.2.5/24\nadd s 10.0.0.1/32\nCOMMIT\n")
    assert rc == 0
    assert f.members("s") == {"10.0.2.0/24", "10.0.0.1"}
    (listed,) = parse_list(f.run(["ipset", "list", "s"]).stdout)
    assert (listed.type, listed.family, listed.max_size) == ("hash:net", "inet", 10)
    assert set(listed.members or []) == {"10.0.2.0/24", "10.0.0.1"}
    assert f.run(["ipset", "list", "-name"]).stdout == "s\n"
    (saved,) = parse_save(f.run(["ipset", "save"]).stdout)
    assert set(saved.members or []) == {"10.0.2.0/24", "10.0.0.1"}


def test_restore_stops_at_first_error_keeping_earlier_lines() -> None:
    f = FakeIPSet()
    restore(f, "create s hash:ip family inet maxelem 10\n")
    rc, err = restore(f, "add s 1.1.1.1\nadd s 1.1.1.1\nadd s 2.2.2.2\n")
    assert rc == 1 and "Error in line 2: Element cannot be added to the set: it's already added" in err
    assert f.members("s") == {"1.1.1.1"}


def test_syntax_error_drops_the_pending_batch() -> None:
    f = FakeIPSet()
    restore(f, "create s hash:ip family inet maxelem 10\n")
    rc, err = restore(f, "add s 9.9.9.9\nadd s bogus\nadd s 8.8.8.8\n")
    assert rc == 1 and "Error in line 2: Syntax error: cannot parse bogus" in err
    assert f.members("s") == set()  # as ipset 7.17 does


def test_exist_flags_and_del() -> None:
    f = FakeIPSet()
    restore(f, "create s hash:ip family inet maxelem 10\nadd s 1.1.1.1\n")
    assert restore(f, "del s 2.2.2.2\n")[0] == 1
    assert restore(f, "del s 2.2.2.2 --exist\ndel s 1.1.1.1 --exist\nCOMMIT\n")[0] == 0
    assert f.members("s") == set()
    assert "already exists" in restore(f, "create s hash:ip family inet maxelem 10\n")[1]


def test_wrong_family_garbage_and_limits() -> None:
    f = FakeIPSet()
    restore(f, "create s hash:ip family inet maxelem 2\ncreate n hash:net family inet6 maxelem 9\n")
    assert "resolving to IPv4 address failed" in restore(f, "add s fd00::1\n")[1]
    assert "CIDR parameter" in restore(f, "add n ::/0\n")[1]
    assert "Hash is full" in restore(f, "add s 1.1.1.1\nadd s 1.1.1.2\nadd s 1.1.1.3\n")[1]
    assert f.members("s") == {"1.1.1.1", "1.1.1.2"}


def test_in_use_sets_cannot_be_destroyed_or_renamed_but_can_be_swapped() -> None:
    f = FakeIPSet()
    restore(f, "create a hash:ip family inet maxelem 10\nadd a 1.1.1.1\n"
               "create t hash:ip family inet maxelem 99\nadd t 2.2.2.2\n")
    f.reference("a")
    assert "in use by a kernel component" in f.run(["ipset", "destroy", "a"]).stderr
    assert "in use by another system" in f.run(["ipset", "rename", "a", "z"]).stderr
    assert f.run(["ipset", "swap", "a", "t"]).ok
    # The reference stays with the name; the contents moved.
    assert f.sets["a"].references == 1 and f.sets["t"].references == 0
    assert f.members("a") == {"2.2.2.2"} and f.sets["a"].max_size == 99
    assert f.run(["ipset", "destroy", "t"]).ok
    f.unreference("a")
    assert f.run(["ipset", "destroy", "a"]).ok and not f.sets


def test_swap_refuses_different_types() -> None:
    f = FakeIPSet()
    restore(f, "create a hash:ip family inet maxelem 10\ncreate b hash:net family inet maxelem 10\n")
    assert "type does not match" in f.run(["ipset", "swap", "a", "b"]).stderr


def test_injection_and_calls_and_clock() -> None:
    clock = FakeClock()
    f = FakeIPSet(clock)
    f.cost["list"] = 0.5
    f.inject("restore", times=2, stderr="boom")
    assert f.run(["ipset", "restore"], "create a hash:ip family inet maxelem 1\n").stderr == "boom"
    assert not f.run(["ipset", "restore"], "create a hash:ip family inet maxelem 1\n").ok
    assert f.run(["ipset", "restore"], "create a hash:ip family inet maxelem 1\n").ok
    f.inject("restore", at_line=2, stderr="late")
    r = f.run(["ipset", "restore"], "create b hash:ip family inet maxelem 1\ncreate c hash:ip family inet maxelem 1\n")
    assert "Error in line 2: late" in r.stderr and "b" in f.sets and "c" not in f.sets
    f.inject("list", name="b", times=None)
    assert not f.run(["ipset", "list", "b"]).ok and not f.run(["ipset", "list", "b"]).ok
    assert f.run(["ipset", "list", "a"]).ok
    assert clock.monotonic() == 1000.0 + 3 * 0.5
    assert len(f.commands("restore")) == 4


def test_unlistable_sets_break_full_listings_only_for_themselves() -> None:
    f = FakeIPSet()
    f.add_set("new", "hash:ip", members=["1.1.1.1"])
    f.add_set("ok", "hash:ip")
    f.make_unlistable("new")
    assert not f.run(["ipset", "save"]).ok
    assert not f.run(["ipset", "list", "new"]).ok
    assert f.run(["ipset", "list", "ok"]).ok
    assert f.run(["ipset", "list", "-name"]).stdout.split() == ["new", "ok"]
