"""FilteredIPSets over the real ipset driver and its stateful fake: only the filtered sets are in the
kernel, whatever the manager sends; assertions are on the fake kernel's sets."""

from __future__ import annotations

import pytest

from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets_api import IPSetFilter, IPSetsDataplane
from felixpy.drivers.ipsets_filter import FilteredIPSets
from felixpy.managers.ipsets import IPSetsManager
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules.ipset_names import main_ipset_name
from felixpy.testing.clock import FakeClock

NETS = {4: ("10.1.0.0/16", "10.2.0.0/16", "10.3.0.1"), 6: ("fd00:1::/64", "fd00:2::/64", "fd00:3::1")}


class Env:
    """One family: the manager feeding a source dataplane (BPF mode's maps stand-in: another ipset driver,
    on a kernel of its own) and the filtered Linux ipsets."""

    def __init__(self, v: int) -> None:
        self.v = v
        self.clock = FakeClock()
        self.kernel = FakeIPSet(self.clock)
        self.source = IPSets(v, FakeIPSet(FakeClock()))
        self.linux = IPSets(v, self.kernel, clock=self.clock.monotonic, sleep=self.clock.sleep)
        self.filtered = FilteredIPSets(self.linux, self.source.get_desired_members)
        self.mgr = IPSetsManager(f"ipv{v}", [self.source, self.filtered], 1048576)

    def name(self, set_id: str) -> str:
        return main_ipset_name(set_id, self.v)

    def send(self, *msgs: object) -> None:
        for m in msgs:
            self.mgr.on_update(m)
        self.mgr.complete_deferred_work()

    def set_filter(self, *set_ids: str) -> None:
        self.filtered.set_filter(frozenset(self.name(s) for s in set_ids))

    def apply(self) -> None:
        """The loop's IP-set steps, deletions until done (one destroy per call)."""
        self.filtered.apply_updates()
        for _ in range(20):
            if not self.filtered.apply_deletions():
                return
            self.filtered.apply_updates()
        raise AssertionError("deletions did not converge")

    def ours(self) -> dict[str, set[str]]:
        prefix = f"cali{self.v}"
        return {n: set(s.members) for n, s in self.kernel.sets.items() if n.startswith(prefix)}


@pytest.fixture(params=[4, 6], ids=["v4", "v6"])
def env(request: pytest.FixtureRequest) -> Env:
    return Env(request.param)


def update(set_id: str, *members: str) -> pb.IPSetUpdate:
    return pb.IPSetUpdate(id=set_id, members=list(members), type=pb.IPSetUpdate.NET)


def test_implements_both_contracts(env: Env) -> None:
    assert isinstance(env.filtered, IPSetsDataplane) and isinstance(env.filtered, IPSetFilter)


def test_start_of_day_keeps_only_the_filtered_sets_and_sweeps_every_other_calico_set(env: Env) -> None:
    x, y, host = NETS[env.v]
    family = "inet" if env.v == 4 else "inet6"
    env.kernel.add_set(env.name("s:stale"), "hash:net", family, members=[x])  # an earlier run's
    env.kernel.add_set(env.name("s:y"), "hash:net", family, members=[y])      # wanted by BPF mode's maps only
    env.kernel.add_set("foreign", "hash:ip", family, members=[host])
    env.send(update("s:x", x), update("s:y", y))
    env.set_filter("s:x")
    env.apply()
    assert env.ours() == {env.name("s:x"): {x}}
    assert "foreign" in env.kernel.sets  # never ours
    assert env.source.get_desired_members("s:y") == frozenset({y})  # the other dataplane still has it all
    assert env.filtered.get_type_of("s:y") is not None and env.filtered.get_desired_members("s:y") is None


def test_nothing_reaches_the_kernel_before_a_filter_is_set(env: Env) -> None:
    x, _, _ = NETS[env.v]
    env.send(update("s:x", x))
    env.apply()
    assert env.ours() == {}


def test_a_set_entering_the_filter_gets_its_full_membership_and_one_leaving_it_is_destroyed(env: Env) -> None:
    x, y, host = NETS[env.v]
    env.send(update("s:x", x), update("s:y", y))
    env.set_filter("s:x")
    env.apply()
    # Deltas for a set outside the filter reach only the source; they are not lost.
    env.send(pb.IPSetDeltaUpdate(id="s:y", added_members=[host]), pb.IPSetDeltaUpdate(id="s:x", added_members=[host]))
    env.apply()
    assert env.ours() == {env.name("s:x"): {x, host}}
    env.set_filter("s:y")
    env.apply()
    assert env.ours() == {env.name("s:y"): {y, host}}
    env.send(pb.IPSetDeltaUpdate(id="s:y", removed_members=[y]))
    env.apply()
    assert env.ours() == {env.name("s:y"): {host}}


def test_a_filtered_set_removed_by_the_feed_leaves_the_kernel_and_can_come_back(env: Env) -> None:
    x, _, _ = NETS[env.v]
    env.send(update("s:x", x))
    env.set_filter("s:x")
    env.apply()
    env.send(pb.IPSetRemove(id="s:x"))
    env.apply()
    assert env.ours() == {}
    env.send(update("s:x", x))
    env.apply()
    assert env.ours() == {env.name("s:x"): {x}}


def test_an_unchanged_filter_changes_nothing(env: Env) -> None:
    x, _, _ = NETS[env.v]
    env.send(update("s:x", x))
    env.set_filter("s:x")
    env.apply()
    calls = len(env.kernel.calls)
    env.set_filter("s:x")
    env.apply()
    assert len(env.kernel.calls) == calls
    assert env.filtered.filtered() == frozenset({"s:x"})
