"""The start-of-day resync's digest comparison in the daemon (resync.Resync._load_members, digest.local_digest).

A set whose read-back has the desired count and digest is marked in sync without its members being
compared key by key; anything else takes the full comparison.  Asserted on the fake kernel's state and
the trackers; the fast path's use is pinned by making the full comparison unavailable.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from felixpy.deltatracker import MemberTracker
from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets import driver as driver_mod
from felixpy.drivers.ipsets import resync as resync_mod
from felixpy.drivers.ipsets.digest import local_digest
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.testing.clock import FakeClock

IP, NET, IPPORT = IPSetType.HASH_IP, IPSetType.HASH_NET, IPSetType.HASH_IP_PORT


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    yield
    structlog.reset_defaults()


def addrs(n: int) -> list[str]:
    return [f"10.0.{i >> 8}.{i & 255}" for i in range(n)]


DESIRED: dict[str, tuple[IPSetType, list[str]]] = {
    "s:big": (NET, [a + "/32" for a in addrs(300)]),   # canonicalised to bare addresses, held packed
    "s:nets": (NET, ["10.1.0.0/16", "10.2.0.0/16", "10.3.0.1"]),
    "s:ports": (IPPORT, ["10.0.0.1,tcp:80", "10.0.0.2,udp:53", "10.0.0.1,TCP:80"]),  # a duplicate spelling
    "s:empty": (IP, []),
}


def mk(fake: FakeIPSet, v: int = 4) -> IPSets:
    clock = FakeClock()
    return IPSets(v, fake, clock=clock.monotonic, sleep=clock.sleep)  # type: ignore[arg-type]


def program(d: IPSets, desired: dict[str, tuple[IPSetType, list[str]]] = DESIRED) -> None:
    for set_id, (t, members) in desired.items():
        d.add_or_replace_ip_set(IPSetMetadata(set_id, t, 1048576), members)


def settle(d: IPSets) -> None:
    d.apply_updates()
    while d.apply_deletions():
        d.apply_updates()


def kernel(fake: FakeIPSet, prefix: str = "cali4") -> dict[str, set[str]]:
    return {n: set(s.members) for n, s in fake.sets.items() if n.startswith(prefix)}


@pytest.fixture
def programmed() -> tuple[FakeIPSet, dict[str, set[str]]]:
    fake = FakeIPSet()
    d = mk(fake)
    program(d)
    settle(d)
    fake.calls.clear()
    return fake, kernel(fake)


def no_full_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: MemberTracker[str], keys: object, value: object = True) -> None:
        raise AssertionError("compared key by key")
    monkeypatch.setattr(MemberTracker, "replace_dataplane_keys", refuse)


def test_local_digest_is_of_the_set_and_its_count() -> None:
    a = ["10.0.0.1", "10.0.0.2", "10.1.0.0/16"]
    assert local_digest(a) == local_digest(list(reversed(a))) == local_digest(set(a))
    assert local_digest(a) != local_digest(a[:2]) != local_digest([*a[:2], "10.0.0.3"])
    assert local_digest([])[0] == 0 and local_digest(a)[0] == 3


def test_restart_with_nothing_to_change_marks_every_set_in_sync_by_digest(programmed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    fake, before = programmed
    no_full_comparison(monkeypatch)
    d = mk(fake)
    program(d)
    settle(d)
    assert d.in_sync() and kernel(fake) == before
    assert fake.commands("restore") == [] and [c[:2] for c in fake.commands()] == [("ipset", "save")]
    big = d._members[d.names.name_for_main("s:big")]
    assert big.packed_snapshot() is not None and big.in_sync()   # still packed: never unpacked


@pytest.mark.parametrize("drift", ["missing", "extra", "swapped", "gone", "stale"])
def test_any_difference_takes_the_full_comparison_and_is_repaired(programmed, drift: str) -> None:  # type: ignore[no-untyped-def]
    fake, before = programmed
    if drift == "missing":
        fake.sets["cali40s:big"].members.discard("10.0.0.7")
    elif drift == "extra":
        fake.sets["cali40s:nets"].members.add("10.9.0.0/16")
    elif drift == "swapped":   # same count, another member
        fake.sets["cali40s:ports"].members = {"10.0.0.1,tcp:80", "10.0.0.3,udp:53"}
    elif drift == "gone":
        del fake.sets["cali40s:empty"]
    else:
        fake.add_set("cali40s:stale", members=["10.0.0.1"])
    d = mk(fake)
    program(d)
    settle(d)
    assert d.in_sync() and kernel(fake) == before


def test_a_set_changed_by_deltas_since_its_update_is_compared_key_by_key(programmed) -> None:  # type: ignore[no-untyped-def]
    fake, before = programmed
    fake.sets["cali40s:nets"].members.add("10.4.0.0/16")   # what the deltas below will want
    d = mk(fake)
    program(d)
    d.add_members("s:nets", ["10.4.0.0/16"])
    d.remove_members("s:big", ["10.0.0.1/32"])
    settle(d)
    assert d.in_sync()
    assert kernel(fake)["cali40s:nets"] == before["cali40s:nets"] | {"10.4.0.0/16"}
    assert kernel(fake)["cali40s:big"] == before["cali40s:big"] - {"10.0.0.1"}


def test_a_digest_collision_is_repaired_by_the_next_refresh(programmed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Were two member sets ever to share count and both sums, the start of day would believe the set in
    sync; the periodic refresh compares members, not digests (drift), and repairs it."""
    fake, before = programmed
    fake.sets["cali40s:ports"].members = {"10.0.0.1,tcp:80", "10.0.0.3,udp:53"}
    for mod in (driver_mod, resync_mod):   # the digest taken as a set arrives, and the read-back's
        monkeypatch.setattr(mod, "local_digest", lambda members: (len(members), 0, 0))
    d = mk(fake)
    program(d)
    settle(d)
    assert fake.commands("restore") == [] and d.in_sync()   # misjudged in sync ...
    assert kernel(fake)["cali40s:ports"] != before["cali40s:ports"]
    d.queue_resync()
    for _ in range(10):
        settle(d)
    assert kernel(fake) == before                            # ... until the refresh


def test_ipv6_sets_are_compared_by_digest_too(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeIPSet()
    desired = {"s:v6": (IP, ["2001:db8::1", "2001:DB8:0::2"]), "s:v6net": (NET, ["2001:db8:1::/48", "::/0"])}
    d = mk(fake, 6)
    program(d, desired)
    settle(d)
    before = kernel(fake, "cali6")
    fake.calls.clear()
    with monkeypatch.context() as m:
        no_full_comparison(m)
        d2 = mk(fake, 6)
        program(d2, desired)
        settle(d2)
    assert kernel(fake, "cali6") == before and d2.in_sync() and fake.commands("restore") == []
    fake.sets["cali60s:v6"].members.discard("2001:db8::2")
    d3 = mk(fake, 6)
    program(d3, desired)
    settle(d3)
    assert kernel(fake, "cali6") == before and d3.in_sync()


def test_digests_are_taken_until_the_start_of_day_and_dropped_after_it(programmed) -> None:  # type: ignore[no-untyped-def]
    """They serve the first full resync only: the steady state holds none (memory, #17)."""
    fake, before = programmed
    d = mk(fake)
    program(d)
    assert set(d._digests) == {d.names.name_for_main(s) for s in DESIRED}
    settle(d)
    assert d._digests == {}
    d.add_or_replace_ip_set(IPSetMetadata("s:nets", NET, 1048576), ["10.1.0.0/16"])
    assert d._digests == {}
    settle(d)
    assert kernel(fake)["cali40s:nets"] == {"10.1.0.0/16"} and d.in_sync()
