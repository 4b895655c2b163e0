"""One iptables-nft-save shared by a family's tables (felixpy/drivers/iptables/sharedsave.py), on the fake."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from felixpy.drivers.cmdshim import CommandResult, SubprocessRunner, stdin_text
from felixpy.drivers.generictables.model import Accept, Chain, Jump, Match, Return, Rule
from felixpy.drivers.iptables.detect import FeatureDetector, Features, StaticFeatures
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.iptables.metrics import get_metrics
from felixpy.drivers.iptables.sharedsave import SharedSave, split_tables
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.errors import FatalDataplaneError
from felixpy.testing.clock import FakeClock

FEATURES = Features(SNATFullyRandom=True, MASQFullyRandom=True, RestoreSupportsLock=True, NFLogSize=True)
TABLES = ("raw", "mangle", "filter", "nat")
HOOK = {"raw": "PREROUTING", "mangle": "PREROUTING", "filter": "FORWARD", "nat": "POSTROUTING"}


def program(t: IptablesTable) -> None:
    top = f"cali-{HOOK[t.name]}"
    t.insert_or_append_rules(HOOK[t.name], [Rule(action=Jump(top))])
    net = "fd00::/8" if t.ip_version == 6 else "10.0.0.0/8"
    t.update_chains([Chain(top, (Rule(Match().protocol("tcp"), Jump(f"cali-{t.name}-x")), Rule(action=Return()))),
                     Chain(f"cali-{t.name}-x", (Rule(Match().source_net(net), Accept()),))])


def make(runner: object, name: str, shared: SharedSave | None, clock: FakeClock, backend: str = "nft",
         registry: CollectorRegistry | None = None) -> IptablesTable:
    return IptablesTable(name, 4, runner=runner, backend=backend, features=StaticFeatures(FEATURES),  # type: ignore[arg-type]
                         clock=clock.monotonic, sleep=clock.sleep, shared_save=shared,
                         metrics=get_metrics(registry or CollectorRegistry()))


def saves(fake: FakeIptables) -> list[tuple[str, ...]]:
    return [argv for argv, _ in fake.calls if argv[0].endswith("-save")]


def full_saves(fake: FakeIptables) -> int:
    return sum(1 for a in saves(fake) if "-t" not in a)


def programmed_fake() -> FakeIptables:
    fake = FakeIptables(default_backend="nft")
    clock = FakeClock()
    for name in TABLES:
        t = make(fake, name, None, clock)
        program(t)
        t.apply()
    fake.calls.clear()
    return fake


def apply_together(tables: Sequence[IptablesTable], timeout: float = 60) -> None:
    """Every table's apply() on a thread of its own at once, as the loop's tables step runs them."""
    errors: list[BaseException] = []

    def apply(t: IptablesTable) -> None:
        try:
            t.apply()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=apply, args=(t,)) for t in tables]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout)
    assert errors == []


class GatedRunner:
    """The fake, but a full save only returns once *expected* readers have asked for their table."""

    def __init__(self, fake: FakeIptables, expected: int) -> None:
        self.fake, self.expected = fake, expected
        self.arrived: list[str] = []
        self.cond = threading.Condition()

    def arrive(self, table: str) -> None:
        with self.cond:
            self.arrived.append(table)
            self.cond.notify_all()

    def run(self, argv: Sequence[str], stdin: str | Sequence[str] | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        if argv[0].endswith("-save") and "-t" not in argv:
            with self.cond:
                assert self.cond.wait_for(lambda: len(self.arrived) >= self.expected, timeout=30)
        return self.fake.run(argv, stdin, while_running=while_running)


class ArrivalShared(SharedSave):
    """Tells the gated runner when a table has asked (before the call can join or lead a dump)."""

    def __init__(self, runner: GatedRunner) -> None:
        super().__init__(runner)
        self.gate = runner

    def read(self, save_cmd: str, table: str, not_before: int,
             while_running: Callable[[], None] | None = None, *,
             parse: Callable[[list[str]], list[str]] | None = None) -> tuple[Any, bool]:
        self.gate.arrive(table)
        return super().read(save_cmd, table, not_before, while_running, parse=parse)


# ------------------------------------------------------------------------------ splitting
def test_each_section_is_what_the_tables_own_save_prints() -> None:
    fake = programmed_fake()
    full = fake.run(["iptables-nft-save"]).stdout
    sections = split_tables(full)
    assert set(sections) == set(TABLES)
    for name in TABLES:
        own = fake.run(["iptables-nft-save", "-t", name]).stdout
        assert sections[name] == "".join(ln + "\n" for ln in own.splitlines() if not ln.startswith("#"))


def test_an_incompatible_table_keeps_its_error_line() -> None:
    text = ("# Generated\n*raw\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n# Completed\n"
            "# Table `filter' is incompatible, use 'nft' tool.\n")
    assert split_tables(text) == {"raw": "*raw\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n",
                                  "filter": "# Table `filter' is incompatible, use 'nft' tool.\n"}


# ------------------------------------------------------------------------------ sharing
def test_four_tables_reading_together_run_one_save_and_each_reads_its_own_table() -> None:
    fake = programmed_fake()
    gate = GatedRunner(fake, expected=len(TABLES))
    shared = ArrivalShared(gate)
    clock = FakeClock()
    tables = [make(gate, name, shared, clock) for name in TABLES]
    for t in tables:
        program(t)  # a restart: the same desired state, nothing to write
    apply_together(tables)
    assert saves(fake) == [("iptables-nft-save",)] and shared.dumps == 1
    assert fake.restore_count() == 0  # every table found itself in sync from its section
    for t in tables:
        assert t.in_sync
        assert t.dataplane_hashes()[f"cali-{t.name}-x"] == t.expected_hashes(f"cali-{t.name}-x")


def test_a_table_that_wrote_after_the_dump_started_does_not_join_it() -> None:
    outputs = iter(["*filter\n:A - [0:0]\nCOMMIT\n", "*filter\n:B - [0:0]\nCOMMIT\n"])
    started, release = threading.Event(), threading.Event()

    class Runner:
        def run(self, argv: Sequence[str], stdin: str | Sequence[str] | None = None, *,
                while_running: Callable[[], None] | None = None) -> CommandResult:
            out = next(outputs)
            if out.startswith("*filter\n:A"):
                started.set()
                assert release.wait(30)
            return CommandResult(0, out, "", tuple(argv))

    shared = SharedSave(Runner())
    first: list[str | None] = []
    th = threading.Thread(target=lambda: first.append(shared.read("iptables-nft-save", "filter", 0)[0]))
    th.start()
    assert started.wait(30)
    stamp = shared.stamp()  # filter wrote while the first dump was running
    second, ran = shared.read("iptables-nft-save", "filter", stamp)
    release.set()
    th.join(30)
    assert ran and second == "*filter\n:B - [0:0]\nCOMMIT\n"  # its own, later dump
    assert first == ["*filter\n:A - [0:0]\nCOMMIT\n"] and shared.dumps == 2


def test_a_finished_dump_is_never_handed_out_again() -> None:
    fake = programmed_fake()
    shared = SharedSave(fake)
    assert shared.read("iptables-nft-save", "raw", 0)[1]
    assert shared.read("iptables-nft-save", "raw", 0)[1]  # a new dump, not the old text
    assert full_saves(fake) == 2


def test_a_failed_dump_falls_back_to_the_tables_own_read() -> None:
    fake = programmed_fake()
    fake.fail_next_saves = 1
    shared = SharedSave(fake)
    t = make(fake, "filter", shared, FakeClock())
    program(t)
    t.apply()
    assert saves(fake) == [("iptables-nft-save",), ("iptables-nft-save", "-t", "filter")]
    assert t.in_sync and fake.restore_count() == 0


def test_a_table_missing_from_the_dump_reads_alone() -> None:
    """iptables-nft leaves a table that does not exist yet out of a full save (``-t`` prints its
    built-in chains): the first start in a fresh namespace reads each such table with ``-t``."""
    fake = FakeIptables(default_backend="nft")
    shared = SharedSave(fake)
    t = make(fake, "nat", shared, FakeClock())
    program(t)
    t.apply()
    assert saves(fake) == [("iptables-nft-save",), ("iptables-nft-save", "-t", "nat")]
    assert fake.chain_specs("nat", "cali-POSTROUTING")  # programmed


def test_an_incompatible_table_is_still_fatal_through_the_shared_dump() -> None:
    fake = programmed_fake()
    fake.nft_incompatible = True
    t = make(fake, "filter", SharedSave(fake), FakeClock())
    program(t)
    with pytest.raises(FatalDataplaneError):
        t.apply()
    assert fake.restore_count() == 0


def test_save_calls_count_processes_not_tables() -> None:
    fake = programmed_fake()
    registry = CollectorRegistry()
    gate = GatedRunner(fake, expected=2)
    shared = ArrivalShared(gate)
    clock = FakeClock()
    tables = [make(gate, name, shared, clock, registry=registry) for name in ("raw", "nat")]
    for t in tables:
        program(t)
    apply_together(tables)
    assert registry.get_sample_value("felix_iptables_save_calls_total") == 1


def test_legacy_tables_never_share() -> None:
    """Legacy reads each table's own blob: a full save would cost every table the filter table's."""
    fake = FakeIptables(default_backend="legacy")
    shared = SharedSave(fake)
    t = make(fake, "filter", shared, FakeClock(), backend="legacy")
    program(t)
    t.apply()
    assert shared.dumps == 0 and saves(fake) == [("iptables-legacy-save", "-t", "filter")]


# ------------------------------------------------------------------------------ wiring
@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize("ip_version", [4, 6])
def test_the_daemons_tables_share_a_dump_per_family_only_on_nft(backend: str, ip_version: int) -> None:
    from felixpy.config import Config
    from felixpy.dataplane.wiring import KernelDeps, _default_tables

    fake = FakeIptables(default_backend=backend)
    deps = KernelDeps(iptables_runner=fake, ipset_runner=fake, iptables_backend=backend)
    ft = _default_tables(deps)(Config(Ipv6Support=True), ip_version)
    for t in ft.to_apply:
        assert isinstance(t, IptablesTable)
        t.apply()
    six = "6" if ip_version == 6 else ""
    tool = f"ip{six}tables-{backend}-save"
    got = saves(fake)
    if backend == "nft":
        # Applied one after another, each table leads its own dump; the nat/mangle/raw tables the
        # fresh fake does not hold yet are then read with -t.
        assert got.count((tool,)) == len(ft.to_apply)
    else:
        assert (tool,) not in got and len(got) == len(ft.to_apply)


# ------------------------------------------------------------------------------ kernel
class RecordingRunner(SubprocessRunner):
    def __init__(self, netns: str) -> None:
        super().__init__(netns=netns)
        self.calls: list[tuple[tuple[str, ...], str | None]] = []

    def run(self, argv: Sequence[str], stdin: str | Sequence[str] | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        self.calls.append((tuple(argv), stdin_text(stdin)))
        return super().run(argv, stdin, while_running=while_running)


@pytest.mark.kernel
@pytest.mark.skipif(os.geteuid() != 0, reason="kernel tests need root")
@pytest.mark.parametrize("ip_version", [4, 6])
def test_kernel_restart_of_four_nft_tables_reads_them_with_one_save(netns: str, ip_version: int) -> None:
    """Real iptables-nft in a throwaway namespace: the sections of one full save are each table's own
    read — after a start of day, a restart reading all four at once through one dump finds every
    table in sync and writes nothing."""
    runner = SubprocessRunner(netns=netns)
    clock = FakeClock()
    features = StaticFeatures(FeatureDetector(runner).get_features())
    first = [IptablesTable(n, ip_version, runner=runner, backend="nft", features=features,
                           clock=clock.monotonic, sleep=clock.sleep, shared_save=SharedSave(runner))
             for n in TABLES]
    for t in first:
        program(t)
        t.apply()
    recording = RecordingRunner(netns)
    gate = GatedRunner(recording, expected=len(TABLES))  # type: ignore[arg-type]
    shared = ArrivalShared(gate)
    second = [IptablesTable(n, ip_version, runner=gate, backend="nft",  # type: ignore[arg-type]
                            features=features, clock=clock.monotonic,
                            sleep=clock.sleep, shared_save=shared) for n in TABLES]
    for t in second:
        program(t)
    apply_together(second)
    six = "6" if ip_version == 6 else ""
    assert [argv for argv, _ in recording.calls] == [(first[0].save_cmd,)]
    assert first[0].save_cmd.endswith(f"ip{six}tables-nft-save")
    for t in second:
        assert t.in_sync
        assert t.dataplane_hashes()[f"cali-{t.name}-x"] == t.expected_hashes(f"cali-{t.name}-x")
