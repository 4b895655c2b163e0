"""A start of day's work done ahead of its apply (IptablesTable ``prefetch`` and ``render_ahead``), on the fake.

``prefetch`` begins the read the first apply needs while the loop's apply renders and writes the IP sets
and devices; ``render_ahead`` hashes the chains recorded before ``InSync``.  Neither may change what the
table writes, nor let it act on a read older than its own last write.  The background job is captured
instead of started, so each test decides when the read runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from felixpy.drivers.generictables.model import Accept, Chain, Jump, Match, Rule
from felixpy.drivers.iptables.detect import Features, StaticFeatures
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.iptables.metrics import get_metrics
from felixpy.drivers.iptables.table import PREFETCH_MAX_AGE, IptablesTable
from felixpy.testing.clock import FakeClock

FEATURES = Features(SNATFullyRandom=True, MASQFullyRandom=True, RestoreSupportsLock=True, NFLogSize=True)


class Node:
    def __init__(self, fake: FakeIptables | None = None) -> None:
        self.fake = fake or FakeIptables(default_backend="legacy")
        self.clock = FakeClock()
        self.jobs: list[Callable[[], None]] = []
        self.table = IptablesTable("filter", 4, runner=self.fake, backend="legacy",
                                   features=StaticFeatures(FEATURES), clock=self.clock.monotonic,
                                   sleep=self.clock.sleep, metrics=get_metrics(CollectorRegistry()),
                                   background_rechecks=True, start_background=self.jobs.append)

    def program(self, port: int = 80) -> None:
        t = self.table
        t.update_chains([Chain("cali-pi-x", (Rule(Match().protocol("tcp").dest_port(port), Accept()),))])
        t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
        t.update_chains([Chain("cali-FORWARD", (Rule(action=Jump("cali-pi-x")),))])

    def saves(self) -> int:
        return sum(1 for argv, _ in self.fake.calls if argv[0].endswith("-save"))

    def restores(self) -> list[str]:
        return [i or "" for argv, i in self.fake.calls if argv[0].endswith("-restore")]

    def run_jobs(self) -> None:
        jobs, self.jobs[:] = list(self.jobs), []
        for job in jobs:
            job()


def test_a_prefetched_read_is_the_start_of_days_one_read() -> None:
    first = Node()
    first.program()
    first.table.apply()
    restart = Node(first.fake)
    restart.program()
    first.fake.calls.clear()
    restart.table.prefetch()
    restart.table.prefetch()  # one read at a time
    assert len(restart.jobs) == 1 and restart.saves() == 0  # begun, not run: nothing on this thread
    restart.run_jobs()
    assert restart.saves() == 1
    restart.table.apply()
    assert restart.saves() == 1 and restart.restores() == []  # that read, and nothing to write
    assert restart.table.in_sync
    restart.table.prefetch()
    assert restart.jobs == []  # in sync: nothing to prefetch


def test_a_prefetched_read_still_running_is_waited_for_and_drift_in_it_is_repaired() -> None:
    first = Node()
    first.program()
    first.table.apply()
    first.fake.external_restore("*filter\n-F cali-pi-x\nCOMMIT\n")
    first.fake.calls.clear()
    restart = Node(first.fake)
    restart.program()
    restart.table.prefetch()
    job = restart.jobs.pop()
    runner = threading.Timer(0.05, job)  # finishes while the apply waits for it
    runner.start()
    restart.table.apply()
    runner.join()
    assert restart.table.dataplane_hashes()["cali-pi-x"] == restart.table.expected_hashes("cali-pi-x")
    assert len(restart.restores()) == 1 and restart.saves() == 1


def test_a_failed_or_stale_prefetch_is_read_again_on_the_apply_path() -> None:
    first = Node()
    first.program()
    first.table.apply()
    failing = Node(first.fake)
    failing.program()
    failing.table.prefetch()
    first.fake.fail_next_saves = 1
    first.fake.calls.clear()
    failing.run_jobs()
    failing.table.apply()
    assert failing.table.in_sync and failing.saves() == 2 and failing.restores() == []

    stale = Node(first.fake)
    stale.program()
    stale.table.prefetch()
    stale.run_jobs()
    first.fake.external_restore("*filter\n-F cali-pi-x\nCOMMIT\n")  # after the prefetched read
    stale.clock.advance(PREFETCH_MAX_AGE + 1)  # the tables were held back meanwhile
    first.fake.calls.clear()
    stale.table.apply()
    assert stale.saves() == 1  # read again: the old read would have missed the flush
    assert stale.table.dataplane_hashes()["cali-pi-x"] == stale.table.expected_hashes("cali-pi-x")


def test_rendering_ahead_hashes_unreferenced_chains_and_changes_nothing_written() -> None:
    plain, ahead = Node(), Node()
    plain.program()
    ahead.table.update_chains([Chain("cali-pi-x", (Rule(Match().protocol("tcp").dest_port(80), Accept()),))])
    ahead.table.render_ahead()  # the policy chain arrives before anything references it
    assert "cali-pi-x" in ahead.table._hash_cache
    ahead.table.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
    ahead.table.update_chains([Chain("cali-FORWARD", (Rule(action=Jump("cali-pi-x")),))])
    ahead.table.render_ahead()
    plain.table.apply()
    ahead.table.apply()
    assert ahead.restores() == plain.restores()  # byte for byte
    ahead.program(port=81)  # a change after the render drops what was rendered for the old chain
    ahead.table.apply()
    assert ahead.table.dataplane_hashes()["cali-pi-x"] == ahead.table.expected_hashes("cali-pi-x")
    assert "--destination-ports 81" in ahead.restores()[-1]
