"""Policy programs loaded ahead (:meth:`PolicyPrograms.loading_ahead`): generated on the caller's
thread, loaded on the loader thread while the caller goes on, and taken by :meth:`acquire`; and
their sources written in the background.  Over the stateful fake kernel: these tests pin that
loading ahead changes when programs load, never which programs end up where, that nothing it
loads outlives it unless acquired, and that a background write never brings back the source of
a program released meanwhile."""

from __future__ import annotations

import ctypes
import errno
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from felixpy.bpf import defs
from felixpy.bpf.errors import BPFSyscallError
from felixpy.bpf.policy_ir import Action, Policy, PolicySet, PortRange, Rule, Tier
from felixpy.bpf.policyload import PolicyPrograms
from felixpy.bpf.polsource import MemorySources
from felixpy.drivers.bpfendpoints import BPFEndpoints, WorkloadPolicy
from felixpy.drivers.bpfendpoints.fake import FakeBPF, fake_kernel
from felixpy.ifacemonitor.events import IfaceState

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
LOADER = "bpf-prog-load"


def _ps(i: int, ipset: str | None = None) -> PolicySet:
    rule = Rule(Action.ALLOW, protocol=6, dst_ports=(PortRange(8000 + i, 8000 + i),),
                src_ip_sets=(ipset,) if ipset else ())
    return PolicySet(tiers=(Tier("default", (Policy(f"p{i}", (rule,)),)),))


def _policy_loads(fb: FakeBPF) -> list[tuple[str, str]]:
    """The policy programs' loads (not the preambles'), in order: program name, thread."""
    return [(n, t) for n, t in fb.progs.load_threads if n[:2] in ("p4", "p6")]


def _on_loader(fb: FakeBPF) -> list[bool]:
    return [t.startswith(LOADER) for _n, t in _policy_loads(fb)]


@pytest.mark.parametrize("v6", [False, True], ids=["v4", "v6"])
def test_programs_loaded_ahead_are_the_ones_acquire_returns(v6: bool) -> None:
    fb = fake_kernel()
    pol: PolicyPrograms = fb.kernel.policies
    wanted = [(_ps(i, f"s{i}"), hook, v6) for i in range(4) for hook in (ING, EGR)]
    with pol.loading_ahead(wanted) as n:
        assert n == 8
        progs = [pol.acquire(ps, hook=hook, v6=v6) for ps, hook, _ in wanted]
        assert pol.acquire(*wanted[0][:1], hook=ING, v6=v6) is progs[0]  # now an ordinary cache hit
    assert _on_loader(fb) == [True] * 8  # every load on the loader thread, none twice
    assert pol.stats["loads"] == 8 and pol.num_loaded() == 8
    assert all(fd in fb.progs.live() for p in progs for fd in p.fds)
    assert all(p.name.startswith(f"p{6 if v6 else 4}{'i' if h == ING else 'e'}_")
               for p, (_ps_, h, _v6) in zip(progs, wanted))

    # The same programs, loaded one by one in a fresh process over the same inputs, get the same names
    # (the name is the hash of the whole key, IP-set ids included: the ids were allocated alike).
    fb2 = fake_kernel()
    pol2 = fb2.kernel.policies
    again = [pol2.acquire(ps, hook=hook, v6=v6) for ps, hook, _ in wanted]
    assert [p.name for p in again] == [p.name for p in progs]
    assert _on_loader(fb2) == [False] * 8


def test_programs_nobody_acquired_are_closed_at_the_end() -> None:
    fb = fake_kernel()
    pol = fb.kernel.policies
    wanted = [(_ps(i), ING, False) for i in range(3)]
    with pol.loading_ahead(wanted):
        kept = pol.acquire(_ps(0), hook=ING, v6=False)
    assert pol.num_loaded() == 1 and pol.stats["loads"] == 1
    assert fb.progs.live() == set(kept.fds)  # the two loaded ahead and not taken are closed
    assert len(fb.progs.load_threads) == 3
    assert not pol.sources.names() or pol.sources.names() == [kept.name]  # no source for the closed ones


def test_a_failed_load_is_raised_by_the_acquire_that_takes_it_and_the_others_load() -> None:
    fb = fake_kernel()
    pol = fb.kernel.policies
    wanted = [(_ps(i), EGR, False) for i in range(3)]
    fb.progs.fail_next_load = errno.E2BIG  # the first of them
    with pol.loading_ahead(wanted):
        with pytest.raises(BPFSyscallError) as err:
            pol.acquire(_ps(0), hook=EGR, v6=False)
        assert err.value.errno == errno.E2BIG
        others = [pol.acquire(_ps(i), hook=EGR, v6=False) for i in (1, 2)]
        retried = pol.acquire(_ps(0), hook=EGR, v6=False)  # loaded again, now, by this acquire
    assert _on_loader(fb) == [True, True, True, False]  # the failed one, the two others, the retry
    assert fb.progs.live() == {fd for p in (*others, retried) for fd in p.fds}


def test_a_program_that_fails_to_generate_ahead_is_generated_by_its_acquire(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fb = fake_kernel()
    pol = fb.kernel.policies
    real = pol._build
    failing = {_ps(1)}

    def build(key, key_repr, ps, hook, v6, xdp):  # type: ignore[no-untyped-def]
        if ps in failing:
            failing.clear()  # once
            raise RuntimeError("generator fell over")
        return real(key, key_repr, ps, hook, v6, xdp)

    monkeypatch.setattr(pol, "_build", build)
    wanted = [(_ps(i), ING, False) for i in range(3)]
    with pol.loading_ahead(wanted) as n:
        assert n == 2
        progs = [pol.acquire(ps, hook=hook, v6=v6) for ps, hook, v6 in wanted]
    by_name = dict(_policy_loads(fb))
    assert [by_name[p.name].startswith(LOADER) for p in progs] == [True, False, True]
    assert pol.num_loaded() == 3 and fb.progs.live() == {fd for p in progs for fd in p.fds}


def test_loaded_or_single_programs_are_not_loaded_ahead() -> None:
    fb = fake_kernel()
    pol = fb.kernel.policies
    first = pol.acquire(_ps(0), hook=ING, v6=False)
    with pol.loading_ahead([(_ps(0), ING, False), (_ps(0), ING, False), (_ps(1), ING, False)]) as n:
        assert n == 0  # one program to load: nothing to overlap it with
        assert pol.acquire(_ps(0), hook=ING, v6=False) is first
    assert _on_loader(fb) == [False]


def _node(loading_ahead: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[BPFEndpoints, FakeBPF]:
    fb = fake_kernel()
    if not loading_ahead:
        real = fb.kernel.policies.loading_ahead
        monkeypatch.setattr(fb.kernel.policies, "loading_ahead", lambda wanted: real([]))
    return BPFEndpoints(fb.kernel), fb


def _slots(d: BPFEndpoints, fb: FakeBPF, names: list[str]) -> dict[tuple[str, int, int], str]:
    """Each interface's policy slots, as the names of the programs they hold."""
    out = {}
    for i, n in enumerate(names):
        st = fb.kernel.maps.ifstate.get(ctypes.c_uint32(10 + i))
        for hook, fields in ((EGR, ("ingress_policy_v4", "ingress_policy_v6")),
                             (ING, ("egress_policy_v4", "egress_policy_v6"))):
            for v, f in zip((4, 6), fields):
                v_ = fb.kernel.maps.jumps(hook).get(ctypes.c_uint32(int(getattr(st, f))))
                out[n, hook, v] = fb.progs.names[int(v_.value if hasattr(v_, "value") else v_)]
    return out


def test_the_driver_programs_the_same_slots_with_and_without_loading_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"cali{i}" for i in range(12)]
    results = []
    for ahead in (True, False):
        d, fb = _node(ahead, monkeypatch)
        for i, n in enumerate(names):
            d.on_iface_state(n, IfaceState.UP, 10 + i)
            for v in (4, 6):
                d.set_workload(v, n, WorkloadPolicy(to_workload=_ps(i % 4, f"s{i % 2}"), from_workload=_ps(i % 5)))
        d.apply()
        first = _slots(d, fb, names)
        loads = _policy_loads(fb)
        # A policy change for three of them: only their new programs load, and into the same slots.
        for n in names[:3]:
            for v in (4, 6):
                d.set_workload(v, n, WorkloadPolicy(to_workload=_ps(7, "s9"), from_workload=_ps(8)))
        d.apply()
        later = _policy_loads(fb)[len(loads):]
        results.append((first, _slots(d, fb, names), later, fb.progs.live()))
        # (4 + 5 policy sets) x 2 families, and default-deny per hook and family; all ahead or none.
        assert _on_loader(fb) == [ahead] * (9 * 2 + 4 + 4)
    (first_a, second_a, later_a, live_a), (first_b, second_b, later_b, live_b) = results
    assert first_a == first_b and second_a == second_b
    assert sorted(later_a) != sorted(later_b)  # (the threads differ)
    assert sorted(n for n, _t in later_a) == sorted(n for n, _t in later_b)
    assert len(later_a) == 4  # 2 new policy sets x 2 families
    assert len(live_a) == len(live_b)
    assert d.ready_interfaces(6) == frozenset(names)


# -- sources written in the background ------------------------------------------------------------


def test_a_background_flush_writes_on_the_writer_and_skips_programs_released_meanwhile() -> None:
    fb = fake_kernel()
    pol = fb.kernel.policies
    gate = threading.Event()
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="writer")
    writer.submit(gate.wait)  # the writer is busy until the gate opens
    pol.writer = writer
    store = pol.sources
    assert isinstance(store, MemorySources)
    threads: list[str] = []
    real = store.write

    def write(name: str, blob: bytes) -> None:
        threads.append(threading.current_thread().name)
        real(name, blob)

    store.write = write  # type: ignore[method-assign]
    try:
        with pol.deferred_writes(background=True):
            kept = pol.acquire(_ps(0), hook=ING, v6=False)
            gone = pol.acquire(_ps(1), hook=EGR, v6=True)
        assert store.names() == []  # left the block: queued on the writer, not written
        pol.release(gone)  # while its write is queued: the write must not bring its source back
        gate.set()
        pol.wait_for_writes()
        assert store.names() == [kept.name] and threads == ["writer_0"]
    finally:
        gate.set()
        writer.shutdown()
