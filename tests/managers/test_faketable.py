"""The fake table itself: the reference rule, atomic applies, dangling references, verdict maps."""

from __future__ import annotations

import pytest

from felixpy.drivers.generictables.model import Accept, Chain, Drop, Goto, Jump, Match, Rule
from felixpy.drivers.generictables.table import MapMetadata, MapsDataplane, Table
from felixpy.errors import DataplaneError
from felixpy.drivers.generictables.fake import DanglingReferenceError, FakeTable


def jump(*targets: str) -> tuple[Rule, ...]:
    return tuple(Rule(Match(), Jump(t)) for t in targets)


def test_implements_the_protocols() -> None:
    t = FakeTable("filter", 4)
    assert isinstance(t, Table)
    assert isinstance(t, MapsDataplane)


def test_nothing_is_programmed_before_apply() -> None:
    t = FakeTable("filter", 4)
    t.update_chain(Chain("cali-a", (Rule(Match(), Accept()),)))
    t.insert_or_append_rules("FORWARD", jump("cali-a"))
    assert not t.is_programmed("cali-a")
    assert t.kernel_rules("FORWARD") == ()
    t.apply()
    assert t.is_programmed("cali-a")
    assert t.targets_of("FORWARD") == ["cali-a"]


def test_only_chains_reachable_from_kernel_chains_are_programmed() -> None:
    t = FakeTable("filter", 4)
    t.update_chains([Chain("cali-a", jump("cali-b")), Chain("cali-b"), Chain("cali-orphan", jump("cali-b"))])
    t.apply()
    assert t.programmed_names() == set()
    t.insert_or_append_rules("FORWARD", jump("cali-a"))
    t.apply()
    assert t.programmed_names() == {"cali-a", "cali-b"}
    # The reference goes: its whole subtree goes, but stays recorded.
    t.insert_or_append_rules("FORWARD", ())
    t.apply()
    assert t.programmed_names() == set()
    assert t.recorded_names() == {"cali-a", "cali-b", "cali-orphan"}


def test_chain_shared_by_two_referrers_survives_losing_one() -> None:
    t = FakeTable("filter", 4)
    t.update_chains([Chain("cali-a", jump("cali-c")), Chain("cali-b", (Rule(Match(), Goto("cali-c")),)),
                     Chain("cali-c")])
    t.insert_or_append_rules("INPUT", jump("cali-a"))
    t.append_rules("FORWARD", jump("cali-b"))
    t.apply()
    assert t.programmed_names() == {"cali-a", "cali-b", "cali-c"}
    t.update_chain(Chain("cali-a"))
    t.apply()
    assert t.programmed_names() == {"cali-a", "cali-b", "cali-c"}
    t.append_rules("FORWARD", ())
    t.apply()
    assert t.programmed_names() == {"cali-a"}


def test_loops_terminate() -> None:
    t = FakeTable("filter", 4)
    t.update_chains([Chain("cali-a", jump("cali-b")), Chain("cali-b", jump("cali-a"))])
    t.insert_or_append_rules("FORWARD", jump("cali-a"))
    t.apply()
    assert t.programmed_names() == {"cali-a", "cali-b"}


def test_dangling_reference_fails_the_apply_atomically() -> None:
    t = FakeTable("filter", 4)
    t.update_chain(Chain("cali-a"))
    t.insert_or_append_rules("FORWARD", jump("cali-a"))
    t.apply()
    t.update_chain(Chain("cali-a", jump("cali-missing")))
    assert t.dangling_references() == {("cali-a", "cali-missing")}
    with pytest.raises(DanglingReferenceError, match="cali-a->cali-missing"):
        t.apply()
    assert t.programmed_chain("cali-a") == Chain("cali-a")  # kernel unchanged
    t.update_chain(Chain("cali-missing"))
    t.apply()
    assert t.programmed_names() == {"cali-a", "cali-missing"}


def test_unreferenced_dangling_reference_is_harmless() -> None:
    t = FakeTable("filter", 4)
    t.update_chain(Chain("cali-a", jump("cali-missing")))
    t.apply()
    assert t.dangling_references() == set()


def test_injected_failures() -> None:
    t = FakeTable("filter", 4)
    t.update_chain(Chain("cali-a"))
    t.insert_or_append_rules("FORWARD", jump("cali-a"))
    t.fail_next_applies = 1
    with pytest.raises(DataplaneError):
        t.apply()
    assert not t.is_programmed("cali-a")
    t.apply()
    assert t.is_programmed("cali-a")


def test_removing_absent_chain_is_not_an_error_and_kernel_chains_are_guarded() -> None:
    t = FakeTable("filter", 4)
    t.remove_chain_by_name("cali-nope")
    with pytest.raises(ValueError):
        t.update_chain(Chain("FORWARD"))
    with pytest.raises(ValueError):
        t.insert_or_append_rules("PREROUTING", ())  # not a filter kernel chain


def test_kernel_writes_count_only_changes() -> None:
    t = FakeTable("filter", 4)
    t.update_chain(Chain("cali-a", (Rule(Match(), Drop()),)))
    t.insert_or_append_rules("FORWARD", jump("cali-a"))
    t.apply()
    assert (t.kernel_writes, t.last_changed) == (1, {"cali-a", "FORWARD"})
    t.update_chain(Chain("cali-a", (Rule(Match(), Drop()),)))
    t.apply()
    assert (t.apply_count, t.kernel_writes, t.last_changed) == (2, 1, set())


def test_verdict_map_elements_reference_chains() -> None:
    t = FakeTable("filter", 4)
    t.update_chain(Chain("cali-tw-x"))
    t.add_or_replace_map(MapMetadata("cali-to-wl-dispatch"), {"x": Goto("cali-tw-x")})
    t.apply()
    assert t.is_programmed("cali-tw-x")
    assert t.programmed_map("cali-to-wl-dispatch") == {"x": Goto("cali-tw-x")}
    t.remove_map("cali-to-wl-dispatch")
    t.apply()
    assert not t.is_programmed("cali-tw-x")
    assert t.programmed_map("cali-to-wl-dispatch") is None


def test_referenced_ip_sets() -> None:
    t = FakeTable("filter", 4)
    t.update_chain(Chain("cali-a", (Rule(Match().source_ip_set("cali40s:x"), Accept()),)))
    t.update_chain(Chain("cali-b", (Rule(Match().dest_ip_set("cali40s:unused"), Accept()),)))
    t.insert_or_append_rules("FORWARD", jump("cali-a"))
    t.apply()
    assert t.referenced_ip_sets() == {"cali40s:x"}


@pytest.mark.parametrize("net", ["fd00::/64", "not-a-net"])
def test_rule_with_a_net_the_kernel_would_refuse_fails_the_apply(net: str) -> None:
    from felixpy.drivers.generictables.fake import InvalidRuleError

    t = FakeTable("filter", 4)
    t.update_chain(Chain("cali-a", (Rule(Match().source_net(net), Accept()),)))
    t.apply()  # not referenced: not written, no failure
    t.insert_or_append_rules("FORWARD", jump("cali-a"))
    with pytest.raises(InvalidRuleError):
        t.apply()
    assert not t.is_programmed("cali-a")
