"""A big table's start-of-day read started before InSync (``PrefetchesBeforeInSync``), on the stateful fake.

The loop's ``render_ahead`` offers it once the renders have sized the tables; the first apply takes the
read instead of starting another, and, since the read is older than that apply, the table reads again in
the background once the apply is done, so that what changed in the kernel in between is repaired.  The
background jobs are captured, so each test decides when a read runs and what the kernel holds then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from felixpy.config import Config
from felixpy.dataplane.core import InternalDataplane
from felixpy.drivers.cmdshim import CommandResult
from felixpy.drivers.generictables.model import Accept, Chain, Jump, Match, Rule
from felixpy.drivers.iptables.detect import Features, StaticFeatures
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.iptables.metrics import get_metrics
from felixpy.drivers.iptables.recheck import RECHECK_POLL
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock

FEATURES = Features(SNATFullyRandom=True, MASQFullyRandom=True, RestoreSupportsLock=True, NFLogSize=True)
WORKER_MIN = 20  # rules from which a read goes through the save worker (the daemon's: 50,000)


class Recording:
    """The fake; the save worker's command line fails as a broken worker would, so the read goes on in the
    test's process (the worker itself is tested in test_ipt_saveworker.py)."""

    def __init__(self, fake: FakeIptables) -> None:
        self.fake = fake
        self.worker_runs = 0

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        if "felixpy.drivers.iptables.saveworker" in argv:
            self.worker_runs += 1
            return CommandResult(1, "", "no worker here", tuple(argv))
        return self.fake.run(argv, stdin, while_running=while_running)


def chains(version: int, n: int = 3) -> list[Chain]:
    """cali-FORWARD jumping to n chains of 10 rules: 10·n + n rules."""
    return [Chain("cali-FORWARD", tuple(Rule(action=Jump(f"cali-pi-{i}")) for i in range(n))),
            *(Chain(f"cali-pi-{i}", tuple(Rule(Match().protocol("tcp").dest_ports(1000 + j), Accept(),
                                                (f"v{version}",)) for j in range(10))) for i in range(n))]


class Node:
    """One daemon's filter table over a kernel (*fake*), with its background jobs captured."""

    def __init__(self, backend: str, version: int, fake: FakeIptables | None = None, *,
                 background_rechecks: bool = True, n: int = 3) -> None:
        self.fake = fake or FakeIptables(default_backend=backend)
        self.runner = Recording(self.fake)
        self.clock = FakeClock()
        self.jobs: list[Callable[[], None]] = []
        self.version = version
        self.table = IptablesTable("filter", version, runner=self.runner, backend=backend,  # type: ignore[arg-type]
                                   features=StaticFeatures(FEATURES), clock=self.clock.monotonic,
                                   sleep=self.clock.sleep, metrics=get_metrics(CollectorRegistry()),
                                   background_rechecks=background_rechecks, start_background=self.jobs.append,
                                   save_worker_min_rules=WORKER_MIN)
        self.table.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
        self.table.update_chains(chains(version, n))

    def saves(self) -> int:
        return sum(1 for argv, _ in self.fake.calls if argv[0].endswith("-save"))

    def restores(self) -> int:
        return sum(1 for argv, _ in self.fake.calls if argv[0].endswith("-restore"))

    def specs(self, chain: str) -> list[str]:
        return self.fake.chain_specs("filter", chain, self.version)


@pytest.fixture(params=["legacy", "nft"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=[4, 6])
def version(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def drift_repairs() -> float:
    return REGISTRY.get_sample_value("felixpy_drift_repairs_total", {"kind": "rule"}) or 0.0


def test_a_big_table_reads_before_insync_and_its_first_apply_takes_that_read(backend: str, version: int) -> None:
    node = Node(backend, version)
    assert node.table.prefetch_before_insync()
    assert len(node.jobs) == 1 and node.saves() == 0
    node.jobs.pop()()  # the read runs while the feed still arrives
    assert node.saves() == 1 and node.runner.worker_runs == 1  # big: offered to the worker first
    node.table.apply()
    assert node.saves() == 1 and node.restores() == 1  # taken, not read again; then written
    assert node.specs("cali-pi-2") != []
    assert node.jobs == []  # it wrote: its post-write checks re-read, no extra read now


def test_a_restart_from_a_read_before_insync_writes_nothing_then_repairs_what_changed_since(
        backend: str, version: int) -> None:
    first = Node(backend, version)
    first.table.apply()
    want = first.specs("cali-pi-1")

    node = Node(backend, version, fake=first.fake)  # the restart, against the kernel the first one left
    assert node.table.prefetch_before_insync()
    node.jobs.pop()()
    node.fake.external_restore("*filter\n-F cali-pi-1\nCOMMIT\n", version)  # someone flushes a chain before InSync
    saves, restores, repairs = node.saves(), node.restores(), drift_repairs()
    resched = node.table.apply()
    assert node.saves() == saves and node.restores() == restores  # in sync from the early read: no write
    assert len(node.jobs) == 1 and resched is not None and resched <= RECHECK_POLL  # but a read is due
    node.jobs.pop()()  # the background read sees the flush
    node.clock.advance(RECHECK_POLL)
    node.table.apply()
    assert node.specs("cali-pi-1") == want and node.table.in_sync
    assert drift_repairs() == repairs + 10  # its 10 rules, counted as drift
    node.table.apply()
    assert node.jobs == []  # checked once, not at every apply


def test_a_small_table_is_read_by_its_first_apply(backend: str) -> None:
    node = Node(backend, 4, n=1)  # 11 rules: under the worker's threshold, quick to read after InSync
    assert not node.table.prefetch_before_insync()
    assert node.jobs == [] and node.saves() == 0
    node.table.apply()
    assert node.saves() == 1 and node.restores() == 1


def test_no_read_before_insync_without_background_rechecks_or_when_in_sync(backend: str) -> None:
    node = Node(backend, 4, background_rechecks=False)
    assert not node.table.prefetch_before_insync() and node.jobs == []
    synced = Node(backend, 4)
    synced.table.apply()
    assert not synced.table.prefetch_before_insync() and synced.jobs == []


class Tbl:
    """A table for the loop: records what the loop asks of it."""

    def __init__(self, name: str, order: list[str], early: bool) -> None:
        self.name, self.ip_version, self.order, self.early = name, 4, order, early

    def prefetch_before_insync(self) -> bool:
        self.order.append(f"{self.name}: before InSync")
        return self.early

    def prefetch(self) -> None:
        self.order.append(f"{self.name}: prefetch")

    def hash_ahead(self) -> None:
        self.order.append(f"{self.name}: hash ahead")

    def apply(self) -> None:
        self.order.append(f"{self.name}: apply")


def test_the_loop_offers_the_read_after_rendering_ahead_and_its_first_apply_does_not_start_another() -> None:
    order: list[str] = []

    class Manager:
        def on_update(self, msg: object) -> None: ...

        def render_ahead(self) -> None:
            order.append("render ahead")

        def complete_deferred_work(self) -> None: ...

    big, small = Tbl("big", order, early=True), Tbl("small", order, early=False)
    dp = InternalDataplane(Config(), FakeClock())
    dp.register_manager(Manager())
    dp.register_table(big)  # type: ignore[arg-type]
    dp.register_table(small)  # type: ignore[arg-type]
    dp.set_iface_in_sync()
    dp.on_datastore_message(pb.ConfigUpdate())
    dp.maybe_apply()  # before InSync: renders ahead, offers the early read, hashes the early reader's chains
    assert order == ["render ahead", "big: before InSync", "small: before InSync", "big: hash ahead"]
    dp.on_datastore_message(pb.ConfigUpdate())
    dp.maybe_apply()  # more of the feed: the big table keeps its read; the small one is asked again
    assert order[4:] == ["render ahead", "small: before InSync", "big: hash ahead"]
    del order[:]
    dp.on_datastore_message(pb.InSync())
    dp.maybe_apply()
    # The big table's read is taken as is; every table hashes what the apply's managers changed.
    assert order == ["small: prefetch", "big: hash ahead", "small: hash ahead", "big: apply", "small: apply"]
    del order[:]
    dp.needs_sync = True
    dp.apply()
    assert order == ["big: prefetch", "small: prefetch", "big: hash ahead", "small: hash ahead", "big: apply",
                     "small: apply"]  # later applies as before


class CountingFeatures(StaticFeatures):
    def __init__(self) -> None:
        super().__init__(FEATURES)
        self.refreshes = 0

    def refresh_features(self) -> None:
        self.refreshes += 1


def test_a_read_ahead_refreshes_the_features_so_the_load_need_not() -> None:
    """The load starts with a features' refresh (an ``iptables --version`` child); a read ahead does it on
    its own thread instead, so the load that takes the read skips it.  A load without one refreshes."""
    for ahead in (True, False):
        node = Node("legacy", 4)
        features = CountingFeatures()
        node.table._features = features
        if ahead:
            assert node.table.prefetch_before_insync()
            assert features.refreshes == 0
            node.jobs.pop()()
            assert features.refreshes == 1
        node.table.apply()
        assert features.refreshes == 1 and node.table.in_sync


def test_before_insync_a_table_hashes_the_chains_it_will_program_and_not_those_nothing_references(
        backend: str, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before InSync the managers' ``render_ahead`` has built the dispatch chains, so the endpoints' chains
    are referenced: hashing ahead hashes them, and the apply renders and hashes none of their rules again.
    A chain nothing references (a policy's in raw or mangle, which hold every policy's chains) is never
    compared, so it is not hashed, ahead or by the apply: its hashes would be held for nothing."""
    from felixpy.drivers.iptables import render

    def tw_a() -> Chain:
        return Chain("cali-tw-a", tuple(Rule(Match().protocol("udp").dest_ports(53 + i), Accept()) for i in range(10)))

    def unused() -> Chain:
        return Chain("cali-pi-unused", tuple(Rule(Match().protocol("tcp").dest_ports(80 + i), Accept())
                                             for i in range(10)))

    first = Node(backend, version)
    first.table.update_chains([Chain("cali-dispatch", (Rule(action=Jump("cali-tw-a")),)), tw_a(), unused()])
    first.table.insert_or_append_rules("INPUT", [Rule(action=Jump("cali-dispatch"))])
    first.table.apply()

    node = Node(backend, version, fake=first.fake)  # the restart, as render_ahead leaves it
    node.table.update_chains([tw_a(), unused(), Chain("cali-dispatch", (Rule(action=Jump("cali-tw-a")),))])
    node.table.insert_or_append_rules("INPUT", [Rule(action=Jump("cali-dispatch"))])
    assert node.table.prefetch_before_insync()
    node.table.hash_ahead()
    node.table._hasher.finish()
    assert node.table._hasher.cached("cali-tw-a") is not None
    assert node.table._hasher.cached("cali-pi-unused") is None
    node.jobs.pop()()
    renders: list[object] = []
    real = render.render_body
    monkeypatch.setattr(render, "render_body", lambda r, f: renders.append(r) or real(r, f))
    node.table.hash_ahead()
    restores = node.restores()
    node.table.apply()
    assert node.restores() == restores  # the kernel already holds it all
    # Only the kernel chains' inserts (rendered at every check): none of cali-tw-a's 10 rules again, and
    # none of the unreferenced chain's.
    assert renders and all(isinstance(r.action, Jump) for r in renders)  # type: ignore[attr-defined]
    assert node.table._hasher.cached("cali-pi-unused") is None
