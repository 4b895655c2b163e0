"""Flap damping, without netlink or real time."""

from __future__ import annotations

from felixpy.ifacemonitor.events import AddrEvent, Link, LinkEvent
from felixpy.ifacemonitor.update_filter import FLAP_DAMPING_DELAY, UpdateFilter
from felixpy.testing.clock import FakeClock


def make() -> tuple[FakeClock, UpdateFilter]:
    clock = FakeClock()
    return clock, UpdateFilter(clock.monotonic)


def up(idx: int = 5, name: str = "eth0") -> LinkEvent:
    return LinkEvent(Link(idx, name, True), True)


def down(idx: int = 5, name: str = "eth0") -> LinkEvent:
    return LinkEvent(Link(idx, name, False), True)


def gone(idx: int = 5, name: str = "eth0") -> LinkEvent:
    return LinkEvent(Link(idx, name, False), False)


def add(addr: str, idx: int = 5) -> AddrEvent:
    return AddrEvent(idx, addr, True)


def dele(addr: str, idx: int = 5) -> AddrEvent:
    return AddrEvent(idx, addr, False)


def test_delay_is_felix_100ms() -> None:
    assert FLAP_DAMPING_DELAY == 0.1


def test_add_and_link_up_pass_straight_through() -> None:
    _, f = make()
    f.push(up())
    f.push(add("10.0.0.1"))
    assert f.ready() == [up(), add("10.0.0.1")]
    assert f.next_deadline() is None


def test_delete_waits_100ms() -> None:
    clock, f = make()
    f.push(dele("10.0.0.1"))
    assert f.ready() == []
    assert f.next_deadline() == clock.now + 0.1
    clock.advance(0.099)
    assert f.ready() == []
    clock.advance(0.001)
    assert f.ready() == [dele("10.0.0.1")]
    assert f.next_deadline() is None and f.pending() == 0


def test_delete_then_readd_within_delay_leaves_only_the_add() -> None:
    clock, f = make()
    f.push(dele("10.0.0.1"))
    clock.advance(0.05)
    f.push(add("10.0.0.1"))
    assert f.ready() == [add("10.0.0.1")]
    clock.advance(1)
    assert f.ready() == []


def test_readd_after_delay_passes_both() -> None:
    clock, f = make()
    f.push(dele("10.0.0.1"))
    clock.advance(0.15)
    f.push(add("10.0.0.1"))  # the queue still holds the due delete: the add queues behind it
    assert f.ready() == [dele("10.0.0.1"), add("10.0.0.1")]


def test_squash_is_per_address() -> None:
    clock, f = make()
    f.push(dele("10.0.0.1"))
    f.push(dele("10.0.0.2"))
    clock.advance(0.05)
    f.push(add("10.0.0.1"))
    # The add for .1 squashes .1's delete but must wait behind .2's delete.
    assert f.ready() == []
    clock.advance(0.051)
    assert f.ready() == [dele("10.0.0.2"), add("10.0.0.1")]


def test_repeated_deletes_restart_the_delay() -> None:
    clock, f = make()
    f.push(dele("10.0.0.1"))
    clock.advance(0.08)
    f.push(dele("10.0.0.1"))
    clock.advance(0.05)
    assert f.ready() == []
    clock.advance(0.051)
    assert f.ready() == [dele("10.0.0.1")]


def test_link_down_and_deletion_are_delayed() -> None:
    clock, f = make()
    f.push(down())
    f.push(gone(6, "eth1"))
    assert f.ready() == []
    clock.advance(0.1)
    assert f.ready() == [down(), gone(6, "eth1")]


def test_link_up_queues_behind_a_pending_flap() -> None:
    clock, f = make()
    f.push(down())
    f.push(up())
    assert f.ready() == []  # the up may not overtake the down
    clock.advance(0.1)
    assert f.ready() == [down(), up()]


def test_interfaces_are_independent() -> None:
    clock, f = make()
    f.push(dele("10.0.0.1", idx=5))
    f.push(add("10.0.1.1", idx=6))
    f.push(up(7, "eth2"))
    assert f.ready() == [add("10.0.1.1", idx=6), up(7, "eth2")]
    clock.advance(0.1)
    assert f.ready() == [dele("10.0.0.1", idx=5)]


def test_link_events_do_not_squash_address_events() -> None:
    clock, f = make()
    f.push(dele("10.0.0.1"))
    f.push(down())
    f.push(add("10.0.0.1"))
    clock.advance(0.1)
    # The delete is squashed by the add; the down keeps its place.
    assert f.ready() == [down(), add("10.0.0.1")]


def test_index_zero_addresses_are_dropped() -> None:
    _, f = make()
    f.push(add("10.0.0.1", idx=0))
    f.push(dele("10.0.0.1", idx=0))
    assert f.ready() == [] and f.pending() == 0


def test_next_deadline_is_the_earliest_queue_head() -> None:
    clock, f = make()
    t0 = clock.now
    f.push(dele("10.0.0.1", idx=5))
    clock.advance(0.03)
    f.push(dele("10.0.0.2", idx=6))
    assert f.next_deadline() == t0 + 0.1
    clock.advance(0.07)
    assert f.ready() == [dele("10.0.0.1", idx=5)]
    assert f.next_deadline() == t0 + 0.13
