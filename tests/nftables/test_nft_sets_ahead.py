"""Big set writes ahead of the rules (issue #17): ``NftablesTable.apply_updates`` at the loop's IP-set step.

At start of day the loop runs it on a worker while the other managers render (felixpy/dataplane/core.py), so
nft takes the members while Python renders the rules.  Pinned here, against the stateful fake: only creates and
member changes go ahead, and only from ``sets_ahead_min`` elements; the table's transaction then holds the rest
and never rewrites what went ahead; the kernel ends up as with one transaction; a failure ahead changes nothing
and leaves everything to the table's transaction; without a usable view of the kernel nothing goes ahead.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

import nft_helpers as hp
from nft_helpers import Harness, program_typical

from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.nftables.fake import FakeNft

V46 = pytest.mark.parametrize("v", [4, 6])


class Lister:
    """Lists the fake when its job runs (the table's prefetch runs jobs through ``start_background``)."""

    def __init__(self, fake: FakeNft) -> None:
        self.fake = fake
        self.calls = 0

    def run(self, commands: Any) -> None:
        raise AssertionError("a lister never writes")

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        self.calls += 1
        return copy.deepcopy(self.fake.list_table(family, name))

    def list_sets(self, family: str, name: str) -> list[dict[str, Any]] | None:
        self.calls += 1
        return copy.deepcopy(self.fake.list_sets(family, name))


def _kinds(commands: list[dict[str, Any]]) -> set[str]:
    """``verb kind`` of every command (e.g. "add element", "add rule")."""
    out = set()
    for cmd in commands:
        (verb, body), = cmd.items()
        (kind, _), = body.items()
        out.add(f"{verb} {kind}")
    return out


def _set_commands(commands: list[dict[str, Any]], sets: set[str]) -> list[dict[str, Any]]:
    """The commands that create, fill, empty or delete one of *sets* (map elements are "element"s too)."""
    out = []
    for cmd in commands:
        (body,) = cmd.values()
        (kind, obj), = body.items()
        if kind in ("set", "element") and obj["name"] in sets:
            out.append(cmd)
    return out


def _started(make: Callable[..., Harness], fake: FakeNft, v: int, ahead: int) -> Harness:
    """A fresh table with the typical state recorded and its start-of-day read-back prefetched (run inline)."""
    h = make(fake, v, lister=Lister(fake), start_background=lambda job: job(), sets_ahead_min=ahead)
    program_typical(h)
    h.root.prefetch()
    return h


def _state(fake: FakeNft, v: int) -> tuple[Any, ...]:
    chains = {name: (c["base"], [comment for _, comment, _ in c["rules"]]) for name, c in hp.chains(fake, v).items()}
    return chains, hp.sets(fake, v), hp.set_types(fake, v), hp.maps(fake, v)


@V46
def test_at_start_of_day_the_sets_go_ahead_and_the_table_writes_the_rest(make: Callable[..., Harness], v: int) -> None:
    one = FakeNft()
    h1 = make(one, v)
    program_typical(h1)
    h1.root.apply()

    fake = FakeNft()
    h = _started(make, fake, v, ahead=1)
    h.root.apply_updates()
    assert fake.run_calls == 1
    assert _kinds(fake.last_commands) == {"add table", "add set", "add element"}
    assert hp.sets(fake, v) == hp.sets(one, v) and hp.chains(fake, v) == {}
    h.root.apply()
    assert fake.run_calls == 2
    assert _set_commands(fake.last_commands, set(hp.sets(one, v))) == []
    assert _state(fake, v) == _state(one, v)
    assert h.sleeps == []
    # A restart over it finds everything right.
    runs = fake.run_calls
    again = make(fake, v)
    program_typical(again)
    again.root.apply_updates()
    again.root.apply()
    assert fake.run_calls == runs


def test_below_the_threshold_the_sets_stay_in_the_tables_transaction(make: Callable[..., Harness],
                                                                     fake: FakeNft) -> None:
    h = _started(make, fake, 4, ahead=7)   # the typical state has 6 elements
    h.root.apply_updates()
    assert fake.run_calls == 0 and fake.table("ip") is None
    h.root.apply()
    assert fake.run_calls == 1 and "add element" in _kinds(fake.last_commands)
    assert hp.sets(fake, 4)["cali40s-hosts"] == {h.addr(1), h.addr(2)}


def test_in_sync_a_big_member_change_goes_ahead_and_the_table_has_nothing_left(make: Callable[..., Harness],
                                                                               fake: FakeNft) -> None:
    h = _started(make, fake, 4, ahead=3)
    h.root.apply()
    runs = fake.run_calls
    h.root.add_members("s:hosts", [h.addr(n) for n in range(10, 14)])
    h.root.remove_members("s:hosts", [h.addr(1)])
    h.root.apply_updates()
    assert fake.run_calls == runs + 1
    assert _kinds(fake.last_commands) == {"add element", "delete element"}
    assert hp.sets(fake, 4)["cali40s-hosts"] == {h.addr(n) for n in (2, 10, 11, 12, 13)}
    h.root.apply()
    assert fake.run_calls == runs + 1      # nothing left to write
    h.root.add_members("s:hosts", [h.addr(20)])   # small: waits for the table's transaction
    h.root.apply_updates()
    assert fake.run_calls == runs + 1
    h.root.apply()
    assert fake.run_calls == runs + 2 and h.addr(20) in hp.sets(fake, 4)["cali40s-hosts"]


def test_deletions_and_type_changes_never_go_ahead(make: Callable[..., Harness], fake: FakeNft) -> None:
    """Both need the rules that use the set rewritten in the same transaction (a set must never be missing
    or of the wrong type while a rule uses it)."""
    h = _started(make, fake, 4, ahead=1)
    h.root.apply()
    runs = fake.run_calls
    h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", IPSetType.HASH_NET), [h.net(7)])   # type change
    h.root.remove_ip_set("n:ports")
    h.root.apply_updates()
    assert fake.run_calls == runs
    h.root.apply()
    assert fake.run_calls == runs + 1
    assert hp.set_types(fake, 4)["cali40s-hosts"][1] == ("interval",)
    assert hp.sets(fake, 4)["cali40s-hosts"] == {h.net(7)}
    assert "cali40n-ports" in hp.sets(fake, 4)     # still used by cali-INPUT: its deletion is deferred


def test_a_failure_ahead_changes_nothing_and_the_table_writes_everything(make: Callable[..., Harness],
                                                                        fake: FakeNft) -> None:
    h = _started(make, fake, 4, ahead=1)
    fake.fail_next_runs(1)
    h.root.apply_updates()                   # logged, not raised: no retry, no sleep
    assert fake.run_calls == 1 and fake.table("ip") is None and h.sleeps == []
    h.root.apply()
    assert fake.run_calls == 2 and "add element" in _kinds(fake.last_commands)
    assert hp.sets(fake, 4)["cali40s-web"] == {h.net(1), h.addr(5)} and "filter-cali-INPUT" in hp.chains(fake, 4)


def test_without_a_view_of_the_kernel_nothing_goes_ahead(make: Callable[..., Harness], fake: FakeNft) -> None:
    # Start of day without a prefetched listing: the table's apply lists for itself and writes it all.
    h = make(fake, 4, sets_ahead_min=1)
    program_typical(h)
    h.root.apply_updates()
    assert fake.run_calls == 0 and fake.list_calls == 0
    h.root.apply()
    # In sync, but with a re-read of the sets queued (the IP-set refresh): our view may be stale.
    h.root.add_members("s:hosts", [h.addr(30)])
    h.root.queue_resync()
    runs = fake.run_calls
    h.root.apply_updates()
    assert fake.run_calls == runs
    h.root.apply()
    assert h.addr(30) in hp.sets(fake, 4)["cali40s-hosts"]
