"""IP-set deltas are deferred to ``complete_deferred_work`` (issue #14 item 7): the kernel ends as it would
have had every delta been handed over as it came.

Both IP-set dataplanes (the ipset driver over its fake kernel, nft sets over the fake nft), one IP family's
manager each, as wiring builds them.  *Batched*: the manager sees a whole sequence, then one
``complete_deferred_work`` and apply.  *Reference*: the same sequence with ``complete_deferred_work`` and an
apply after every message (what the manager did before deltas were deferred).  Asserted on the kernels.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import structlog

from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets.naming import IPVersionConfig
from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.nftables.members import member_from_element
from felixpy.drivers.nftables.names import set_name_for_id
from felixpy.drivers.nftables.table import NftablesTable
from felixpy.managers.ipsets import IPSetsManager
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock

BACKENDS = ("ipset", "nft")


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    yield
    structlog.reset_defaults()


@dataclass
class Side:
    """One family's manager over one backend's driver and fake kernel."""

    backend: str
    v: int
    manager: IPSetsManager
    apply: Callable[[], None]
    members: Callable[[str], set[str] | None]  # set id → members in the kernel (None: no such set)


def side(backend: str, v: int) -> Side:
    clock = FakeClock()
    if backend == "ipset":
        kernel = FakeIPSet(FakeClock())
        ipsets = IPSets(v, kernel, clock=clock.monotonic, sleep=clock.sleep)
        names = IPVersionConfig(v)

        def apply_ipset() -> None:
            ipsets.apply_updates()
            while ipsets.apply_deletions():
                ipsets.apply_updates()

        def ipset_members(set_id: str) -> set[str] | None:
            name = names.name_for_main(set_id)
            return kernel.members(name) if name in kernel.sets else None

        return Side(backend, v, IPSetsManager(f"ipv{v}", ipsets, 1048576), apply_ipset, ipset_members)
    nft = FakeNft()
    root = NftablesTable(v, nft, sleep=clock.sleep, now=clock.monotonic)

    def apply_nft() -> None:
        root.apply_updates()
        root.apply()
        root.apply_deletions()

    def nft_members(set_id: str) -> set[str] | None:
        name = set_name_for_id(set_id, v)
        for obj in nft.list_table("ip" if v == 4 else "ip6", "calico") or ():
            if "set" in obj and obj["set"]["name"] == name:
                return {str(member_from_element(e, v)) for e in obj["set"].get("elem", ())}
        return None

    return Side(backend, v, IPSetsManager(f"ipv{v}", root, 1048576), apply_nft, nft_members)


def delta(set_id: str, added: list[str] = (), removed: list[str] = ()) -> pb.IPSetDeltaUpdate:  # type: ignore[assignment]
    return pb.IPSetDeltaUpdate(id=set_id, added_members=added, removed_members=removed)


def full(set_id: str, members: list[str], t: Any = pb.IPSetUpdate.NET) -> pb.IPSetUpdate:
    return pb.IPSetUpdate(id=set_id, members=members, type=t)


def batched(s: Side, msgs: list[Any]) -> None:
    for m in msgs:
        s.manager.on_update(m)
    s.manager.complete_deferred_work()
    s.apply()


def one_by_one(s: Side, msgs: list[Any]) -> None:
    for m in msgs:
        s.manager.on_update(m)
        s.manager.complete_deferred_work()
        s.apply()


V4 = ["10.0.0.1", "10.0.0.1/32", "10.0.0.2", "10.0.0.0/30", "10.0.0.0/30"]  # two spellings of one member
V6 = ["fd00::1", "fd00::1/128", "fd00::2", "fd00::/126"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("v", [4, 6])
def test_order_within_a_batch_is_honoured(backend: str, v: int) -> None:
    a, b = (V4, V6)[v == 6][0], (V4, V6)[v == 6][1]  # "x" and "x/32" (or /128): one member, two spellings
    c = (V4, V6)[v == 6][2]
    s = side(backend, v)
    batched(s, [full("s:rm-add", [a]), full("s:add-rm", []), full("s:alias", []), full("s:alias2", [a]),
                full("s:gone", [a]), full("s:back", [c])])
    assert s.members("s:rm-add") == {a} and s.members("s:add-rm") == set()
    batched(s, [
        delta("s:rm-add", removed=[a]), delta("s:rm-add", added=[a]),        # remove then add: present
        delta("s:add-rm", added=[a, c]), delta("s:add-rm", removed=[a]),    # add then remove: absent
        delta("s:add-rm", added=[c], removed=[c]),                          # one delta: adds, then removes
        delta("s:alias", added=[b]), delta("s:alias", removed=[a]),         # the later spelling wins: absent
        delta("s:alias2", removed=[b]), delta("s:alias2", added=[a]),       # ...: present
        delta("s:gone", added=[c]), pb.IPSetRemove(id="s:gone"),            # a delta, then the set removed
        delta("s:back", added=[a]), pb.IPSetRemove(id="s:back"), full("s:back", [c]),  # ...and recreated
        delta("s:back", added=[b]),
        delta("s:never", added=[a]),                                        # unknown: ignored
    ])
    canon = s.members("s:alias2")
    assert s.members("s:rm-add") == {a} and s.members("s:add-rm") == set()
    assert s.members("s:alias") == set() and canon is not None and len(canon) == 1
    assert s.members("s:gone") is None and s.members("s:never") is None
    assert s.members("s:back") == {c} | canon


@pytest.mark.parametrize("backend", BACKENDS)
def test_deltas_reach_the_drivers_only_at_complete_deferred_work(backend: str) -> None:
    s = side(backend, 4)
    batched(s, [full("s:a", ["10.0.0.1"])])
    s.manager.on_update(delta("s:a", added=["10.0.0.2"], removed=["10.0.0.1"]))
    s.apply()  # the drivers have not been told yet: the kernel is unchanged
    assert s.members("s:a") == {"10.0.0.1"}
    assert s.manager.get_ip_set_members("s:a") == frozenset({"10.0.0.2"})  # a read sees the deltas (pushed first)
    s.manager.complete_deferred_work()
    s.apply()
    assert s.members("s:a") == {"10.0.0.2"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_end_as_one_by_one(backend: str, seed: int) -> None:
    rnd = random.Random(seed)
    v = 4 if seed % 2 == 0 else 6
    pool = [*(V4 if v == 4 else V6), "garbage", "fd00::9" if v == 4 else "10.0.0.9"]  # bad, other family
    ids = ["s:a", "s:b", "s:c"]
    start = [full(sid, rnd.sample(pool, 2)) for sid in ids]
    ref, got = side(backend, v), side(backend, v)
    one_by_one(ref, start)
    batched(got, start)
    for _ in range(8):
        msgs: list[Any] = []
        for _ in range(rnd.randrange(1, 25)):
            sid = rnd.choice(ids)
            r = rnd.random()
            if r < 0.8:
                msgs.append(delta(sid, rnd.sample(pool, rnd.randrange(0, 3)), rnd.sample(pool, rnd.randrange(0, 3))))
            elif r < 0.9:
                msgs.append(full(sid, rnd.sample(pool, rnd.randrange(0, 3))))
            else:
                msgs.append(pb.IPSetRemove(id=sid))
        one_by_one(ref, msgs)
        batched(got, msgs)
        assert {sid: got.members(sid) for sid in ids} == {sid: ref.members(sid) for sid in ids}, msgs
