"""The IP sets manager feeding real drivers over one fake kernel."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets_api import IPSetType
from felixpy.managers.base import Manager
from felixpy.managers.ipsets import IPSetsManager, split_by_family
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    yield
    structlog.reset_defaults()


@pytest.fixture
def kernel() -> FakeIPSet:
    return FakeIPSet(FakeClock())


def drivers(kernel: FakeIPSet) -> tuple[IPSets, IPSets]:
    clock = kernel.clock
    assert clock is not None
    return (IPSets(4, kernel, clock=clock.monotonic, sleep=clock.sleep),
            IPSets(6, kernel, clock=clock.monotonic, sleep=clock.sleep))


def apply(*ds: IPSets) -> None:
    for d in ds:
        d.apply_updates()
    for d in ds:
        while d.apply_deletions():
            d.apply_updates()


def update(set_id: str, members: list[str], t: int = pb.IPSetUpdate.IP) -> pb.IPSetUpdate:
    return pb.IPSetUpdate(id=set_id, members=members, type=t)  # type: ignore[arg-type]


def test_is_a_manager(kernel: FakeIPSet) -> None:
    assert isinstance(IPSetsManager("ipv4", drivers(kernel)[0], 1048576), Manager)


def test_members_are_routed_to_their_family(kernel: FakeIPSet) -> None:
    v4, v6 = drivers(kernel)
    m = IPSetsManager("all", [v4, v6], 1048576)
    m.on_update(update("s:a", ["10.0.0.1", "fd00::1", "10.0.0.2"]))
    m.on_update(update("s:p", ["10.0.0.1,tcp:80", "fd00::1,udp:53"], pb.IPSetUpdate.IP_AND_PORT))
    m.on_update(update("s:n", ["10.0.0.0/8", "fd00::/64"], pb.IPSetUpdate.NET))
    m.complete_deferred_work()
    apply(v4, v6)
    assert kernel.members("cali40s:a") == {"10.0.0.1", "10.0.0.2"}
    assert kernel.members("cali60s:a") == {"fd00::1"}
    assert kernel.members("cali40s:p") == {"10.0.0.1,tcp:80"}
    assert kernel.members("cali60s:p") == {"fd00::1,udp:53"}
    assert kernel.sets["cali40s:n"].type == "hash:net" and kernel.members("cali60s:n") == {"fd00::/64"}
    m.on_update(pb.IPSetDeltaUpdate(id="s:a", added_members=["fd00::2", "10.0.0.3"],
                                    removed_members=["10.0.0.1", "fd00::1"]))
    m.complete_deferred_work()  # deltas are handed to the drivers here (tests/ipsets/test_delta_batching.py)
    apply(v4, v6)
    assert kernel.members("cali40s:a") == {"10.0.0.2", "10.0.0.3"}
    assert kernel.members("cali60s:a") == {"fd00::2"}
    assert m.get_ip_set_type("s:p") is IPSetType.HASH_IP_PORT
    assert m.get_ip_set_members("s:a") == frozenset({"10.0.0.2", "10.0.0.3", "fd00::2"})
    m.on_update(pb.IPSetRemove(id="s:a"))
    apply(v4, v6)
    assert "cali40s:a" not in kernel.sets and "cali60s:a" not in kernel.sets
    assert m.get_ip_set_type("s:a") is None and m.get_ip_set_members("s:a") is None


def test_one_manager_per_family_as_felix(kernel: FakeIPSet) -> None:
    v4, v6 = drivers(kernel)
    m4 = IPSetsManager("ipv4", v4, 1000)
    m6 = IPSetsManager("ipv6", v6, 1000)
    with capture_logs() as logs:
        for m in (m4, m6):
            m.on_update(update("s:a", ["10.0.0.1", "fd00::1"]))
        apply(v4, v6)
    assert kernel.members("cali40s:a") == {"10.0.0.1"} and kernel.members("cali60s:a") == {"fd00::1"}
    assert kernel.sets["cali40s:a"].max_size == 1000
    assert not [e for e in logs if e["log_level"] in ("warning", "error")]  # routing is not an error


def test_bad_input_is_logged_with_the_set_id_and_the_rest_programmed(kernel: FakeIPSet) -> None:
    v4, v6 = drivers(kernel)
    m = IPSetsManager("all", [v4, v6], 1048576)
    with capture_logs() as logs:
        m.on_update(update("s:weird", ["10.0.0.1"], t=7))
        m.on_update(update("s:ok", ["10.0.0.1", "garbage", "10.0.0.1,tcp:80"]))
        m.on_update(pb.IPSetDeltaUpdate(id="s:weird", added_members=["10.0.0.2"]))
        apply(v4, v6)
    assert set(kernel.sets) == {"cali40s:ok", "cali60s:ok"}
    assert kernel.members("cali40s:ok") == {"10.0.0.1"}
    problems = [(e["log_level"], e["set_id"]) for e in logs if e["log_level"] in ("warning", "error")]
    # "garbage" reaches the IPv4 driver, "10.0.0.1,tcp:80" (a ':' in it) the IPv6 one: both say so.
    assert problems == [("error", "s:weird"), ("warning", "s:ok"), ("warning", "s:ok"), ("warning", "s:weird")]


def test_other_messages_leave_the_ip_sets_alone(kernel: FakeIPSet) -> None:
    v4, v6 = drivers(kernel)
    m = IPSetsManager("all", [v4, v6], 1048576)
    m.on_update(update("s:a", ["10.0.0.1", "fd00::1"]))
    apply(v4, v6)
    before = {name: kernel.members(name) for name in kernel.sets}
    assert before == {"cali40s:a": {"10.0.0.1"}, "cali60s:a": {"fd00::1"}}
    for msg in (pb.ConfigUpdate(config={"MaxIpsetSize": "1"}), pb.InSync(),
                pb.ActivePolicyRemove(id=pb.PolicyID(name="s:a")), pb.NamespaceRemove(id=pb.NamespaceID(name="s:a")),
                pb.IPAMPoolUpdate(id="s:a", pool=pb.IPAMPool(cidr="10.0.0.0/8")), "nonsense", object()):
        m.on_update(msg)
    apply(v4, v6)
    assert {name: kernel.members(name) for name in kernel.sets} == before
    assert m.get_ip_set_type("s:a") is IPSetType.HASH_IP


def test_split_by_family() -> None:
    assert split_by_family(["10.0.0.1", "fd00::1"], IPSetType.HASH_IP) == (["10.0.0.1"], ["fd00::1"])
    assert split_by_family(["10.0.0.1,tcp:1", "fd00::1,tcp:1"], IPSetType.HASH_IP_PORT) == (
        ["10.0.0.1,tcp:1"], ["fd00::1,tcp:1"])
    assert split_by_family(iter(["1.1.1.1/8", "::/0"]), IPSetType.HASH_NET) == (["1.1.1.1/8"], ["::/0"])
