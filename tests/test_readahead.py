"""A kernel read started ahead of the apply step that takes it (felixpy/drivers/readahead.py), and its two
users: the ipset driver's start-of-day ``ipset save`` and an iptables table's start-of-day save.

The background jobs are captured instead of started, so each test decides when the read runs, and what
the kernel (a stateful fake) holds at that moment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

import pytest
from prometheus_client import CollectorRegistry

from felixpy.drivers.cmdshim import CommandResult, Output
from felixpy.drivers.generictables.model import Accept, Chain, Jump, Match, Rule
from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.iptables.detect import Features, StaticFeatures
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.iptables.metrics import get_metrics
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.drivers.readahead import ReadAhead
from felixpy.testing.clock import FakeClock

Jobs = list[Callable[[], None]]


class Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, event: str, **_kw: object) -> None:
        self.warnings.append(event)


# ------------------------------------------------------------------------------ the mechanism
def test_a_read_is_taken_once_and_a_second_start_replaces_one_nobody_took() -> None:
    jobs: Jobs = []
    ahead: ReadAhead[int] = ReadAhead("x", Log(), jobs.append)
    assert ahead.take() is None  # nothing started
    ahead.start(lambda: 1)
    ahead.start(lambda: 2)
    for job in jobs:
        job()
    assert ahead.take() == 2
    assert ahead.take() is None and not ahead.started


def test_a_failed_read_or_an_unstartable_thread_leaves_the_caller_to_read_itself() -> None:
    errors: list[int] = []
    log = Log()
    jobs: Jobs = []
    ahead: ReadAhead[int] = ReadAhead("x", log, jobs.append)

    def boom() -> int:
        raise OSError("no save")
    ahead.start(boom)
    jobs.pop()()
    assert ahead.take(lambda: errors.append(1)) is None
    assert errors == [1] and len(log.warnings) == 1

    def no_thread(_fn: Callable[[], None]) -> None:
        raise RuntimeError("can't start new thread")
    refused: ReadAhead[int] = ReadAhead("x", log, no_thread)
    refused.start(lambda: 1)
    assert not refused.started and len(log.warnings) == 2


def test_a_result_nobody_took_is_discarded_done_or_when_its_read_ends() -> None:
    discarded: list[int] = []
    jobs: Jobs = []
    ahead: ReadAhead[int] = ReadAhead("x", Log(), jobs.append, discard=discarded.append)
    ahead.start(lambda: 1)
    jobs.pop()()
    ahead.start(lambda: 2)  # replaces a done read: its result is let go at once
    assert discarded == [1]
    ahead.drop()  # a running read: let go when it ends
    assert discarded == [1]
    jobs.pop()()
    assert discarded == [1, 2]
    ahead.start(lambda: 3)
    jobs.pop()()
    assert ahead.take() == 3 and discarded == [1, 2]  # a taken one is the taker's

    def boom() -> int:
        raise OSError("no read")
    ahead.start(boom)
    jobs.pop()()
    ahead.drop()  # nothing to let go of a failed read
    assert discarded == [1, 2]


def test_a_read_marked_early_is_known_as_such_until_it_is_taken_dropped_or_replaced() -> None:
    ahead: ReadAhead[str] = ReadAhead("x", Log(), lambda fn: fn())  # each read done as it starts
    ahead.mark_early()
    assert not ahead.early  # nothing held: nothing to mark
    for forget in (ahead.take, ahead.drop, lambda: ahead.start(lambda: "again")):
        ahead.start(lambda: "r")
        ahead.mark_early()
        assert ahead.early
        forget()
        assert not ahead.early


def test_the_default_runs_the_read_on_a_thread_of_its_own() -> None:
    import threading
    seen: list[str] = []
    ahead: ReadAhead[str] = ReadAhead("x", Log(), thread_name="t-ahead")
    ahead.start(lambda: seen.append(threading.current_thread().name) or "done")
    assert ahead.take() == "done" and seen == ["t-ahead"]


# ------------------------------------------------------------------------------ ipset save ahead
def ipsets(fake: FakeIPSet, jobs: Jobs, v: int = 4) -> IPSets:
    clock = FakeClock()
    d = IPSets(v, fake, clock=clock.monotonic, sleep=clock.sleep, start_background=jobs.append)  # type: ignore[arg-type]
    net = "10.0.0.0/24" if v == 4 else "fd00::/64"
    d.add_or_replace_ip_set(IPSetMetadata("s:a", IPSetType.HASH_NET, 1048576), [net])
    return d


@pytest.mark.parametrize("v", [4, 6])
def test_ipsets_start_of_day_save_runs_ahead_and_the_resync_takes_it(v: int) -> None:
    fake, jobs = FakeIPSet(), []  # type: ignore[var-annotation]
    fake.add_set(f"cali{v}0-stale", "hash:net", "inet" if v == 4 else "inet6")
    d = ipsets(fake, jobs, v)
    d.prefetch()
    assert len(jobs) == 1 and fake.commands("save") == []  # started, not run
    jobs.pop()()
    assert len(fake.commands("save")) == 1
    d.apply_updates()
    while d.apply_deletions():
        d.apply_updates()
    assert len(fake.commands("save")) == 1  # the resync took the save made ahead
    assert set(n for n in fake.sets if n.startswith(f"cali{v}")) == {f"cali{v}0s:a"}  # written and swept
    d.prefetch()
    assert jobs == []  # in sync: nothing to read ahead


class RaisesOnFirstSave:
    """The fake, except that the first ``ipset save`` cannot even start (as a failed fork)."""

    def __init__(self, fake: FakeIPSet) -> None:
        self.fake, self.raised = fake, False

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        if not self.raised and list(argv[1:2]) == ["save"]:
            self.raised = True
            raise OSError("fork failed")
        return self.fake.run(argv, stdin, while_running=while_running)


def test_ipsets_save_ahead_that_failed_is_taken_again_on_the_resyncs_own_path() -> None:
    fake, jobs = FakeIPSet(), []  # type: ignore[var-annotation]
    runner = RaisesOnFirstSave(fake)
    d = ipsets(runner, jobs)  # type: ignore[arg-type]
    d.prefetch()
    jobs.pop()()
    assert runner.raised and fake.commands("save") == []
    d.apply_updates()
    assert len(fake.commands("save")) == 1 and fake.members("cali40s:a") == {"10.0.0.0/24"}


def test_ipsets_save_ahead_not_taken_is_never_used_by_a_later_apply() -> None:
    fake, jobs = FakeIPSet(), []  # type: ignore[var-annotation]
    d = ipsets(fake, jobs)
    d.prefetch()
    jobs.pop()()  # saved: the kernel has no sets of ours yet
    fake.add_set("cali40s:a", "hash:net", "inet")  # then someone makes one, with a member we don't want
    fake.sets["cali40s:a"].members.add("10.9.9.9")
    d.prefetch()  # the next apply begins: the old save is dropped, a new one started
    jobs.pop()()
    d.apply_updates()
    # The fresh save saw the set: one write, deleting the stray member (the old one would have had it
    # created, and the kernel refuse that).
    assert len(fake.restore_inputs()) == 1 and "del cali40s:a 10.9.9.9" in fake.restore_inputs()[0]
    assert fake.members("cali40s:a") == {"10.0.0.0/24"}


class KeepsSaveOutput:
    """The fake, whose ``ipset save`` output is kept in a file (an Output over a memfd, as the real
    runner gives), counting the pieces read and the files still open."""

    def __init__(self, fake: FakeIPSet) -> None:
        self.fake, self.pieces, self.outputs = fake, 0, []  # type: ignore[var-annotation]

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        return self.fake.run(argv, stdin, while_running=while_running)

    def run_output(self, argv: Sequence[str]) -> Output:
        res = self.fake.run(argv)
        fd = os.memfd_create("test-save")
        os.write(fd, res.stdout.encode())
        runner = self

        class Counted(Output):
            def pieces(self, record: bytes, size: int = 0) -> Iterator[str]:
                for p in super().pieces(record, size or 64):
                    runner.pieces += 1
                    yield p
        out = Counted(CommandResult(res.returncode, "", res.stderr, tuple(argv)), fd)
        self.outputs.append(out)
        return out

    def open_files(self) -> int:
        return sum(out._fd is not None for out in self.outputs)


def test_ipsets_resync_reads_a_kept_save_in_pieces_and_lets_every_file_go() -> None:
    fake, jobs = FakeIPSet(), []  # type: ignore[var-annotation]
    for i in range(20):  # sets of ours the resync must read (and sweep): more than one piece of 64 bytes
        fake.add_set(f"cali40s:old{i}", "hash:net", "inet")
        fake.sets[f"cali40s:old{i}"].members.add(f"10.1.{i}.0/24")
    fake.add_set("cali40s:a", "hash:net", "inet")
    fake.sets["cali40s:a"].members.update({"10.0.0.0/24", "10.9.9.9"})
    runner = KeepsSaveOutput(fake)
    d = ipsets(runner, jobs)  # type: ignore[arg-type]
    d.prefetch()
    jobs.pop()()
    d.prefetch()  # a new apply begins before the first took its save: that one is let go
    jobs.pop()()
    assert len(runner.outputs) == 2 and runner.open_files() == 1
    d.apply_updates()
    while d.apply_deletions():
        d.apply_updates()
    assert runner.open_files() == 0 and runner.pieces > 1
    # What the pieces held was read in full: only the stray member is deleted, and every old set swept.
    assert len(fake.restore_inputs()) == 1 and "del cali40s:a 10.9.9.9" in fake.restore_inputs()[0]
    assert fake.members("cali40s:a") == {"10.0.0.0/24"}
    assert {n for n in fake.sets if n.startswith("cali4")} == {"cali40s:a"}


# ------------------------------------------------------------------------------ iptables save ahead
FEATURES = Features(SNATFullyRandom=True, MASQFullyRandom=True, RestoreSupportsLock=True, NFLogSize=True)


class Table:
    def __init__(self, backend: str, version: int = 4, fake: FakeIptables | None = None,
                 runner: Callable[[FakeIptables], object] | None = None) -> None:
        self.fake = fake or FakeIptables(default_backend=backend)
        self.jobs: Jobs = []
        self.registry = CollectorRegistry()
        self.metrics = get_metrics(self.registry)
        clock = FakeClock()
        self.table = IptablesTable("filter", version, runner=runner(self.fake) if runner else self.fake,
                                   backend=backend,  # type: ignore[arg-type]
                                   features=StaticFeatures(FEATURES), clock=clock.monotonic, sleep=clock.sleep,
                                   metrics=self.metrics, background_rechecks=True, start_background=self.jobs.append)
        self.table.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
        self.table.update_chains([Chain("cali-FORWARD", (Rule(Match().protocol("tcp"), Accept()),))])

    def saves(self) -> int:
        return sum(1 for argv, _ in self.fake.calls if argv[0].endswith("-save"))

    def restores(self) -> int:
        return sum(1 for argv, _ in self.fake.calls if argv[0].endswith("-restore"))


@pytest.mark.parametrize("backend", ["legacy", "nft"])
@pytest.mark.parametrize("version", [4, 6])
def test_a_table_not_in_sync_reads_ahead_and_its_load_takes_it(backend: str, version: int) -> None:
    t = Table(backend, version)
    t.table.prefetch()
    assert len(t.jobs) == 1 and t.saves() == 0
    t.jobs.pop()()
    assert t.saves() == 1
    t.table.apply()
    assert t.saves() == 1 and t.restores() == 1  # the load took the read ahead; one write
    assert t.fake.chain_specs("filter", "cali-FORWARD", version) != []
    t.table.prefetch()
    assert t.jobs == []  # in sync: nothing to read ahead

    # A restart against that kernel (the same fake) writes nothing, from a read made ahead.
    again = Table(backend, version, fake=t.fake)
    again.table.prefetch()
    again.jobs.pop()()
    saves, restores = again.saves(), again.restores()
    again.table.apply()
    assert again.saves() == saves and again.restores() == restores


class SaveRaisesOnce:
    """The fake, except that the first ``*-save`` cannot even start (as a failed fork)."""

    def __init__(self, fake: FakeIptables) -> None:
        self.fake, self.raised = fake, False

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        if not self.raised and argv[0].endswith("-save"):
            self.raised = True
            raise OSError("fork failed")
        return self.fake.run(argv, stdin, while_running=while_running)


def test_a_table_read_ahead_that_failed_is_counted_and_the_load_reads_again() -> None:
    t = Table("legacy", runner=SaveRaisesOnce)
    t.table.prefetch()
    t.jobs.pop()()
    t.table.apply()
    assert t.saves() == 1 and t.restores() == 1  # read again on the load's own path, then written
    assert t.fake.chain_specs("filter", "cali-FORWARD") != []
    assert t.registry.get_sample_value("felix_iptables_save_errors_total") == 1.0


def test_a_table_read_ahead_not_taken_is_replaced_by_the_next_prefetch() -> None:
    t = Table("legacy")
    t.table.prefetch()
    t.jobs.pop()()  # read: nothing of ours in the kernel
    t.fake.external_restore("*filter\n:cali-stray - [0:0]\n-A cali-stray -j ACCEPT\nCOMMIT\n")  # then a leftover
    t.table.prefetch()  # the next apply begins
    t.jobs.pop()()
    t.table.apply()
    saved = t.fake.run(["iptables-legacy-save", "-t", "filter"]).stdout
    assert "cali-FORWARD" in saved and "cali-stray" not in saved  # the fresh read saw it: swept


def test_the_loop_starts_the_ip_set_and_table_reads_before_the_managers_render() -> None:
    from felixpy.config import Config
    from felixpy.dataplane.core import InternalDataplane
    from felixpy.proto import felixbackend_pb2 as pb

    order: list[str] = []

    def started(what: str) -> Callable[[Callable[[], None]], None]:
        def start(fn: Callable[[], None]) -> None:  # the read runs at once, on the loop's thread here
            order.append(what)
            fn()
        return start
    fake = FakeIPSet()
    sets = ipsets(fake, [])
    sets._save_ahead = ReadAhead("'ipset save'", Log(), started("ipset save"))
    t = Table("legacy")
    t.table._ahead = ReadAhead("iptables-save", Log(), started("iptables save"))

    class Manager:
        def on_update(self, msg: object) -> None: ...

        def complete_deferred_work(self) -> None:
            order.append("render")

    class OtherTable:  # any PrefetchesReadBack (the nftables table's is its lister's)
        name, ip_version = "t", 4

        def prefetch(self) -> None:
            order.append("prefetch")

        def apply(self) -> None:
            order.append("table")

    dp = InternalDataplane(Config(), FakeClock())
    dp.register_manager(Manager())
    dp.register_ipsets(sets)
    dp.register_table(t.table)
    dp.register_table(OtherTable())  # type: ignore[arg-type]
    dp.set_iface_in_sync()
    dp.on_datastore_message(pb.InSync())
    dp.apply()
    assert order == ["ipset save", "iptables save", "prefetch", "render", "table"]
    assert len(fake.commands("save")) == 1 and t.saves() == 1  # each taken by its own step
    assert fake.members("cali40s:a") == {"10.0.0.0/24"} and t.fake.chain_specs("filter", "cali-FORWARD") != []


def test_the_loop_starts_the_tables_hashing_after_the_managers_and_while_the_ip_sets_are_written() -> None:
    """``HashesAhead``: once every manager's ``complete_deferred_work`` has run (nothing else updates the
    tables in this apply), each table that can starts its hashing, and the IP-set write the tables wait
    for is still running then; the tables apply after both."""
    import threading

    from felixpy.config import Config
    from felixpy.dataplane.core import InternalDataplane
    from felixpy.proto import felixbackend_pb2 as pb

    order: list[str] = []
    hashing = threading.Event()

    class Manager:
        def on_update(self, msg: object) -> None: ...

        def complete_deferred_work(self) -> None:
            order.append("render")

    class Sets:
        ip_version = 4

        def queue_resync(self) -> None: ...

        def apply_updates(self) -> None:
            if not order.count("ipsets"):  # the write started in the programming pass
                order.append("ipsets" if hashing.wait(10) else "ipsets (no hashing seen)")

        def apply_deletions(self) -> bool:
            return False

    class HashingTable:
        name, ip_version = "t", 4

        def hash_ahead(self) -> None:
            order.append("hash ahead")
            hashing.set()

        def apply(self) -> None:
            order.append("table")

    dp = InternalDataplane(Config(), FakeClock())
    dp.register_manager(Manager())
    dp.register_ipsets(Sets())  # type: ignore[arg-type]
    dp.register_table(HashingTable())  # type: ignore[arg-type]
    dp.set_iface_in_sync()
    dp.on_datastore_message(pb.InSync())
    dp.apply()
    assert order == ["render", "hash ahead", "ipsets", "table"]


class WorkerRefused:
    """The fake, recording each command; the save worker's command line fails as a broken worker would."""

    def __init__(self, fake: FakeIptables) -> None:
        self.fake, self.argvs = fake, []  # type: ignore[var-annotation]

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        self.argvs.append(list(argv))
        if "felixpy.drivers.iptables.saveworker" in argv:
            return CommandResult(1, "", "no worker here", tuple(argv))
        return self.fake.run(argv, stdin, while_running=while_running)


def test_a_read_ahead_is_sized_by_every_chain_held_not_only_the_referenced_ones() -> None:
    fake = FakeIptables(default_backend="legacy")
    runner = WorkerRefused(fake)
    jobs: Jobs = []
    clock = FakeClock()
    table = IptablesTable("filter", 4, runner=runner, backend="legacy",  # type: ignore[arg-type]
                          features=StaticFeatures(FEATURES), clock=clock.monotonic, sleep=clock.sleep,
                          metrics=get_metrics(CollectorRegistry()), background_rechecks=True,
                          start_background=jobs.append, save_worker_min_rules=20)
    # 30 rules held in chains nothing references yet (the apply's dispatch chains will).
    table.update_chains([Chain(f"cali-pi-{i}", tuple(Rule(Match().protocol("tcp"), Accept())
                                                     for _ in range(10))) for i in range(3)])
    table.prefetch()
    jobs.pop()()
    assert any("felixpy.drivers.iptables.saveworker" in a for a in runner.argvs)  # big: the worker first


def test_a_family_sharing_saves_reads_ahead_through_the_worker_whichever_table_reads_first() -> None:
    from felixpy.drivers.iptables.sharedsave import SharedSave
    fake = FakeIptables(default_backend="nft")
    runner = WorkerRefused(fake)
    shared = SharedSave(runner)  # type: ignore[arg-type]
    clock = FakeClock()
    jobs: dict[str, Jobs] = {"raw": [], "filter": []}
    tables = {name: IptablesTable(name, 4, runner=runner, backend="nft",  # type: ignore[arg-type]
                                  features=StaticFeatures(FEATURES), clock=clock.monotonic, sleep=clock.sleep,
                                  metrics=get_metrics(CollectorRegistry()), background_rechecks=True,
                                  start_background=jobs[name].append, shared_save=shared,
                                  save_worker_min_rules=20) for name in jobs}
    # The filter table holds 30 rules nothing references yet; the raw table has none.
    tables["filter"].update_chains([Chain(f"cali-pi-{i}", tuple(Rule(Match().protocol("tcp"), Accept())
                                                                for _ in range(10))) for i in range(3)])
    tables["raw"].prefetch()
    jobs["raw"].pop()()  # the raw table's read runs first: the family's dump
    assert any("felixpy.drivers.iptables.saveworker" in a for a in runner.argvs)
