"""The ipset driver against the stateful fake: assert kernel state, not call sequences."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import structlog
from structlog.testing import capture_logs

from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.driver import MAX_RETRY_ATTEMPTS, SETTLE_SECONDS
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.errors import FatalDataplaneError
from felixpy.testing.clock import FakeClock

IP, NET, IPPORT = IPSetType.HASH_IP, IPSetType.HASH_NET, IPSetType.HASH_IP_PORT


@dataclass
class Env:
    clock: FakeClock
    fake: FakeIPSet

    def driver(self, ip_version: int = 4, **kw: object) -> IPSets:
        return IPSets(ip_version, self.fake, clock=self.clock.monotonic, sleep=self.clock.sleep, **kw)  # type: ignore[arg-type]


@pytest.fixture
def env() -> Env:
    clock = FakeClock()
    return Env(clock, FakeIPSet(clock))


def meta(set_id: str, t: IPSetType = IP, max_size: int = 1048576) -> IPSetMetadata:
    return IPSetMetadata(set_id, t, max_size)


def apply_all(d: IPSets, limit: int = 100) -> int:
    """One loop iteration's IP-set work, then deletions until done; returns the apply count."""
    d.apply_updates()
    n = 1
    while d.apply_deletions():
        d.apply_updates()
        n += 1
        assert n < limit, "did not converge"
    return n


def ours(fake: FakeIPSet, prefix: str = "cali4") -> dict[str, set[str]]:
    return {n: set(s.members) for n, s in fake.sets.items() if n.startswith(prefix)}


# ----------------------------------------------------------------------------- basics
def test_implements_the_contract(env: Env) -> None:
    assert isinstance(env.driver(), IPSetsDataplane)


def test_create_in_one_restore_session(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a", NET), ["10.0.0.0/24", "10.0.1.1"])
    d.add_or_replace_ip_set(meta("s:b", IPPORT), ["10.0.0.1,tcp:80", "10.0.0.2,udp:53"])
    d.add_or_replace_ip_set(meta("this-host", IP, 1000), ["192.168.0.1"])
    apply_all(d)
    assert ours(env.fake) == {
        "cali40s:a": {"10.0.0.0/24", "10.0.1.1"},
        "cali40s:b": {"10.0.0.1,tcp:80", "10.0.0.2,udp:53"},
        "cali40this-host": {"192.168.0.1"},
    }
    assert env.fake.sets["cali40this-host"].max_size == 1000
    assert env.fake.sets["cali40s:b"].type == "hash:ip,port"
    (stdin,) = env.fake.restore_inputs()
    assert stdin.startswith("create cali40s:a hash:net family inet maxelem 1048576\n")
    assert stdin.endswith("COMMIT\n")
    assert d.in_sync()


def test_only_differing_members_are_written(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), [f"10.0.0.{i}" for i in range(100)])
    apply_all(d)
    d.add_or_replace_ip_set(meta("s:a"), [f"10.0.0.{i}" for i in range(1, 101)])
    d.add_members("s:a", ["10.1.1.1"])
    d.remove_members("s:a", ["10.0.0.50"])
    apply_all(d)
    last = env.fake.restore_inputs()[-1].splitlines()
    assert sorted(last) == sorted(["del cali40s:a 10.0.0.0 --exist", "del cali40s:a 10.0.0.50 --exist",
                                   "add cali40s:a 10.0.0.100", "add cali40s:a 10.1.1.1", "COMMIT"])
    assert env.fake.members("cali40s:a") == ({f"10.0.0.{i}" for i in range(1, 101)} - {"10.0.0.50"}) | {"10.1.1.1"}


def test_a_big_ipv4_set_is_held_packed_from_its_arrival_through_its_write(env: Env) -> None:
    """#17, memory: a set received before the first apply is held packed (no str per member) and is marked
    written from its packed keys; the restore text is what an unpacked set gives, members in feed order."""
    d = env.driver()
    members = [f"10.{i >> 8}.{i & 255}.7" for i in range(500)][::-1]
    d.add_or_replace_ip_set(meta("s:a"), members)
    tracker = d._members["cali40s:a"]
    assert tracker.packed_snapshot() is not None and tracker.desired_len() == 500 and not tracker.in_sync()
    apply_all(d)
    (stdin,) = env.fake.restore_inputs()
    assert stdin == ("create cali40s:a hash:ip family inet maxelem 1048576\n"
                     + "".join(f"add cali40s:a {m}\n" for m in members) + "COMMIT\n")
    assert env.fake.members("cali40s:a") == set(members)
    assert tracker.packed_snapshot() is not None and tracker.in_sync() and d.in_sync()
    d.add_members("s:a", ["10.200.0.1"])            # a change unpacks it; only the change is written
    apply_all(d)
    assert env.fake.restore_inputs()[-1] == "add cali40s:a 10.200.0.1\nCOMMIT\n"
    # Under churn it stays unpacked (a delta to a packed set unpacks all of it): packed again only once no
    # delta came for SETTLE_SECONDS, at the next apply.
    assert tracker.packed_snapshot() is None
    env.clock.advance(SETTLE_SECONDS / 2)
    d.remove_members("s:a", ["10.200.0.1"])
    apply_all(d)
    env.clock.advance(SETTLE_SECONDS * 0.75)
    apply_all(d)
    assert tracker.packed_snapshot() is None        # the last delta is not SETTLE_SECONDS old yet
    env.clock.advance(SETTLE_SECONDS)
    apply_all(d)
    assert tracker.packed_snapshot() is not None and tracker.in_sync()
    assert env.fake.members("cali40s:a") == set(members) and len(env.fake.restore_inputs()) == 3


def test_nothing_to_do_runs_nothing(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])
    apply_all(d)
    before = len(env.fake.calls)
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])  # same again
    d.add_members("s:a", ["10.0.0.1"])
    apply_all(d)
    assert len(env.fake.calls) == before


def test_add_then_remove_before_apply_is_a_noop(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])
    apply_all(d)
    before = len(env.fake.calls)
    d.add_members("s:a", ["10.0.0.2"])
    d.remove_members("s:a", ["10.0.0.2"])
    apply_all(d)
    assert len(env.fake.calls) == before


def test_getters(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a", NET), ["10.0.0.0/24", "10.0.0.1/32"])
    assert d.get_type_of("s:a") is NET
    assert d.get_desired_members("s:a") == frozenset({"10.0.0.0/24", "10.0.0.1"})
    assert d.get_type_of("nope") is None and d.get_desired_members("nope") is None
    d.remove_ip_set("s:a")
    assert d.get_type_of("s:a") is None


def test_long_ids_are_truncated_to_31_chars(env: Env) -> None:
    d = env.driver(6)
    d.add_or_replace_ip_set(meta("s:qMt7iLlGDhvLnCjM0l9nzxbabcdefghijklm"), ["fd00::1"])
    apply_all(d)
    assert list(ours(env.fake, "cali6")) == ["cali60s:qMt7iLlGDhvLnCjM0l9nzxb"]
    assert env.fake.sets["cali60s:qMt7iLlGDhvLnCjM0l9nzxb"].family == "inet6"


# ----------------------------------------------------------------------------- deletions
def test_deletions_wait_for_apply_deletions_and_are_rate_limited(env: Env) -> None:
    d = env.driver()
    for i in range(3):
        d.add_or_replace_ip_set(meta(f"s:{i}"), ["10.0.0.1"])
    apply_all(d)
    for i in range(3):
        d.remove_ip_set(f"s:{i}")
    d.apply_updates()
    assert len(ours(env.fake)) == 3  # nothing destroyed before the tables are written
    assert d.apply_deletions() is True
    assert len(ours(env.fake)) == 2
    assert d.apply_deletions() is True
    assert d.apply_deletions() is False
    assert ours(env.fake) == {}
    assert len(env.fake.commands("destroy")) == 3


def test_remove_then_readd_before_deletion_keeps_the_set(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1", "10.0.0.2"])
    apply_all(d)
    d.remove_ip_set("s:a")
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.2", "10.0.0.3"])
    apply_all(d)
    assert ours(env.fake) == {"cali40s:a": {"10.0.0.2", "10.0.0.3"}}
    assert env.fake.commands("destroy") == []


def test_delete_of_an_in_use_set_waits_for_the_next_resync(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])
    apply_all(d)
    env.fake.reference("cali40s:a")  # someone else's rule still uses it
    d.remove_ip_set("s:a")
    d.apply_updates()
    assert d.apply_deletions() is False  # failed: do not spin
    assert "cali40s:a" in env.fake.sets
    d.apply_updates()
    d.apply_deletions()
    assert len(env.fake.commands("destroy")) == 1  # not retried before a resync
    env.fake.unreference("cali40s:a")
    d.queue_resync()  # the periodic refresh
    apply_all(d)
    assert "cali40s:a" not in env.fake.sets


# ----------------------------------------------------------------------------- restart / resync
def test_restart_reads_back_without_rewriting(env: Env) -> None:
    desired = {"s:a": (NET, ["10.0.0.0/24", "10.1.0.0/16"]), "s:b": (IPPORT, ["10.0.0.1,tcp:80"]),
               "s:c": (IP, [f"10.2.0.{i}" for i in range(50)])}
    first = env.driver()
    for sid, (t, ms) in desired.items():
        first.add_or_replace_ip_set(meta(sid, t), ms)
    apply_all(first)
    env.fake.calls.clear()
    second = env.driver()  # a restarted daemon, same datastore
    for sid, (t, ms) in desired.items():
        second.add_or_replace_ip_set(meta(sid, t), ms)
    apply_all(second)
    assert [argv for argv, _ in env.fake.calls] == [("ipset", "save")]
    assert second.in_sync()


def test_restart_sweeps_exactly_our_orphans(env: Env) -> None:
    f = env.fake
    f.add_set("cali40s:keep", "hash:ip", members=["10.0.0.1", "10.0.0.9"])
    f.add_set("cali40s:orphan", "hash:ip", members=["10.0.0.2"])
    f.add_set("cali4t7", "hash:ip", members=["10.0.0.3"])  # a temp set left behind
    f.add_set("cali4-s:v1format", "hash:ip")
    f.add_set("felix-4old", "hash:ip")
    f.add_set("felix-masq-ipam-pools", "hash:net")
    f.add_set("cali60s:v6", "hash:ip", "inet6", members=["fd00::1"])  # the other family's
    f.add_set("KUBE-CLUSTER-IP", "hash:ip,port", members=["10.96.0.1,tcp:443"])
    f.add_set("felix-6old", "hash:ip", "inet6")
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:keep"), ["10.0.0.1", "10.0.0.5"])
    d.add_or_replace_ip_set(meta("s:new"), ["10.0.0.7"])
    apply_all(d)
    assert set(f.sets) == {"cali40s:keep", "cali40s:new", "cali60s:v6", "KUBE-CLUSTER-IP", "felix-6old"}
    assert f.members("cali40s:keep") == {"10.0.0.1", "10.0.0.5"}
    assert f.members("KUBE-CLUSTER-IP") == {"10.96.0.1,tcp:443"}
    # Only the differing members were written for the kept set.
    assert "add cali40s:keep 10.0.0.1\n" not in "".join(f.restore_inputs())


def test_restart_reads_a_big_save_a_set_at_a_time_and_takes_out_of_order_members(env: Env) -> None:
    """The restart's read-back hands the driver one set's members at a time (#17, memory); an add line
    out of its set's run (ipset save writes none, but the parser accepts it) still counts as found."""
    from felixpy.drivers.cmdshim import CommandResult

    a = [f"10.0.{i >> 8}.{i & 255}" for i in range(300)]
    save = ("create cali40s:a hash:ip family inet hashsize 1024 maxelem 1048576\n"
            + "".join(f"add cali40s:a {m}\n" for m in a[:-1])
            + "create cali40s:b hash:ip family inet hashsize 1024 maxelem 1048576\nadd cali40s:b 10.9.0.1\n"
            + f"add cali40s:a {a[-1]}\nadd cali40s:a 10.0.99.99\n")
    real = env.fake.run

    def run(argv, stdin=None, *, while_running=None):  # type: ignore[no-untyped-def]
        if list(argv) == ["ipset", "save"]:
            return CommandResult(0, save, "")
        return real(argv, stdin, while_running=while_running)

    env.fake.run = run  # type: ignore[method-assign]
    for name, members in (("cali40s:a", a[:-1] + [a[-1], "10.0.99.99"]), ("cali40s:b", ["10.9.0.1"])):
        env.fake.add_set(name, "hash:ip", members=members)
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), a)                     # 10.0.99.99 is not wanted
    d.add_or_replace_ip_set(meta("s:b"), ["10.9.0.1"])
    apply_all(d)
    assert env.fake.restore_inputs() == ["del cali40s:a 10.0.99.99 --exist\nCOMMIT\n"]
    assert env.fake.members("cali40s:a") == set(a) and d.in_sync()


def test_restart_falls_back_to_per_set_listing_when_save_fails(env: Env) -> None:
    f = env.fake
    f.add_set("cali40s:a", "hash:ip", members=["10.0.0.1"])
    f.add_set("cali40s:orphan", "hash:ip")
    f.add_set("FOREIGN", "hash:ip")
    f.make_unlistable("FOREIGN")  # e.g. made by a newer ipset: a full dump fails
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1", "10.0.0.2"])
    apply_all(d)
    assert set(f.sets) == {"cali40s:a", "FOREIGN"}
    assert f.members("cali40s:a") == {"10.0.0.1", "10.0.0.2"}
    listed = [argv[-1] for argv in f.commands("list")]
    assert "FOREIGN" not in listed and "cali40s:a" in listed


def test_unreadable_set_of_ours_is_rebuilt_by_swap(env: Env) -> None:
    f = env.fake
    f.add_set("cali40s:a", "hash:ip", members=["10.0.0.1", "10.9.9.9"])
    f.make_unlistable("cali40s:a")  # saved by a newer ipset revision
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1", "10.0.0.2"])
    apply_all(d)
    assert f.members("cali40s:a") == {"10.0.0.1", "10.0.0.2"}
    assert any("swap cali40s:a cali4t" in s for s in f.restore_inputs())
    assert ours(f) == {"cali40s:a": {"10.0.0.1", "10.0.0.2"}}


def test_readding_a_set_found_at_restart_reads_its_members_first(env: Env) -> None:
    env.fake.add_set("cali40s:a", "hash:ip", members=["10.0.0.1", "10.0.0.2"])
    d = env.driver()
    d.apply_updates()  # start of day: s:a is not (yet) wanted
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.2", "10.0.0.3"])
    apply_all(d)
    assert env.fake.members("cali40s:a") == {"10.0.0.2", "10.0.0.3"}
    assert env.fake.commands("destroy") == []


def test_temp_names_skip_leftovers(env: Env) -> None:
    env.fake.add_set("cali4t0", "hash:ip")
    env.fake.reference("cali4t0")  # cannot be cleaned up
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a", IP, 10), ["10.0.0.1"])
    apply_all(d)
    d.add_or_replace_ip_set(meta("s:a", IP, 20), ["10.0.0.1"])
    apply_all(d)
    assert any("create cali4t1 hash:ip" in s for s in env.fake.restore_inputs())
    assert env.fake.sets["cali40s:a"].max_size == 20


# ----------------------------------------------------------------------------- metadata changes
def test_maxelem_change_rebuilds_in_a_temp_set_and_swaps(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a", IP, 100), ["10.0.0.1", "10.0.0.2"])
    apply_all(d)
    env.fake.reference("cali40s:a")  # a rule uses it: swap is fine
    d.add_or_replace_ip_set(meta("s:a", IP, 200), ["10.0.0.2", "10.0.0.3"])
    d.apply_updates()
    last = env.fake.restore_inputs()[-1]
    assert "flush" not in last and "destroy" not in last
    assert last.splitlines()[0] == "create cali4t0 hash:ip family inet maxelem 200"
    assert last.splitlines()[-2] == "swap cali40s:a cali4t0"
    assert env.fake.members("cali40s:a") == {"10.0.0.2", "10.0.0.3"}
    assert env.fake.sets["cali40s:a"].max_size == 200 and env.fake.sets["cali40s:a"].references == 1
    apply_all(d)
    assert ours(env.fake) == {"cali40s:a": {"10.0.0.2", "10.0.0.3"}}
    assert d.in_sync()


def test_type_change_of_an_unused_set_renames_the_rebuilt_set_in(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a", IP), ["10.0.0.1"])
    apply_all(d)
    d.add_or_replace_ip_set(meta("s:a", NET), ["10.0.0.0/24"])
    d.apply_updates()
    assert env.fake.sets["cali40s:a"].type == "hash:net"
    assert env.fake.members("cali40s:a") == {"10.0.0.0/24"}
    apply_all(d)
    assert ours(env.fake) == {"cali40s:a": {"10.0.0.0/24"}} and d.in_sync()


def test_type_change_of_a_referenced_set_waits_and_never_empties_it(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a", IP), ["10.0.0.1"])
    apply_all(d)
    env.fake.reference("cali40s:a")
    with capture_logs() as logs:
        d.add_or_replace_ip_set(meta("s:a", NET), ["10.0.0.0/24"])
        apply_all(d)
        d.add_members("s:a", ["10.1.0.0/16"])  # lands in the waiting rebuilt set
        apply_all(d)
    assert env.fake.sets["cali40s:a"].type == "hash:ip"
    assert env.fake.members("cali40s:a") == {"10.0.0.1"}  # old contents kept, not emptied
    waits = [e for e in logs if "type change waits" in e["event"]]
    assert len(waits) == 1 and waits[0]["set_id"] == "s:a"
    assert not d.in_sync()
    env.fake.unreference("cali40s:a")  # the tables dropped the rule
    apply_all(d)
    assert env.fake.sets["cali40s:a"].type == "hash:net"
    assert ours(env.fake) == {"cali40s:a": {"10.0.0.0/24", "10.1.0.0/16"}}
    assert d.in_sync()


def test_type_change_reverted_while_waiting(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a", IP), ["10.0.0.1"])
    apply_all(d)
    env.fake.reference("cali40s:a")
    d.add_or_replace_ip_set(meta("s:a", NET), ["10.0.0.0/24"])
    apply_all(d)
    d.add_or_replace_ip_set(meta("s:a", IP), ["10.0.0.1", "10.0.0.2"])
    apply_all(d)
    assert ours(env.fake) == {"cali40s:a": {"10.0.0.1", "10.0.0.2"}}
    assert env.fake.sets["cali40s:a"].type == "hash:ip" and d.in_sync()


# ----------------------------------------------------------------------------- bad input
def test_bad_members_are_logged_with_the_set_id_and_skipped(env: Env) -> None:
    with capture_logs() as logs:
        d = env.driver()
        d.add_or_replace_ip_set(meta("s:a", IPPORT), ["10.0.0.1,tcp:80", "10.0.0.1,tcp", "fd00::1,tcp:80",
                                                     "10.0.0.2,icmp:1", "10.0.0.3,udp:53"])
        d.add_or_replace_ip_set(meta("s:b", IP), ["10.0.0.1", "not-an-ip"])
        d.add_members("s:b", ["10.0.0.2", "999.0.0.1"])
        apply_all(d)
    assert ours(env.fake) == {"cali40s:a": {"10.0.0.1,tcp:80", "10.0.0.3,udp:53"},
                              "cali40s:b": {"10.0.0.1", "10.0.0.2"}}
    bad = [e for e in logs if e["event"] == "Skipping bad IP set members"]
    assert [(e["set_id"], e["num_bad"]) for e in bad] == [("s:a", 3), ("s:b", 1), ("s:b", 1)]
    assert all(e["log_level"] == "warning" for e in bad)


def test_oversized_set_is_skipped_and_others_programmed(env: Env) -> None:
    with capture_logs() as logs:
        d = env.driver()
        d.add_or_replace_ip_set(meta("s:big", IP, 3), [f"10.0.0.{i}" for i in range(5)])
        d.add_or_replace_ip_set(meta("s:ok", IP, 3), ["10.0.0.1"])
        apply_all(d)
        apply_all(d)
    assert ours(env.fake) == {"cali40s:ok": {"10.0.0.1"}}
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1 and errors[0]["set_id"] == "s:big" and errors[0]["size"] == 5
    d.remove_members("s:big", ["10.0.0.3", "10.0.0.4"])
    apply_all(d)
    assert env.fake.members("cali40s:big") == {"10.0.0.0", "10.0.0.1", "10.0.0.2"}
    # Growing past the limit later freezes the kernel copy rather than failing the apply.
    d.add_members("s:big", ["10.0.0.8"])
    apply_all(d)
    assert env.fake.members("cali40s:big") == {"10.0.0.0", "10.0.0.1", "10.0.0.2"}


def test_member_updates_for_unknown_sets_are_logged_and_ignored(env: Env) -> None:
    with capture_logs() as logs:
        d = env.driver()
        d.add_members("s:nope", ["10.0.0.1"])
        d.remove_members("s:nope", ["10.0.0.1"])
        apply_all(d)
    assert [e["set_id"] for e in logs if e["log_level"] == "warning"] == ["s:nope", "s:nope"]
    assert ours(env.fake) == {}


# ----------------------------------------------------------------------------- failures and retries
def test_transient_restore_failure_is_retried_with_backoff(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])
    apply_all(d)
    d.add_members("s:a", ["10.0.0.2"])
    env.fake.inject("restore", times=3)
    d.apply_updates()
    assert env.fake.members("cali40s:a") == {"10.0.0.1", "10.0.0.2"}
    assert env.clock.sleeps == [0.001, 0.002, 0.004]
    # The failed session's sets were re-read (must tier) before each rewrite.
    assert env.fake.commands("list").count(("ipset", "list", "cali40s:a")) == 3


def test_partial_restore_failure_rereads_touched_sets_and_finishes(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1", "10.0.0.2"])
    d.add_or_replace_ip_set(meta("s:b"), ["10.0.0.3"])
    env.fake.inject("restore", at_line=3)  # create + first add applied, then failure
    d.apply_updates()
    assert ours(env.fake) == {"cali40s:a": {"10.0.0.1", "10.0.0.2"}, "cali40s:b": {"10.0.0.3"}}
    # The retry did not re-add what the failed session had already applied.
    assert "add cali40s:a 10.0.0.1" not in env.fake.restore_inputs()[-1]


def test_persistent_failures_escalate_to_full_resync(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])
    apply_all(d)
    env.fake.calls.clear()
    d.add_members("s:a", ["10.0.0.2"])
    env.fake.inject("restore", times=7)
    d.apply_updates()
    assert env.fake.members("cali40s:a") == {"10.0.0.1", "10.0.0.2"}
    calls = [argv[1:] for argv, _ in env.fake.calls]
    # Failures 1-5 re-read only the touched set; from the 6th on, a full resync precedes each retry.
    assert calls == [("restore",)] + [("list", "cali40s:a"), ("restore",)] * 5 + [("save",), ("restore",)] * 2


def test_retries_exhausted_raise_fatal(env: Env) -> None:
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])
    env.fake.inject("restore", times=None, stderr="ipset v7.17: Error in line 1: Kernel error\n")
    with pytest.raises(FatalDataplaneError):
        d.apply_updates()
    assert len(env.fake.commands("restore")) == MAX_RETRY_ATTEMPTS
    assert env.clock.sleeps == [0.001 * 2**i for i in range(MAX_RETRY_ATTEMPTS)]


def test_resync_read_failures_are_retried(env: Env) -> None:
    env.fake.add_set("cali40s:a", "hash:ip", members=["10.0.0.9"])
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])
    env.fake.inject("save", times=2)
    env.fake.inject("list-name", times=2)
    d.apply_updates()
    assert env.fake.members("cali40s:a") == {"10.0.0.1"}
    assert env.clock.sleeps == [0.001, 0.002]


def test_a_set_destroyed_mid_resync_is_recreated(env: Env) -> None:
    env.fake.add_set("cali40s:a", "hash:ip", members=["10.0.0.1"])
    env.fake.add_set("FOREIGN", "hash:ip")
    env.fake.make_unlistable("FOREIGN")

    def vanish(argv: tuple[str, ...], _stdin: str | None) -> None:
        if argv == ("ipset", "list", "cali40s:a"):
            env.fake.sets.pop("cali40s:a", None)

    env.fake.before_command = vanish
    d = env.driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1", "10.0.0.2"])
    d.apply_updates()
    assert env.fake.members("cali40s:a") == {"10.0.0.1", "10.0.0.2"}


# ----------------------------------------------------------------------------- periodic refresh
def _fleet(env: Env, n: int, cost: float = 0.03) -> IPSets:
    d = env.driver()
    for i in range(n):
        d.add_or_replace_ip_set(meta(f"s:{i:03}"), [f"10.0.{i}.1", f"10.0.{i}.2"])
    apply_all(d)
    env.fake.calls.clear()
    env.fake.cost["list"] = cost
    return d


def test_refresh_lists_names_then_rechecks_within_the_budget(env: Env) -> None:
    d = _fleet(env, 10)
    d.queue_resync()
    d.apply_updates()
    assert env.fake.calls[0][0] == ("ipset", "list", "-name")
    per_set = [a for a in env.fake.commands("list")]
    # 30 ms per set against a 100 ms budget: at least one, and no more than the budget allows.
    assert len(per_set) == 4
    assert d.apply_deletions() is True  # more to re-check: call again soon
    counts = [len(per_set)]
    while True:
        before = len(env.fake.commands("list"))
        d.apply_updates()
        counts.append(len(env.fake.commands("list")) - before)
        if not d.apply_deletions():
            break
    assert counts == [4, 4, 2]
    assert env.fake.commands("restore") == [] and d.in_sync()  # nothing drifted, nothing written


def test_refresh_makes_progress_even_when_one_listing_exceeds_the_budget(env: Env) -> None:
    d = _fleet(env, 3, cost=0.5)
    d.queue_resync()
    d.apply_updates()
    assert len(env.fake.commands("list")) == 1


def test_refresh_repairs_a_vanished_set_in_the_same_apply(env: Env) -> None:
    d = _fleet(env, 10)
    env.fake.sets.pop("cali40s:007")
    d.queue_resync()
    d.apply_updates()
    assert env.fake.members("cali40s:007") == {"10.0.7.1", "10.0.7.2"}
    assert ("ipset", "list", "cali40s:007") not in env.fake.commands("list")  # no wasted listing


def test_refresh_deletes_an_unexpected_set_without_listing_it(env: Env) -> None:
    d = _fleet(env, 2)
    env.fake.add_set("cali40s:stray", "hash:ip", members=["1.2.3.4"])
    d.queue_resync()
    d.apply_updates()
    d.apply_deletions()
    assert "cali40s:stray" not in env.fake.sets
    assert ("ipset", "list", "cali40s:stray") not in env.fake.commands("list")


def test_refresh_restores_a_member_removed_by_hand(env: Env) -> None:
    d = _fleet(env, 10)
    env.fake.run(["ipset", "del", "cali40s:009", "10.0.9.2"])
    env.fake.run(["ipset", "add", "cali40s:001", "6.6.6.6"])
    d.queue_resync()
    apply_all(d)
    assert env.fake.members("cali40s:009") == {"10.0.9.1", "10.0.9.2"}
    assert env.fake.members("cali40s:001") == {"10.0.1.1", "10.0.1.2"}
    fixes = [line for s in env.fake.restore_inputs() for line in s.splitlines() if line != "COMMIT"]
    assert sorted(fixes) == ["add cali40s:009 10.0.9.2", "del cali40s:001 6.6.6.6 --exist"]


def test_refreshes_faster_than_the_drain_become_a_rolling_scan(env: Env) -> None:
    d = _fleet(env, 10)
    seen: list[str] = []
    for _ in range(5):
        d.queue_resync()  # the timer pops again before the queue drained
        before = len(env.fake.commands("list"))
        d.apply_updates()
        d.apply_deletions()  # the apply's last IP-set step
        seen += [a[-1] for a in env.fake.commands("list")[before:]]
    # Re-adds keep their place: the scan still walks every set, in order, without starving any.
    assert seen[:10] == [f"cali40s:{i:03}" for i in range(10)]


def test_one_apply_spends_one_budget_however_often_it_calls_apply_updates(env: Env) -> None:
    """The loop calls apply_updates twice an apply (the second for sets recorded since the first): the
    refresh's listings share one budget across both, renewed by apply_deletions."""
    d = _fleet(env, 10)
    d.queue_resync()
    d.apply_updates()
    d.apply_updates()  # the same apply's second call: its budget is spent
    assert len(env.fake.commands("list")) == 4
    assert d.apply_deletions() is True
    d.apply_updates()  # the next apply's
    assert len(env.fake.commands("list")) == 8


def test_start_of_day_must_tier_is_drained_in_full(env: Env) -> None:
    for i in range(10):
        env.fake.add_set(f"cali40s:{i:03}", "hash:ip", members=[f"10.0.{i}.1"])
    env.fake.add_set("FOREIGN", "hash:ip")
    env.fake.make_unlistable("FOREIGN")  # forces the per-set path
    env.fake.cost["list"] = 0.05
    d = env.driver()
    for i in range(10):
        d.add_or_replace_ip_set(meta(f"s:{i:03}"), [f"10.0.{i}.1"])
    d.apply_updates()
    assert len(env.fake.commands("list")) == 10  # 500 ms of listings: no budget applies
    assert env.fake.commands("restore") == [] and d.in_sync()


def test_a_failed_write_is_rechecked_at_must_priority_before_the_next_write(env: Env) -> None:
    d = _fleet(env, 10, cost=0.0)
    d.queue_resync()
    d.add_members("s:009", ["10.9.9.9"])
    env.fake.inject("restore", times=1)
    d.apply_updates()
    lists = [a[-1] for a in env.fake.commands("list")]
    restores = [i for i, (argv, _) in enumerate(env.fake.calls) if argv[1] == "restore"]
    relist = [i for i, (argv, _) in enumerate(env.fake.calls) if argv == ("ipset", "list", "cali40s:009")]
    assert "cali40s:009" in lists
    assert relist[-1] > restores[0] and relist[-1] < restores[1]
    assert "10.9.9.9" in env.fake.members("cali40s:009")


# ----------------------------------------------------------------------------- families
def test_ipv6_driver_owns_only_ipv6_sets(env: Env) -> None:
    env.fake.add_set("cali40s:v4", "hash:ip", members=["10.0.0.1"])
    env.fake.add_set("cali60s:orphan", "hash:ip", "inet6")
    d6 = env.driver(6)
    d6.add_or_replace_ip_set(meta("s:a", NET), ["fd00::/64", "fd00:1::1/128", "10.0.0.0/8"])
    d6.add_or_replace_ip_set(meta("s:b", IPPORT), ["fd00::1,tcp:80"])
    apply_all(d6)
    assert ours(env.fake, "cali6") == {"cali60s:a": {"fd00::/64", "fd00:1::1"}, "cali60s:b": {"fd00::1,tcp:80"}}
    assert env.fake.sets["cali60s:a"].family == "inet6"
    assert "cali40s:v4" in env.fake.sets


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    yield
    structlog.reset_defaults()
