"""The save worker (felixpy/drivers/iptables/saveworker.py): a child that saves and parses a big table.

On the fake, the worker's command line is answered in process by the worker's own report function over the
fake's save, so these tests pin what the table sends and does with the answer; the module's ``main`` runs
for real over a stand-in save command; and in a throwaway namespace the real child reads real iptables.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from felixpy.drivers.cmdshim import CommandResult, SubprocessRunner
from felixpy.drivers.iptables import saveworker
from felixpy.drivers.iptables.detect import FeatureDetector, StaticFeatures
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.iptables.metrics import get_metrics
from felixpy.drivers.iptables.savefile import (
    SaveParseError,
    SaveState,
    hash_comment_regex,
    old_insert_regex,
    owned_chain_regex,
    parse_save,
)
from felixpy.drivers.iptables.savefile import split_tables
from felixpy.drivers.iptables.sharedsave import SharedSave
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.drivers.generictables.model import Accept, Chain, Match, Rule
from felixpy.errors import FatalDataplaneError
from felixpy.testing.clock import FakeClock
from test_ipt_sharedsave import FEATURES, TABLES, program, programmed_fake

SETTINGS = {"hash_prefix": "cali:", "owned_prefixes": ("cali-",), "extra_cleanup_regex": ""}


def in_process(text: str) -> dict[str, object]:
    st = parse_save(text, hash_re=hash_comment_regex("cali:"), owned_re=owned_chain_regex(("cali-",)),
                    old_insert_re=old_insert_regex(("cali-",)))
    return {"hashes": st.hashes, "full": st.full_rules}


class WorkerOnFake:
    """The fake tools, with the save worker's command line answered as the child would answer it."""

    def __init__(self, fake: FakeIptables) -> None:
        self.fake = fake
        self.worker_runs: list[tuple[str, ...]] = []  # the save argv each worker run was given
        self.fail_worker = False  # the save fails (the worker passes that on: exit 3)
        self.crash_worker = False  # the worker itself breaks (a traceback, exit 1)

    def run(self, argv: Sequence[str], stdin: str | Sequence[str] | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        if list(argv[1:3]) == ["-m", saveworker.MODULE]:
            save = tuple(argv[list(argv).index("--") + 1:])
            self.worker_runs.append(save)
            if while_running is not None:
                while_running()
            if self.crash_worker:
                return CommandResult(1, "", "Traceback (most recent call last):\nImportError: boom", tuple(argv))
            if self.fail_worker:
                return CommandResult(saveworker.EXIT_SAVE_FAILED, "", '{"returncode": 4}', tuple(argv))
            res = self.fake.run(save)
            if not res.ok:
                return CommandResult(saveworker.EXIT_SAVE_FAILED, "", res.stderr, tuple(argv))
            table = save[save.index("-t") + 1] if "-t" in save else None
            out = saveworker.report(res.stdout, table, **SETTINGS)  # type: ignore[arg-type]
            return CommandResult(0, saveworker.encode_report(out), "", tuple(argv))
        return self.fake.run(argv, stdin, while_running=while_running)


def table(runner: object, name: str = "filter", *, min_rules: int = 1, backend: str = "legacy",
          shared: SharedSave | None = None) -> IptablesTable:
    clock = FakeClock()
    return IptablesTable(name, 4, runner=runner, backend=backend, features=StaticFeatures(FEATURES),  # type: ignore[arg-type]
                         clock=clock.monotonic, sleep=clock.sleep, metrics=get_metrics(CollectorRegistry()),
                         owned_prefixes=("cali-",), shared_save=shared, save_worker_min_rules=min_rules)


def restores(fake: FakeIptables) -> list[str]:
    return [i or "" for argv, i in fake.calls if argv[0].endswith("-restore")]


# ---------------------------------------------------------------------- the report
def test_the_report_of_each_table_is_what_the_daemon_would_parse() -> None:
    fake = programmed_fake()
    full = fake.run(["iptables-nft-save"]).stdout
    got = saveworker.report(full, None, **SETTINGS)  # type: ignore[arg-type]
    assert set(got) == set(TABLES)
    for name, section in split_tables(full).items():
        assert got[name] == in_process(section)
        wire = saveworker.parse_output(saveworker.encode_report(got))[name]
        decoded = saveworker.state_from_wire(wire)
        assert (decoded.hashes, decoded.full_rules) == (got[name]["hashes"], got[name]["full"])
    own = fake.run(["iptables-nft-save", "-t", "filter"]).stdout
    assert saveworker.report(own, "filter", **SETTINGS) == {"filter": in_process(own)}  # type: ignore[arg-type]


def test_a_refused_table_and_a_torn_report_are_parse_errors() -> None:
    text = "*raw\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n# Table `filter' is incompatible, use 'nft' tool.\n"
    got = saveworker.report(text, None, **SETTINGS)  # type: ignore[arg-type]
    assert "error" in got["filter"] and "hashes" in got["raw"]  # type: ignore[operator]
    wire = saveworker.encode_report(got)
    with pytest.raises(SaveParseError, match="incompatible"):
        saveworker.state_from_wire(saveworker.parse_output(wire)["filter"])
    assert saveworker.state_from_wire(saveworker.parse_output(wire)["raw"]).hashes == {"PREROUTING": []}
    for cut in range(len(wire) - 1):  # a report cut short anywhere is refused whole
        with pytest.raises(SaveParseError):
            saveworker.parse_output(wire[:cut])
    with pytest.raises(SaveParseError):
        saveworker.state_from_wire({"hashes": {}})
    for line in ('["h","cali-x",["abc"]', '["h","cali-x"]', '["x","cali-x",[]]', '["h",1,[]]', '{"h":1}'):
        with pytest.raises(SaveParseError):  # torn or not a chain line
            saveworker.state_from_wire(saveworker.WireTable(line + "\n", 0, len(line)))


def test_chains_are_batched_into_lines_and_decode_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(saveworker, "LINE_ITEMS", 3)
    hashes = {"cali-a": ["h1", "h2"], "cali-b": ["h3", "", "h4", "h5"], "cali-c": [], "cali-d": ["h6"]}
    full = {"FORWARD": ["-", "-A FORWARD -j cali-FORWARD"]}
    wire = saveworker.encode_report({"filter": {"hashes": hashes, "full": full}})
    assert wire.count("\n") == 6  # header, a, b (over a line: its own), c d, f, end
    known = {"cali-a": ["h1", "h2"], "cali-b": ["h3", "", "h4", "h5x"]}
    state = saveworker.state_from_wire(saveworker.parse_output(wire)["filter"], known.get)
    assert (state.hashes, state.full_rules) == (hashes, full)
    assert state.hashes["cali-a"] is known["cali-a"] and state.hashes["cali-b"] is not known["cali-b"]


def test_main_runs_the_save_and_prints_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = programmed_fake()
    own = fake.run(["iptables-nft-save", "-t", "filter"]).stdout
    saved = tmp_path / "save.txt"
    saved.write_text(own)
    stand_in = tmp_path / "fake-save"
    stand_in.write_text(f"#!/bin/sh\ncat {saved}\n")
    stand_in.chmod(0o755)
    assert saveworker.main(["--owned-prefix", "cali-", "--", str(stand_in), "-t", "filter"]) == 0
    assert capsys.readouterr().out == saveworker.encode_report({"filter": in_process(own)})
    assert saveworker.main(["--", "false"]) == saveworker.EXIT_SAVE_FAILED
    assert json.loads(capsys.readouterr().err)["returncode"] == 1


def test_main_parses_a_table_while_it_is_saved_and_the_saves_failure_still_wins(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``-t`` save is parsed as it is written (here in two parts, a pause between, the split inside a
    chain's rules); the report is the whole text's.  A save that fails after printing part of its table
    is a failed save, never a report of the part; a refused table with the save's success is the
    table's error; a full save (no ``-t``) is cut into its tables as before."""
    fake = programmed_fake()
    own = fake.run(["iptables-nft-save", "-t", "filter"]).stdout
    lines = own.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("-A ")) + 1
    (tmp_path / "a.txt").write_text("".join(lines[:first]))
    (tmp_path / "b.txt").write_text("".join(lines[first:]))

    def stand_in(name: str, body: str) -> str:
        path = tmp_path / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return str(path)

    in_parts = stand_in("in-parts", f"cat {tmp_path}/a.txt; sleep 0.2; cat {tmp_path}/b.txt\n")
    assert saveworker.main(["--owned-prefix", "cali-", "--", in_parts, "-t", "filter"]) == 0
    assert capsys.readouterr().out == saveworker.encode_report({"filter": in_process(own)})

    dies = stand_in("dies", f"cat {tmp_path}/a.txt; echo 'iptables-save: broken' >&2; exit 4\n")
    assert saveworker.main(["--", dies, "-t", "filter"]) == saveworker.EXIT_SAVE_FAILED
    got = capsys.readouterr()
    assert got.out == "" and json.loads(got.err) == {"returncode": 4, "stderr": "iptables-save: broken\n"}

    refused = stand_in("refused", "echo \"# Table \\`filter' is incompatible, use 'nft' tool.\"; cat "
                       f"{tmp_path}/b.txt\n")
    assert saveworker.main(["--", refused, "-t", "filter"]) == 0
    report = saveworker.parse_output(capsys.readouterr().out)
    with pytest.raises(SaveParseError, match="incompatible"):
        saveworker.state_from_wire(report["filter"])

    full = fake.run(["iptables-nft-save"]).stdout
    (tmp_path / "full.txt").write_text(full)
    whole = stand_in("whole", f"cat {tmp_path}/full.txt\n")
    assert saveworker.main(["--owned-prefix", "cali-", "--", whole]) == 0
    assert capsys.readouterr().out == saveworker.encode_report(
        {name: in_process(section) for name, section in split_tables(full).items()})


# ---------------------------------------------------------------------- the table
def test_a_big_table_reads_through_the_worker_and_a_restart_rewrites_nothing() -> None:
    fake = FakeIptables(default_backend="legacy")
    runner = WorkerOnFake(fake)
    first = table(runner)
    program(first)
    first.apply()
    assert runner.worker_runs == [("iptables-legacy-save", "-t", "filter")]
    assert first.in_sync and len(restores(fake)) == 1
    second = table(runner)
    program(second)
    second.apply()
    assert len(runner.worker_runs) == 2 and len(restores(fake)) == 1  # in sync from the worker's read
    fake.external_restore("*filter\n-F cali-filter-x\nCOMMIT\n")  # drift: seen through the worker too
    second.invalidate_dataplane_cache("test")
    second.apply()
    assert len(restores(fake)) == 2 and fake.chain_specs("filter", "cali-filter-x")


def test_a_restart_through_the_worker_holds_one_list_of_hashes_per_unchanged_chain() -> None:
    """What decoding the report a chain at a time is for: a chain the save shows as expected keeps the
    table's own list (the hash cache's), no decoded copy beside it; a drifted chain keeps what the save
    says, and rewriting it later never changes the shared list in place."""
    fake = FakeIptables(default_backend="legacy")
    runner = WorkerOnFake(fake)
    first = table(runner)
    program(first)
    first.apply()
    fake.external_restore("*filter\n-A cali-FORWARD -j ACCEPT\nCOMMIT\n")  # drift in one chain only
    second = table(runner)
    program(second)
    read: dict[str, list[str]] = {}
    reconcile = second._reconcile

    def spy(state: SaveState, *args: object) -> None:
        read.update(state.hashes)  # the read as the table first gets it, before the apply compares
        reconcile(state, *args)  # type: ignore[arg-type]

    second._reconcile = spy  # type: ignore[method-assign]
    second.apply()
    assert len(runner.worker_runs) == 2
    kept, drifted = "cali-filter-x", "cali-FORWARD"
    shared = read[kept]
    assert shared is second._hasher._cache[kept]  # one list for the read-back and the expectation
    assert read[drifted] != second.expected_hashes(drifted)
    assert second._dp_hashes[kept] is shared
    assert second.dataplane_hashes()[drifted] == second.expected_hashes(drifted)  # rewritten
    before = list(shared)
    second.update_chains([Chain(kept, (Rule(Match().source_net("10.1.0.0/16"), Accept()),))])
    second.apply()
    assert shared == before  # the new hashes are a new list
    assert second.dataplane_hashes()[kept] == second.expected_hashes(kept) != before


def test_a_read_before_insync_through_the_worker_is_decoded_when_taken_into_the_lists_hashed_by_then() -> None:
    """A big table's read before InSync (prefetch_before_insync) ends before its apply hashes anything: the
    worker's report is kept undecoded until the load takes it, so unchanged chains still hold one list for
    the read-back and the expectation.  A report that will not decode is a failed read ahead: counted, and
    read again on the apply path."""
    fake = FakeIptables(default_backend="legacy")
    runner = WorkerOnFake(fake)
    first = table(runner)
    program(first)
    first.apply()
    for torn in (False, True):
        jobs: list[Callable[[], None]] = []
        clock = FakeClock()
        registry = CollectorRegistry()
        second = IptablesTable("filter", 4, runner=runner, backend="legacy",  # type: ignore[arg-type]
                               features=StaticFeatures(FEATURES), clock=clock.monotonic, sleep=clock.sleep,
                               metrics=get_metrics(registry), owned_prefixes=("cali-",), save_worker_min_rules=1,
                               background_rechecks=True, start_background=jobs.append)
        program(second)
        assert second.prefetch_before_insync()
        jobs.pop()()
        runs = len(runner.worker_runs)
        if torn:
            got = second._ahead._fut.result()  # type: ignore[union-attr]
            assert isinstance(got, saveworker.WireTable)  # kept undecoded
            cut: Future[object] = Future()
            cut.set_result(dataclasses.replace(got, end=got.start + 1))  # as if cut inside a chain
            second._ahead._fut = cut  # type: ignore[assignment]
        second.apply()
        assert len(restores(fake)) == 1  # nothing to write either way
        if not torn:
            assert len(runner.worker_runs) == runs  # taken, not read again
            kept = "cali-filter-x"
            assert second._dp_hashes[kept] is second._hasher._cache[kept]
            assert registry.get_sample_value("felix_iptables_save_errors_total") == 0.0
        else:
            assert len(runner.worker_runs) == runs + 1  # read again on the apply path
            assert registry.get_sample_value("felix_iptables_save_errors_total") == 1.0


def test_a_small_table_parses_in_process_and_a_failed_worker_is_retried() -> None:
    fake = FakeIptables(default_backend="legacy")
    runner = WorkerOnFake(fake)
    small = table(runner, min_rules=1_000)
    program(small)
    small.apply()
    assert runner.worker_runs == [] and small.in_sync
    big = table(runner)
    program(big)
    runner.fail_worker = True
    with pytest.raises(FatalDataplaneError):
        big.apply()  # every retry failed: fatal, as a failing save is
    runner.fail_worker = False
    big.apply()
    assert big.in_sync and len(runner.worker_runs) > 2


@pytest.mark.parametrize("backend", ["legacy", "nft"])
def test_a_broken_worker_leaves_the_read_to_the_daemon(backend: str) -> None:
    """The worker cannot start or crashes (not the save failing): the kernel is fine, so the table reads and
    parses in the daemon, logs the error, and programs as usual — no retries into a fatal exit."""
    import structlog

    fake = programmed_fake() if backend == "nft" else FakeIptables(default_backend="legacy")
    runner = WorkerOnFake(fake)
    runner.crash_worker = True
    shared = SharedSave(runner) if backend == "nft" else None  # type: ignore[arg-type]
    t = table(runner, "filter", backend=backend, shared=shared)
    program(t)
    with structlog.testing.capture_logs() as logs:
        t.apply()
    assert t.in_sync and fake.chain_specs("filter", "cali-filter-x")
    assert t.dataplane_hashes()["cali-filter-x"] == t.expected_hashes("cali-filter-x")
    assert any(e["event"] == "iptables save worker failed; reading in the daemon" for e in logs)
    assert runner.worker_runs  # it was tried
    assert any(argv[0].endswith("-save") for argv, _ in fake.calls)  # then the daemon's own save


def test_a_family_sharing_saves_goes_by_its_total_size() -> None:
    """iptables-nft: the dump is every table's, so a small table's read goes through the worker when the
    family is big, and each table takes its own part of the worker's report (a restart: nothing to write)."""
    fake = programmed_fake()
    runner = WorkerOnFake(fake)
    shared = SharedSave(runner)  # type: ignore[arg-type]
    tables = [table(runner, n, min_rules=6, backend="nft", shared=shared) for n in TABLES]
    for t in tables:
        program(t)  # three rules each: 12 in the family, 3 in any one table
    tables[0].apply()
    assert runner.worker_runs == [("iptables-nft-save",)]
    for t in tables[1:]:
        t.apply()
    assert runner.worker_runs == [("iptables-nft-save",)] * len(TABLES)  # applied one by one: a dump each
    assert restores(fake) == []
    for t in tables:
        assert t.in_sync
        assert t.dataplane_hashes()[f"cali-{t.name}-x"] == t.expected_hashes(f"cali-{t.name}-x")
    alone = table(runner, "filter", min_rules=100, backend="nft", shared=SharedSave(runner))  # type: ignore[arg-type]
    program(alone)
    alone.apply()
    assert len(runner.worker_runs) == len(TABLES)  # a small family: parsed in the daemon


# ---------------------------------------------------------------------- kernel
@pytest.mark.kernel
@pytest.mark.skipif(os.geteuid() != 0, reason="kernel tests need root")
@pytest.mark.parametrize("backend", ["legacy", "nft"])
@pytest.mark.parametrize("ip_version", [4, 6])
def test_kernel_the_worker_reads_what_the_table_wrote(netns: str, backend: str, ip_version: int) -> None:
    """The real child, in a throwaway namespace: a table restarted over what its predecessor wrote reads it
    back through the worker and writes nothing."""
    runner = SubprocessRunner(netns=netns)
    clock = FakeClock()
    features = StaticFeatures(FeatureDetector(runner).get_features())

    def make(min_rules: int, r: object) -> IptablesTable:
        return IptablesTable("filter", ip_version, runner=r, backend=backend, features=features,  # type: ignore[arg-type]
                             clock=clock.monotonic, sleep=clock.sleep, save_worker_min_rules=min_rules,
                             save_worker_python=sys.executable)

    first = make(0, runner)
    program(first)
    first.apply()
    calls: list[tuple[str, ...]] = []

    class Recording(SubprocessRunner):
        def run(self, argv: Sequence[str], stdin: str | Sequence[str] | None = None, *,
                while_running: Callable[[], None] | None = None) -> CommandResult:
            calls.append(tuple(argv))
            return super().run(argv, stdin, while_running=while_running)

    second = make(1, Recording(netns=netns))
    program(second)
    second.apply()
    assert second.in_sync
    assert [c[1:3] for c in calls] == [("-m", saveworker.MODULE)]  # one read, through the worker; no restore
    assert second.dataplane_hashes()["cali-filter-x"] == second.expected_hashes("cali-filter-x")


@pytest.mark.kernel
@pytest.mark.skipif(os.geteuid() != 0, reason="kernel tests need root")
@pytest.mark.parametrize("backend", ["legacy", "nft"])
@pytest.mark.parametrize("ip_version", [4, 6])
def test_kernel_a_read_before_insync_then_a_flush_is_repaired_by_the_check_after_the_apply(
        netns: str, backend: str, ip_version: int) -> None:
    """The restart of a big table (PrefetchesBeforeInSync) in a throwaway namespace, the real worker and
    tools: the read runs before InSync, another writer flushes one of our chains before the apply, the
    apply takes the read and writes nothing, and the background read it starts lets the next apply put the
    chain back."""
    runner = SubprocessRunner(netns=netns)
    clock = FakeClock()
    features = StaticFeatures(FeatureDetector(runner).get_features())
    first = IptablesTable("filter", ip_version, runner=runner, backend=backend, features=features,  # type: ignore[arg-type]
                          clock=clock.monotonic, sleep=clock.sleep)
    program(first)
    first.apply()
    want = first.dataplane_hashes()["cali-filter-x"]
    jobs: list[Callable[[], None]] = []
    second = IptablesTable("filter", ip_version, runner=runner, backend=backend, features=features,  # type: ignore[arg-type]
                           clock=clock.monotonic, sleep=clock.sleep, save_worker_min_rules=1,
                           save_worker_python=sys.executable, background_rechecks=True,
                           start_background=jobs.append)
    program(second)
    assert second.prefetch_before_insync()
    jobs.pop()()
    tool = f"ip{'6' if ip_version == 6 else ''}tables-{backend}"
    runner.run([tool, "--wait", "-t", "filter", "-F", "cali-filter-x"]).check()
    second.apply()

    def ours() -> int:
        saved = runner.run([f"{tool}-save", "-t", "filter"]).check().stdout
        return sum(1 for line in saved.splitlines() if line.startswith("-A cali-filter-x "))

    assert second.in_sync and ours() == 0  # in sync from the early read: the flush is not seen yet
    assert len(jobs) == 1  # the check of the early read
    jobs.pop()()
    clock.advance(1.0)
    second.apply()
    assert ours() == len(want) == 1  # repaired
    assert second.in_sync and second.dataplane_hashes()["cali-filter-x"] == want
