"""The ipset driver's start-of-day ``ipset save`` started before InSync (``PrefetchesBeforeInSync``), on the
stateful fake.

The loop's ``render_ahead`` offers it once the sets recorded so far are big enough; the first apply takes
that save instead of starting another, and, since the save is older than that apply, the driver asks for a
background resync once the apply is done (the periodic refresh's rolling re-read), which repairs what
changed in the kernel in between.  Background jobs are captured, so each test decides when the save runs
and what the kernel holds then.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest

from felixpy.config import Config
from felixpy.dataplane.core import InternalDataplane
from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock

EARLY_MIN = 4  # members from which the save starts before InSync (the daemon's: 50,000)


def members(v: int, n: int, base: int = 0) -> list[str]:
    return [f"10.0.{base}.{i}" if v == 4 else str(ipaddress.ip_address(f"fd00::{base}:{i:x}"))
            for i in range(1, n + 1)]


class Node:
    """One family's ipset driver over *fake*, its background jobs captured."""

    def __init__(self, v: int, fake: FakeIPSet | None = None) -> None:
        self.v = v
        self.fake = fake or FakeIPSet()
        self.clock = FakeClock()
        self.jobs: list[Callable[[], None]] = []
        self.sets = IPSets(v, self.fake, clock=self.clock.monotonic, sleep=self.clock.sleep,
                           start_background=self.jobs.append, early_save_min_members=EARLY_MIN)

    def want(self, set_id: str, n: int, base: int = 0) -> None:
        self.sets.add_or_replace_ip_set(IPSetMetadata(set_id, IPSetType.HASH_IP, 1048576),
                                        members(self.v, n, base))

    def name(self, set_id: str) -> str:
        return f"cali{self.v}0{set_id}"

    def apply(self) -> bool:
        """One apply's IP-set steps; True if the driver asks for another apply."""
        self.sets.apply_updates()
        return self.sets.apply_deletions()


def family(v: int) -> str:
    return "inet" if v == 4 else "inet6"


@pytest.mark.parametrize("v", [4, 6])
def test_a_small_node_reads_its_sets_after_insync(v: int) -> None:
    n = Node(v)
    n.want("s:a", EARLY_MIN - 1)
    assert n.sets.prefetch_before_insync() is False and n.jobs == []
    n.sets.prefetch()  # the first apply's own prefetch
    assert len(n.jobs) == 1


@pytest.mark.parametrize("v", [4, 6])
def test_a_big_node_saves_before_insync_once_and_the_first_apply_takes_that_save(v: int) -> None:
    fake = FakeIPSet()
    n = Node(v, fake)
    n.want("s:a", EARLY_MIN)
    assert n.sets.prefetch_before_insync() is True and len(n.jobs) == 1
    n.want("s:b", 2, base=1)  # more of the feed arrives: the save already started is kept
    assert n.sets.prefetch_before_insync() is True and len(n.jobs) == 1
    n.jobs.pop()()
    assert len(fake.commands("save")) == 1
    n.apply()
    assert len(fake.commands("save")) == 1  # taken, not run again
    assert fake.members(n.name("s:a")) == set(members(v, EARLY_MIN))
    assert fake.members(n.name("s:b")) == set(members(v, 2, base=1))


@pytest.mark.parametrize("v", [4, 6])
def test_what_changed_between_the_early_save_and_the_apply_is_repaired_by_the_background_resync(v: int) -> None:
    fake = FakeIPSet()
    fake.add_set(f"cali{v}0s:a", "hash:ip", family(v))
    fake.sets[f"cali{v}0s:a"].members.update(members(v, EARLY_MIN))  # a restart: the set is all there
    n = Node(v, fake)
    n.want("s:a", EARLY_MIN)
    assert n.sets.prefetch_before_insync()
    n.jobs.pop()()  # saved while the set was right
    gone = members(v, EARLY_MIN)[0]
    fake.sets[f"cali{v}0s:a"].members.discard(gone)  # then someone else removes a member
    fake.add_set(f"cali{v}0stray", "hash:ip", family(v))  # and makes a set in our name space
    assert n.apply() is True  # wrote nothing (the save said in sync), and asks for the next apply
    assert fake.restore_inputs() == [] and gone not in fake.members(n.name("s:a"))
    assert not n.sets.in_sync()
    for _ in range(20):  # the rolling re-read, as many applies as it takes
        if not n.apply():
            break
    assert gone in fake.members(n.name("s:a"))  # repaired
    assert f"cali{v}0stray" not in fake.sets  # swept
    assert n.sets.in_sync() and len(fake.commands("save")) == 1  # re-read set by set, not saved again


@pytest.mark.parametrize("v", [4, 6])
def test_a_save_made_by_the_apply_itself_asks_for_no_background_resync(v: int) -> None:
    n = Node(v)
    n.want("s:a", EARLY_MIN)
    n.sets.prefetch()  # an ordinary start of day: the apply's own prefetch
    n.jobs.pop()()
    assert n.apply() is False and n.sets.in_sync()
    assert n.fake.commands("list-name") == []


def test_an_early_save_that_failed_is_made_again_on_the_apply_path_and_asks_for_nothing_more() -> None:
    fake = FakeIPSet()
    n = Node(4, fake)
    n.want("s:a", EARLY_MIN)
    assert n.sets.prefetch_before_insync()
    fake.add_set("cali40unprintable", "hash:ip", "inet")
    fake.make_unlistable("cali40unprintable")  # the save fails (a set a newer ipset made)
    n.jobs.pop()()
    fake.sets.pop("cali40unprintable")
    assert n.apply() is False  # the save taken failed: read again now, fresh, so no re-read after
    assert fake.members("cali40s:a") == set(members(4, EARLY_MIN)) and n.sets.in_sync()


def test_the_loop_offers_the_early_save_in_render_ahead_and_the_first_apply_does_not_save_again() -> None:
    fake = FakeIPSet()
    n = Node(4, fake)
    dp = InternalDataplane(Config(), FakeClock())
    dp.register_ipsets(n.sets)
    n.want("s:a", EARLY_MIN)
    dp.render_ahead()
    assert len(n.jobs) == 1
    n.jobs.pop()()
    dp.set_iface_in_sync()
    dp.on_datastore_message(pb.InSync())
    report = dp.apply()
    assert n.jobs == [] and len(fake.commands("save")) == 1  # no second save started by the apply
    assert fake.members("cali40s:a") == set(members(4, EARLY_MIN))
    assert report.reschedule_in is not None  # the background resync is brought by the next apply
    for _ in range(20):
        if n.sets.in_sync():
            break
        dp.apply()
    assert n.sets.in_sync() and fake.commands("list-name") != []


@pytest.mark.parametrize("v", [4, 6])
def test_the_early_save_is_digested_ahead_so_the_apply_reads_members_only_of_the_sets_that_differ(
        v: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The save started before InSync also digests every owned set's members on its thread (saveread.py).
    The apply then settles a set whose kernel digest equals its desired one without cutting its members
    out again; a set that drifted before the save, and one whose desired members changed after it (a
    delta), are read out of the save again and compared key by key, and both are repaired."""
    from felixpy.drivers.ipsets.resync import Resync

    fake = FakeIPSet()
    for sid, base in (("s:same", 0), ("s:drifted", 1), ("s:changed", 2)):
        fake.add_set(f"cali{v}0{sid}", "hash:ip", family(v))
        fake.sets[f"cali{v}0{sid}"].members.update(members(v, EARLY_MIN, base))
    lost = members(v, EARLY_MIN, 1)[0]
    fake.sets[f"cali{v}0s:drifted"].members.discard(lost)  # drifted before the save
    n = Node(v, fake)
    for sid, base in (("s:same", 0), ("s:drifted", 1), ("s:changed", 2)):
        n.want(sid, EARLY_MIN, base)
    assert n.sets.prefetch_before_insync()
    n.jobs.pop()()  # the save and its digests, before InSync
    added = members(v, EARLY_MIN + 1, 2)[-1]
    n.sets.add_members("s:changed", [added])  # more of the feed: a delta after the save
    compared: list[str] = []
    real = Resync._load_members
    monkeypatch.setattr(Resync, "_load_members",
                        lambda self, name, ms, drift=False: compared.append(name) or real(self, name, ms, drift))
    n.apply()
    assert sorted(compared) == [n.name("s:changed"), n.name("s:drifted")]  # not s:same's members
    assert lost in fake.members(n.name("s:drifted"))
    assert fake.members(n.name("s:changed")) == set(members(v, EARLY_MIN, 2)) | {added}
    assert fake.members(n.name("s:same")) == set(members(v, EARLY_MIN, 0))
    assert len(fake.commands("save")) == 1


def test_a_set_with_members_out_of_its_run_is_left_to_the_key_by_key_comparison() -> None:
    """``digest_save`` digests a set only from its own run of add lines; an add line elsewhere (ipset save
    writes none, a hand-made restore file might) leaves that set undigested, and a temporary set is
    never digested; a failed save gives nothing to digest."""
    from felixpy.drivers.cmdshim import CommandResult, Output
    from felixpy.drivers.ipsets.naming import IPVersionConfig
    from felixpy.drivers.ipsets.saveread import digest_save

    text = ("create cali40s:a hash:ip family inet hashsize 1024 maxelem 1048576\n"
            "add cali40s:a 10.0.0.1\nadd cali40s:a 10.0.0.2\n"
            "create cali40s:b hash:ip family inet hashsize 1024 maxelem 1048576\n"
            "add cali40s:b 10.0.1.1\n"
            "create cali4t0 hash:ip family inet hashsize 1024 maxelem 1048576\n"
            "add cali4t0 10.0.2.1\n"
            "create foreign hash:ip family inet hashsize 1024 maxelem 65536\n"
            "add cali40s:b 10.0.1.2\n")
    found = digest_save(Output(CommandResult(0, text)), IPVersionConfig(4))
    assert found is not None
    assert [name for name, _ in found.sets] == ["cali40s:a", "cali40s:b", "cali4t0"]
    assert found.digests["cali40s:a"] == (2, hash("10.0.0.1") + hash("10.0.0.2"),
                                          hash(frozenset({"10.0.0.1", "10.0.0.2"})))
    assert found.digests["cali40s:b"] is None and "cali4t0" not in found.digests
    assert digest_save(Output(CommandResult(1, "", "boom")), IPVersionConfig(4)) is None
