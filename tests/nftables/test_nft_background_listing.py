"""Refresh listings off the apply path (issue #17): with a lister, the ``NftablesRefreshInterval`` refresh and the
IP-set resync list the kernel on a background thread, so a rule change that meets the timer does not wait for a
listing of 20k rules and 200k set members (seconds; a minute at 300k rules).

What the merge relies on, pinned here: a chain, set or map that a transaction wrote while the listing ran keeps
what the transaction left (the listing may have seen it before the write), everything else is taken from the
listing, so drift found there is repaired on the next apply; a failed listing, or a listing of the apply path's
own in the meantime, is never merged.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

import nft_helpers as hp
from nft_helpers import Harness, program_typical

from felixpy.drivers.generictables.model import Accept, Chain, Drop, Match, Rule
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.nftables.shim import NftChildProcess, NftListerFactory, nft_objects_yielding
from felixpy.drivers.nftables.layer import new_nftables_tables
from felixpy.drivers.nftables.table import LISTING_POLL
from felixpy.errors import DataplaneError

T = hp.tbl(4)


class LaggingLister:
    """A lister whose listing reads the kernel when :meth:`read` is called and returns it when the job runs:
    a listing that started before some transaction and ends after it."""

    def __init__(self, fake: FakeNft) -> None:
        self.fake = fake
        self.table: list[dict[str, Any]] | None = None
        self.sets_: list[dict[str, Any]] | None = None
        self.fail = False
        self.calls = 0

    def read(self) -> None:
        self.table = copy.deepcopy(self.fake.list_table("ip", "calico"))
        self.sets_ = copy.deepcopy(self.fake.list_sets("ip", "calico"))

    def run(self, commands: Any) -> None:
        raise AssertionError("a lister never writes")

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        self.calls += 1
        if self.fail:
            raise DataplaneError("listing failed")
        return self.table

    def list_sets(self, family: str, name: str) -> list[dict[str, Any]] | None:
        self.calls += 1
        return self.sets_


def _prog(make: Callable[..., Harness], fake: FakeNft) -> tuple[Harness, LaggingLister, list[Callable[[], None]]]:
    lister = LaggingLister(fake)
    jobs: list[Callable[[], None]] = []
    h = make(fake, lister=lister, start_background=jobs.append)
    program_typical(h)
    h.root.apply()
    assert jobs == []     # start of day lists on the apply path
    return h, lister, jobs


def _names(commands: list[dict[str, Any]]) -> set[str]:
    """The chains/sets/maps a transaction's commands act on."""
    out = set()
    for cmd in commands:
        (body,) = cmd.values()
        (obj,) = body.values()
        out.add(obj.get("chain") or obj["name"])
    return out


def _chain_texts(fake: FakeNft) -> dict[str, list[str]]:
    return {n: [c for _, c, _ in x["rules"]] for n, x in hp.chains(fake, 4).items()}


def test_refresh_lists_in_the_background_and_repairs_drift_found_there(make: Callable[..., Harness],
                                                                      fake: FakeNft) -> None:
    h, lister, jobs = _prog(make, fake)
    good = _chain_texts(fake)
    fake.run([{"flush": {"chain": {**T, "name": "filter-cali-INPUT"}}}])          # drift
    h.clock.advance(181)
    lists, runs = fake.list_calls, fake.run_calls
    # The refresh is due: the apply starts the listing and does not wait for it; a rule change goes through.
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Drop()), Rule(Match(), Accept()))))
    assert h.root.apply() == LISTING_POLL
    assert len(jobs) == 1 and fake.list_calls == lists and fake.run_calls == runs + 1
    assert len(_chain_texts(fake)["filter-cali-fw-cali5678"]) == 2
    # The listing ends; the next apply merges it and repairs the drift.
    lister.read()
    lists = fake.list_calls
    jobs.pop()()
    h.root.apply()
    assert fake.list_calls == lists            # nothing listed on the apply path
    after = _chain_texts(fake)
    assert after["filter-cali-INPUT"] == good["filter-cali-INPUT"]
    assert h.root.apply() == 180.0             # merged: no more polling, next refresh in 180 s


def test_what_a_transaction_wrote_during_the_listing_is_not_taken_from_it(make: Callable[..., Harness],
                                                                         fake: FakeNft) -> None:
    h, lister, jobs = _prog(make, fake)
    fake.run([{"flush": {"chain": {**T, "name": "filter-cali-INPUT"}}}])          # drift the listing will see
    h.clock.advance(181)
    h.root.apply()
    lister.read()             # the listing reads the kernel here ...
    # ... then, before it ends, a transaction rewrites a chain, a set and the map, and deletes a chain.
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Drop()), Rule(Match(), Accept()))))
    h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", IPSetType.HASH_IP), [h.addr(1), h.addr(7)])
    h.nat.remove_chain_by_name("cali-nat-outgoing")
    h.nat.insert_or_append_rules("POSTROUTING", [])
    h.root.apply()
    written = _chain_texts(fake)
    written_sets = hp.sets(fake, 4)
    jobs.pop()()              # the listing ends, holding the state from before that transaction
    runs, lists = fake.run_calls, fake.list_calls
    h.root.apply()
    assert (fake.run_calls, fake.list_calls) == (runs + 1, lists)   # one transaction, first time right
    cmds = fake.last_commands
    assert _names(cmds) == {"filter-cali-INPUT"}, cmds   # only the drift: the written objects are trusted
    after = _chain_texts(fake)
    assert after["filter-cali-fw-cali5678"] == written["filter-cali-fw-cali5678"]
    assert "nat-cali-nat-outgoing" not in after
    assert hp.sets(fake, 4) == written_sets and hp.sets(fake, 4)["cali40s-hosts"] == {h.addr(1), h.addr(7)}
    assert len(after["filter-cali-INPUT"]) == 4


def test_a_failed_background_listing_falls_back_to_the_apply_path(make: Callable[..., Harness],
                                                                  fake: FakeNft) -> None:
    h, lister, jobs = _prog(make, fake)
    good = _chain_texts(fake)
    fake.run([{"flush": {"chain": {**T, "name": "filter-cali-INPUT"}}}])
    h.clock.advance(181)
    h.root.apply()
    lister.fail = True
    jobs.pop()()
    lists = fake.list_calls
    h.root.apply()
    assert fake.list_calls == lists + 1 and _chain_texts(fake) == good


def test_a_listing_older_than_one_of_the_apply_path_is_dropped(make: Callable[..., Harness], fake: FakeNft) -> None:
    h, lister, jobs = _prog(make, fake)
    h.clock.advance(181)
    h.root.apply()
    fake.run([{"add": {"set": {**T, "name": "x", "type": "ipv4_addr"}}}])   # someone else's set ...
    lister.read()                                   # ... seen by the background listing ...
    fake.run([{"delete": {"set": {**T, "name": "x"}}}])                     # ... and gone again
    h.filter.invalidate_dataplane_cache("test")     # an apply-path listing (newer) finds nothing to do
    runs = fake.run_calls
    h.root.apply()
    assert fake.run_calls == runs
    jobs.pop()()
    lists = fake.list_calls
    h.root.apply()
    # Merged, the stale view would have the apply delete the vanished set (a failed transaction, a retry).
    assert (fake.run_calls, fake.list_calls) == (runs, lists)


def test_set_resync_lists_sets_in_the_background(make: Callable[..., Harness], fake: FakeNft) -> None:
    h, lister, jobs = _prog(make, fake)
    good = hp.sets(fake, 4)
    fake.run([{"delete": {"element": {**T, "name": "cali40s-hosts", "elem": ["10.0.0.1"]}}}])
    set_lists, lists = fake.set_list_calls, fake.list_calls
    h.root.queue_resync()
    h.root.apply()
    assert len(jobs) == 1 and (fake.set_list_calls, fake.list_calls) == (set_lists, lists)
    lister.read()
    set_lists, lists = fake.set_list_calls, fake.list_calls
    jobs.pop()()
    h.root.apply()
    assert (fake.set_list_calls, fake.list_calls) == (set_lists, lists)
    assert hp.sets(fake, 4) == good
    assert lister.calls == 1


def test_a_refresh_due_during_a_sets_listing_waits_for_it_off_the_apply_path(make: Callable[..., Harness],
                                                                            fake: FakeNft) -> None:
    h, lister, jobs = _prog(make, fake)
    h.root.queue_resync()
    h.root.apply()
    assert len(jobs) == 1                       # the sets listing
    h.clock.advance(181)
    lists = fake.list_calls
    h.root.apply()                              # the table refresh is due: no listing here, no second job
    assert fake.list_calls == lists and len(jobs) == 1
    lister.read()
    lists = fake.list_calls
    jobs.pop()()
    h.root.apply()                              # sets merged; the table listing starts now
    assert fake.list_calls == lists and len(jobs) == 1


def test_child_shim_gets_background_listings_and_the_fake_does_not() -> None:
    child = NftChildProcess()
    assert isinstance(child, NftListerFactory)
    root, _ = new_nftables_tables(4, child)
    assert isinstance(root._lister, NftChildProcess) and root._lister is not child
    assert root._lister._loads is nft_objects_yielding and child._loads is not nft_objects_yielding
    root2, _ = new_nftables_tables(4, FakeNft())
    assert root2._lister is None


@pytest.mark.parametrize("text", [
    '{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}, '
    '{"table": {"family": "ip", "name": "calico", "handle": 3}}, {"rule": {"expr": [{"accept": null}], '
    '"comment": "a ] , [ { in a string"}}]}',
    '{"nftables":[]}', '  {"nftables": [ {"a": 1} ,\n {"b": [1, 2]} ] }\n', ""])
def test_yielding_decode_equals_json_loads(text: str) -> None:
    want = json.loads(text)["nftables"] if text.strip() else []
    assert nft_objects_yielding(text) == want


def test_yielding_decode_of_malformed_output_fails_as_json_loads_does() -> None:
    for bad in ('{"nftables": [{"a": 1}, {"b": ', '{"nftables": [{"a": 1} {"b": 2}]}'):
        with pytest.raises(ValueError):
            nft_objects_yielding(bad)


def test_kernel_refresh_off_the_apply_path_repairs_drift(in_netns: str, make: Callable[..., Harness]) -> None:
    """The real thread and the real ``nft`` child: the listing runs while applies go on, then repairs."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root")
    assert hp.inside_netns(in_netns)
    shim = NftChildProcess()
    h = make(shim, lister=shim)
    program_typical(h)
    h.root.apply()
    good = {n: [c for _, c, _ in x["rules"]] for n, x in hp.chains(shim, 4).items()}
    shim.run([{"flush": {"chain": {**T, "name": "filter-cali-INPUT"}}}])
    h.clock.advance(181)
    assert h.root.apply() == LISTING_POLL
    deadline = time.monotonic() + 60
    while h.root.apply() == LISTING_POLL and time.monotonic() < deadline:
        time.sleep(0.05)
    h.root.apply()
    assert {n: [c for _, c, _ in x["rules"]] for n, x in hp.chains(shim, 4).items()} == good


# ------------------------------------------------------------------------- the start-of-day prefetch
def test_a_prefetched_start_of_day_listing_is_what_the_first_apply_uses(make: Callable[..., Harness],
                                                                        fake: FakeNft) -> None:
    """prefetch() starts the start-of-day read-back on the lister; the apply that follows waits for it and
    lists nothing itself, and programs exactly what a listing on the apply path would have led to: here a
    restart over a kernel that already holds everything, with one foreign rule to remove."""
    first = make(fake)
    program_typical(first)
    first.root.apply()
    want = {name: [comment for _, comment, _ in c["rules"]] for name, c in hp.chains(fake, 4).items()}
    fake.run([{"add": {"rule": {**T, "chain": "filter-cali-INPUT", "expr": [{"accept": None}]}}}])
    lister = LaggingLister(fake)
    jobs: list[Callable[[], None]] = []
    h = make(fake, lister=lister, start_background=jobs.append)
    program_typical(h)
    h.root.prefetch()
    h.root.prefetch()                 # one at a time
    assert len(jobs) == 1
    lister.read()
    jobs.pop()()
    lists, runs = fake.list_calls, fake.run_calls
    h.root.apply()
    assert fake.list_calls == lists and lister.calls == 1       # the apply listed nothing of its own
    assert fake.run_calls == runs + 1
    assert {name: [comment for _, comment, _ in c["rules"]] for name, c in hp.chains(fake, 4).items()} == want
    h.root.prefetch()                 # in sync now: nothing to prefetch
    assert jobs == []


def test_a_failed_prefetch_is_not_used_and_a_later_one_after_a_failure_is(make: Callable[..., Harness],
                                                                          fake: FakeNft) -> None:
    lister = LaggingLister(fake)
    jobs: list[Callable[[], None]] = []
    h = make(fake, lister=lister, start_background=jobs.append)
    program_typical(h)
    lister.fail = True
    h.root.prefetch()
    jobs.pop()()
    h.root.apply()                                     # lists on the apply path instead
    assert fake.list_calls == 1 and "filter-cali-INPUT" in hp.chains(fake, 4)
    # A failure empties the view: the next apply's read-back may be prefetched again.
    lister.fail = False
    h.root.invalidate_dataplane_cache("test")
    h.root.prefetch()
    lister.read()
    jobs.pop()()
    h.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Drop()),)))
    lists = fake.list_calls
    h.root.apply()
    assert fake.list_calls == lists and lister.calls == 2     # the prefetched listing, nothing more
    assert len(hp.chains(fake, 4)["filter-cali-INPUT"]["rules"]) == 1
