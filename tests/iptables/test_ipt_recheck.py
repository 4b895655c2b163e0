"""Refresh and post-write rechecks off the apply path (IptablesTable ``background_rechecks``), on the fake.

The background jobs are captured instead of started, so each test decides when the read runs and what
it sees: the read can be made to return an older text than the kernel holds by then, as a slow
``iptables-nft-save`` running across a write would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from felixpy.drivers.cmdshim import CommandResult
from felixpy.drivers.generictables.model import Accept, Chain, Jump, Match, Rule
from felixpy.drivers.iptables.detect import Features, StaticFeatures
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.iptables.metrics import get_metrics
from felixpy.drivers.iptables.recheck import RECHECK_POLL
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.testing.clock import FakeClock

FEATURES = Features(SNATFullyRandom=True, MASQFullyRandom=True, RestoreSupportsLock=True, NFLogSize=True)


class FreezableSaves:
    """The fake, except that a save can be made to print a text captured earlier."""

    def __init__(self, fake: FakeIptables) -> None:
        self.fake = fake
        self.frozen: str | None = None

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        if self.frozen is not None and argv[0].endswith("-save"):
            self.fake.calls.append((tuple(argv), stdin))
            return CommandResult(0, self.frozen, "", tuple(argv))
        return self.fake.run(argv, stdin, while_running=while_running)


def chains(version: int) -> list[Chain]:
    return [Chain("cali-FORWARD", (Rule(action=Jump("cali-x")), Rule(action=Jump("cali-y")))),
            Chain("cali-x", (Rule(Match().protocol("tcp"), Accept(), (f"x v{version}",)),)),
            Chain("cali-y", (Rule(Match().protocol("udp"), Accept()),))]


@pytest.fixture(params=["legacy", "nft"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Setup:
    def __init__(self, backend: str) -> None:
        self.fake = FakeIptables(default_backend=backend)
        self.runner = FreezableSaves(self.fake)
        self.clock = FakeClock()
        self.jobs: list[Callable[[], None]] = []
        self.registry = CollectorRegistry()
        self.table = IptablesTable("filter", 4, runner=self.runner, backend=backend,  # type: ignore[arg-type]
                                   features=StaticFeatures(FEATURES), clock=self.clock.monotonic,
                                   sleep=self.clock.sleep, metrics=get_metrics(self.registry),
                                   background_rechecks=True, start_background=self.jobs.append)
        self.table.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
        self.table.update_chains(chains(1))
        self.table.apply()  # start of day: read and write on the apply path
        assert self.jobs == []

    def saves(self) -> int:
        return sum(1 for argv, _ in self.fake.calls if argv[0].endswith("-save"))

    def restores(self) -> list[str]:
        return [i or "" for argv, i in self.fake.calls if argv[0].endswith("-restore")]

    def due(self) -> float | None:
        """Past the first post-write check; the apply that notices it."""
        self.clock.advance(6.0)
        return self.table.apply()

    def specs(self, chain: str) -> list[str]:
        return self.fake.chain_specs("filter", chain)


@pytest.fixture
def s(backend: str) -> Setup:
    return Setup(backend)


def drift_repairs() -> float:
    return REGISTRY.get_sample_value("felixpy_drift_repairs_total", {"kind": "rule"}) or 0.0


def test_a_due_check_of_an_in_sync_table_reads_off_the_apply_path_and_a_later_apply_repairs(s: Setup) -> None:
    want = s.specs("cali-y")
    repairs = drift_repairs()
    s.fake.external_restore("*filter\n-F cali-y\nCOMMIT\n")  # someone flushes our chain
    saves, restores = s.saves(), len(s.restores())
    resched = s.due()
    assert s.saves() == saves and len(s.restores()) == restores  # nothing read or written on the apply path
    assert len(s.jobs) == 1 and resched is not None and resched <= RECHECK_POLL
    assert s.table.apply() is not None and len(s.jobs) == 1  # still running: no second read, still polling
    s.jobs.pop()()  # the read runs (its own thread in the daemon)
    assert s.saves() == saves + 1
    s.table.apply()
    assert s.specs("cali-y") == want and s.table.in_sync
    assert drift_repairs() == repairs + 1  # counted as drift, as a read on the apply path would be


def test_a_chain_written_while_the_read_ran_keeps_what_the_write_left(s: Setup) -> None:
    want_y = s.specs("cali-y")
    s.fake.external_restore("*filter\n-F cali-y\nCOMMIT\n")
    old_text = s.fake.run(["iptables-save", "-t", "filter"]).stdout  # what a slow read will print
    s.due()
    assert len(s.jobs) == 1
    s.table.update_chains(chains(2))  # cali-x changes and is written while the read runs
    s.table.apply()
    x_after_write = s.specs("cali-x")
    n = len(s.restores())
    s.runner.frozen = old_text  # the read started before that write: it shows the old cali-x
    s.jobs.pop()()
    s.runner.frozen = None
    s.table.apply()
    repair = s.restores()[n:]
    assert len(repair) == 1 and "cali-y" in repair[0] and "cali-x" not in repair[0]
    assert s.specs("cali-x") == x_after_write and s.specs("cali-y") == want_y


def test_a_failed_background_read_is_redone_on_the_apply_path(s: Setup) -> None:
    s.fake.external_restore("*filter\n-F cali-y\nCOMMIT\n")
    s.due()
    s.fake.fail_next_saves = 1
    s.jobs.pop()()
    saves = s.saves()
    s.table.apply()  # the failure is noticed; this apply reads for itself and repairs
    assert s.saves() == saves + 1 and s.jobs == []
    assert s.specs("cali-y") and s.table.in_sync


def test_a_background_read_older_than_a_read_on_the_apply_path_is_never_merged(s: Setup) -> None:
    stale = s.fake.run(["iptables-save", "-t", "filter"]).stdout.replace("-A cali-y", "-A cali-z")
    s.due()
    s.table.invalidate_dataplane_cache("test")  # e.g. a failed write: the next apply reads for itself
    s.table.apply()
    n = len(s.restores())
    s.runner.frozen = stale  # the old job finishes late, with a view that would look like drift
    s.jobs.pop()()
    s.runner.frozen = None
    s.table.apply()
    assert len(s.restores()) == n  # nothing "repaired" from the stale view


def test_without_background_rechecks_the_check_reads_on_the_apply_path(backend: str) -> None:
    fake = FakeIptables(default_backend=backend)
    clock = FakeClock()
    t = IptablesTable("filter", 4, runner=fake, backend=backend, features=StaticFeatures(FEATURES),
                      clock=clock.monotonic, sleep=clock.sleep, metrics=get_metrics(CollectorRegistry()))
    t.update_chains(chains(1))
    t.apply()
    saves = sum(1 for argv, _ in fake.calls if argv[0].endswith("-save"))
    clock.advance(6.0)
    t.apply()
    assert sum(1 for argv, _ in fake.calls if argv[0].endswith("-save")) == saves + 1


def test_the_daemons_tables_recheck_in_the_background() -> None:
    from felixpy.config import Config
    from felixpy.dataplane.wiring import KernelDeps, _default_tables

    fake = FakeIptables(default_backend="nft")
    started: list[str] = []
    deps = KernelDeps(iptables_runner=fake, ipset_runner=fake, iptables_backend="nft")
    ft = _default_tables(deps)(Config(), 4)
    for t in ft.to_apply:
        assert isinstance(t, IptablesTable)
        t._rechecks.start_background = lambda fn, name=t.name: started.append(name)  # type: ignore[misc]
        t.apply()
        t._last_read -= 10_000  # the refresh timer is due
        t.apply()
    assert started == ["raw", "mangle", "filter", "nat"]


def test_after_a_read_the_belief_shares_the_hash_caches_lists(s: Setup, backend: str) -> None:
    """Issue #17 (memory): a chain the read found as we left it keeps our list of its hashes (the hash
    cache's) rather than the read's equal copy — at the stress profile that copy is ~10 MB of strings
    held until the next read.  Pinned for a restart's first apply and for a background check's merge."""
    def shared() -> bool:
        t = s.table
        return all(t._dp_hashes[c] is t._hasher._cache[c] for c in ("cali-x", "cali-y"))

    restarted = IptablesTable("filter", 4, runner=s.runner, backend=backend,  # type: ignore[arg-type]
                              features=StaticFeatures(FEATURES), clock=s.clock.monotonic, sleep=s.clock.sleep,
                              metrics=get_metrics(CollectorRegistry()))
    restarted.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
    restarted.update_chains(chains(1))
    n = len(s.restores())
    restarted.apply()
    assert len(s.restores()) == n
    assert all(restarted._dp_hashes[c] is restarted._hasher._cache[c] for c in ("cali-x", "cali-y"))
    assert shared()
    s.due()
    s.jobs.pop()()
    s.table.apply()  # merges the background read: nothing differed
    assert shared() and len(s.restores()) == n
