"""The BPF endpoint driver loads each default-deny program once per apply, however many new
policy slots the apply fills (over the stateful fake kernel: maps, programs and attachments).

Every new slot holds default-deny before its generated program; when the policy program replaced
it, the slot's reference was the last one, so the next slot loaded default-deny again -- 4,000
program loads at 1,000 dual-stack interfaces.  The apply now holds one reference to each
default-deny program while it runs and drops it at the end.
"""

from __future__ import annotations

import ctypes

import pytest

from felixpy.bpf import defs
from felixpy.bpf.policy_ir import Action, Policy, PolicySet, PortRange, Rule, Tier
from felixpy.drivers.bpfendpoints import BPFEndpoints, WorkloadPolicy
from felixpy.drivers.bpfendpoints.driver import EndpointProgrammingFailed
from felixpy.drivers.bpfendpoints.fake import fake_kernel
from felixpy.ifacemonitor.events import IfaceState

HOOKS = (defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS)


def _policy(i: int) -> WorkloadPolicy:
    ps = PolicySet(tiers=(Tier("default", (Policy(f"p{i}", (
        Rule(Action.ALLOW, protocol=6, dst_ports=(PortRange(8000 + i, 8000 + i),)),)),)),))
    return WorkloadPolicy(to_workload=ps, from_workload=ps)


def _program(fb: object, hook: int, entry: int) -> int:
    v = fb.kernel.maps.jumps(hook).get(ctypes.c_uint32(entry))  # type: ignore[attr-defined]
    return int(v.value if hasattr(v, "value") else v)


def test_default_deny_is_loaded_once_per_family_and_hook_for_a_whole_batch() -> None:
    fb = fake_kernel()
    d = BPFEndpoints(fb.kernel)
    names = [f"cali{i}" for i in range(40)]
    for i, n in enumerate(names):
        d.on_iface_state(n, IfaceState.UP, 10 + i)
        for v in (4, 6):
            d.set_workload(v, n, _policy(i % 5))
    loads = fb.kernel.policies.stats
    d.apply()
    assert d.ready_interfaces(4) == d.ready_interfaces(6) == frozenset(names)
    # 5 policy sets x 2 hooks x 2 families, and one default-deny per hook and family.
    assert loads["loads"] == 5 * 2 * 2 + 2 * 2
    # The held default-deny programs are released with the apply: only the policies stay loaded.
    assert fb.kernel.policies.num_loaded() == 5 * 2 * 2
    live = fb.progs.live()
    for i, n in enumerate(names):
        st = fb.kernel.maps.ifstate.get(ctypes.c_uint32(10 + i))
        for hook, field in ((defs.HOOK_TC_EGRESS, "ingress_policy_v4"), (defs.HOOK_TC_INGRESS, "egress_policy_v6")):
            fd = _program(fb, hook, int(getattr(st, field)))
            assert fd in live and fb.progs.names[fd].startswith("p"), n

    # A later batch of new interfaces loads default-deny again, once per hook and family.
    more = [f"cali{i}" for i in range(40, 60)]
    for i, n in enumerate(more, start=40):
        d.on_iface_state(n, IfaceState.UP, 10 + i)
        for v in (4, 6):
            d.set_workload(v, n, _policy(i % 5))
    before = loads["loads"]
    d.apply()
    assert loads["loads"] - before == 2 * 2
    assert fb.kernel.policies.num_loaded() == 5 * 2 * 2


def test_a_failing_interface_does_not_keep_default_deny_loaded() -> None:
    fb = fake_kernel()
    d = BPFEndpoints(fb.kernel)
    for i in range(3):
        d.on_iface_state(f"cali{i}", IfaceState.UP, 10 + i)
        d.set_workload(4, f"cali{i}", _policy(i))
    fb.attacher.fail_ifaces.add("cali1")
    with pytest.raises(EndpointProgrammingFailed):
        d.apply()
    assert d.ready_interfaces(4) == frozenset({"cali0", "cali2"})
    assert fb.kernel.policies.num_loaded() == 3 * 2  # the policies only: default-deny was let go
    fb.attacher.fail_ifaces.clear()
    d.apply()
    assert d.ready_interfaces(4) == frozenset({"cali0", "cali1", "cali2"})
    assert fb.kernel.policies.num_loaded() == 3 * 2
