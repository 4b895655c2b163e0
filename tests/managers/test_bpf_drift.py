"""BPF mode's drift repairs over the fakes, through the daemon's own wiring: a foreign hand detaches a
preamble, empties a policy slot, deletes a routes-map entry and an IP-set member, and adds a foreign
IP-set entry; the next refresh puts everything back and ``felixpy_drift_repairs`` moves by exactly
that, per kind, once; a refresh that finds nothing, ordinary changes and start of day count nothing."""

from __future__ import annotations

import ctypes
from dataclasses import replace
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from felixpy.bpf import defs
from felixpy.bpf.ipsets import member_key
from felixpy.config import Config
from felixpy.drivers import drift
from felixpy.drivers.bpfendpoints.fake import FakeBPF, fake_kernel
from .harness import Node, ipset, policy, profile, rule, tier, wep

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
BPF_KINDS = ("bpf_route", "bpf_set_member", "bpf_attachment", "bpf_policy")


@pytest.fixture(autouse=True)
def _quiet_logs() -> Any:
    """The package's fixture filters below ERROR; these tests read the warning-level repair lines."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


class Counts:
    def __init__(self) -> None:
        self.start = {k: drift.count(k) for k in drift.KINDS}

    def moved(self) -> dict[str, int]:
        return {k: int(drift.count(k) - v) for k, v in self.start.items() if drift.count(k) != v}


def refresh(n: Node) -> None:
    """What the route and IP-set refresh timers queue, then the apply that does it."""
    for d in [*n.dp.devices, *n.dp.ipsets]:
        d.queue_resync()
    n.apply()


def programmed_node() -> tuple[Node, FakeBPF]:
    fb = fake_kernel()
    n = Node(families=(4,), config=replace(Config(), BPFEnabled=True), bpf=fb)
    n.link_up("cali1")
    n.link_up("cali2")
    n.send(profile("allow"), ipset("s:x", ["10.65.9.0/24", "10.65.8.1/32"]),
           policy("p", inbound=[rule("allow", src_ip_set_ids=["s:x"])], outbound=[rule("allow")]),
           wep("a", "cali1", ipv4=["10.65.0.2/32"], tiers=[tier(ingress=["p"], egress=["p"])]),
           wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"]))
    n.apply()
    return n, fb


def drift_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "drift repaired"]


def test_start_of_day_changes_and_a_clean_refresh_are_not_drift() -> None:
    counts = Counts()
    with capture_logs() as logs:
        n, fb = programmed_node()
        refresh(n)
        n.send(ipset("s:x", ["10.65.7.0/24"]), wep("b", "cali2", ipv4=["10.65.0.4/32"], profiles=["allow"]))
        n.apply()
        refresh(n)
    assert counts.moved() == {} and not drift_lines(logs)


def test_each_kind_of_bpf_drift_is_repaired_and_counted_once() -> None:
    with capture_logs() as logs:
        _each_kind(logs)


def _each_kind(logs: list[dict[str, Any]]) -> None:
    n, fb = programmed_node()
    k = fb.kernel.maps
    idx1, idx2 = n.ifindex("cali1"), n.ifindex("cali2")
    st = k.ifstate.get(ctypes.c_uint32(idx1))
    entry = int(st.ingress_policy_v4)              # the to-workload program: TC egress of cali1
    routes_before = {bytes(kk): bytes(v) for kk, v in k.routes(False).items()}
    sid = fb.kernel.ipset_ids.get("s:x")
    assert sid is not None
    member = bytes(member_key(sid, "10.65.8.1/32", False))  # type: ignore[arg-type]
    foreign = bytes(member_key(sid, "10.65.6.6/32", False))  # type: ignore[arg-type]
    sets_before = {bytes(kk) for kk in k.ipsets(False).keys()}
    counts = Counts()

    fb.attacher.attached.pop((idx2, ING))          # a preamble detached
    k.jumps(EGR).delete(ctypes.c_uint32(entry))    # a policy slot emptied
    route_key = next(kk for kk, _v in k.routes(False).items())
    k.routes(False).delete(route_key)               # a routes-map entry deleted
    k.ipsets(False).delete(member)                  # a member deleted ...
    k.ipsets(False).set(foreign, ctypes.c_uint32(1))  # ... and a foreign one added
    assert not drift_lines(logs)
    refresh(n)
    assert counts.moved() == {"bpf_attachment": 1, "bpf_policy": 1, "bpf_route": 1, "bpf_set_member": 2}
    assert fb.attacher.is_attached("cali2", idx2, ING)
    assert k.jumps(EGR).get(ctypes.c_uint32(entry)) is not None
    assert {bytes(kk): bytes(v) for kk, v in k.routes(False).items()} == routes_before
    assert {bytes(kk) for kk in k.ipsets(False).keys()} == sets_before
    assert {tuple(sorted(set(e) & {"bpf_attachments", "bpf_policy_slots", "bpf_routes", "bpf_set_members"}))
            for e in drift_lines(logs)} == {("bpf_attachments", "bpf_policy_slots"), ("bpf_routes",),
                                             ("bpf_set_members",)}
    # Repaired once: the next refresh finds it all as it was left.
    lines = len(drift_lines(logs))
    refresh(n)
    assert counts.moved() == {"bpf_attachment": 1, "bpf_policy": 1, "bpf_route": 1, "bpf_set_member": 2}
    assert len(drift_lines(logs)) == lines


def test_a_failed_reattach_is_counted_once_when_it_finally_succeeds() -> None:
    n, fb = programmed_node()
    idx2 = n.ifindex("cali2")
    fb.attacher.attached.pop((idx2, EGR))
    counts = Counts()
    real = fb.attacher.attach_many
    calls = {"n": 0}

    def failing(reqs: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            return {r.iface: OSError("EBUSY") for r in reqs}
        return real(reqs, **kw)

    fb.attacher.attach_many = failing  # type: ignore[method-assign]
    with pytest.raises(Exception):
        refresh(n)
    assert counts.moved() == {}
    n.apply()
    assert fb.attacher.is_attached("cali2", idx2, EGR)
    assert counts.moved() == {"bpf_attachment": 1}
    refresh(n)
    assert counts.moved() == {"bpf_attachment": 1}


def test_a_refresh_of_many_endpoints_goes_a_batch_an_apply_and_repairs_them_all() -> None:
    """A big node's refresh must not hold one apply for seconds: it checks and rewrites at most a
    batch of interfaces an apply and asks for the next apply at once, until every one was checked."""
    from felixpy.drivers.bpfendpoints.driver import BPFEndpoints
    from felixpy.bpf import maptypes as mt

    fb = fake_kernel()
    n = Node(families=(4, 6), config=replace(Config(), BPFEnabled=True), bpf=fb)
    names = [f"cali{i}" for i in range(1, 6)]
    for name in names:
        n.link_up(name)
    n.send(profile("allow"), *[wep(f"w{i}", name, ipv4=[f"10.65.0.{i}/32"], ipv6=[f"fd00::{i}/128"],
                                   profiles=["allow"]) for i, name in enumerate(names, 1)])
    n.apply()
    driver = next(d for d in n.dp.devices if isinstance(d, BPFEndpoints))
    driver._resync_batch = 2
    k = fb.kernel.maps
    for name in names:  # damage on every interface: a preamble's globals and a counters entry gone
        k.ap_globals.delete(mt.ApKey(n.ifindex(name), EGR))
        k.counters.delete(mt.CountersKey(n.ifindex(name), ING))

    def repaired() -> int:
        return sum(k.ap_globals.get(mt.ApKey(n.ifindex(nm), EGR)) is not None and
                   k.counters.get(mt.CountersKey(n.ifindex(nm), ING)) is not None for nm in names)

    assert driver.next_deadline() is None
    for d in [*n.dp.devices, *n.dp.ipsets]:
        d.queue_resync()
    got = []
    for _ in range(3):
        n.apply()
        got.append((repaired(), driver.next_deadline()))
    assert got == [(2, 0.0), (4, 0.0), (5, None)]
    for name in names:
        assert fb.attacher.is_attached(name, n.ifindex(name), ING)
