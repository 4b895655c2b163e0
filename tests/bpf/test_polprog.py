"""Generated policy programs, run on their own with a synthetic state (Felix's pol_prog tests).

The policy program reads only the state map, so each case writes a ``cali_tc_state`` into slot
0 of ``cali_state``, runs the program with cb[0]/cb[1] pointing at sentinel programs (return
100 on allow, 101 on deny) and compares the outcome with a Python reference model
(``refmodel.py``) over random policies and packets (hypothesis).  No bcc compile is needed.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import pathlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from felixpy.bpf import asm, defs, maps
from felixpy.bpf import maptypes as mt
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import PolicyTooLarge
from felixpy.bpf.ipsets import BPFIPSets, IPSetIDAllocator
from felixpy.bpf.policy_ir import (
    Action,
    Policy,
    PolicySet,
    PortRange,
    Profile,
    Rule,
    Tier,
)
from felixpy.bpf.polcache import PolicyBytecodeCache
from felixpy.bpf.policyload import PolicyPrograms
from felixpy.bpf.polprog import DEFAULT_MAX_JUMPS, XdpSlots
from felixpy.bpf.testrun import run_tc, run_xdp

from . import refmodel
from .refmodel import Pkt

pytestmark = pytest.mark.kernel

ALLOW_RC, DENY_RC = 100, 101
SENTINEL_ALLOW, SENTINEL_DENY = 398, 399
ENTRY = 50
UNTOUCHED = 99
ING, XDP = defs.HOOK_TC_INGRESS, defs.HOOK_XDP


def _ret(value: int, prog_type: int) -> int:
    b = asm.Block()
    b.mov64_imm(asm.R0, value)
    b.exit()
    return sc.prog_load(prog_type, b.assemble(), name=f"sentinel_{value}")


class PolEnv:
    def __init__(self, root: str) -> None:
        self.maps = maps.MapSet(root, sizes={"cali_v4_ct4": 16, "cali_v6_ct4": 16,
                                             "cali_counters6": 16}).ensure()
        self.ids = IPSetIDAllocator()
        self.ipsets = {v6: BPFIPSets(self.maps.ipsets(v6), self.ids, v6) for v6 in (False, True)}
        self.fds = []
        for hook, ptype in ((ING, sc.PROG_TYPE_SCHED_CLS), (XDP, sc.PROG_TYPE_XDP)):
            for slot, rc in ((SENTINEL_ALLOW, ALLOW_RC), (SENTINEL_DENY, DENY_RC)):
                fd = _ret(rc, ptype)
                self.maps.progs(hook).set(slot, fd)
                self.fds.append(fd)
        self.progs = PolicyPrograms(self.maps, self.ids)

    def set_members(self, members: dict[str, list[str]]) -> None:
        for s in self.ipsets.values():
            s._desired.clear()
            for name, mem in members.items():
                s.replace(name, mem)
            s.apply()

    def write_state(self, p: Pkt, v6: bool) -> None:
        st_t = mt.TcState6 if v6 else mt.TcState4
        s = st_t()
        for field, addr in (("ip_src", p.src), ("ip_dst", p.dst), ("post_nat_ip_dst", p.dst),
                            ("pre_nat_ip_dst", p.pre_nat_dst or p.dst)):
            raw = mt.addr_bytes(addr, v6)
            ctypes.memmove(getattr(s, field), raw, len(raw))
        s.ip_proto = p.proto
        s.sport = p.sport
        s.dport = p.dport
        s.pre_nat_dport = p.dport
        s.post_nat_dport = p.dport
        s.flags = defs.ST_DEST_IS_HOST if p.to_or_from_host else 0
        s.pol_rc = UNTOUCHED  # lets read_state find the CPU the program ran on
        blob = bytes(s).ljust(mt.STATE_BLOB_SIZE, b"\0")
        self.maps.state.set(0, blob)

    def read_state(self, v6: bool) -> ctypes.Structure:
        """The state as the program left it (per-CPU map: the copy it wrote to)."""
        st_t = mt.TcState6 if v6 else mt.TcState4
        copies = [st_t.from_buffer_copy(bytes(v.raw)[:ctypes.sizeof(st_t)])
                  for v in self.maps.state.get(0)]
        [touched] = [c for c in copies if c.pol_rc != UNTOUCHED]
        return touched

    def verdict(self, ps: PolicySet, p: Pkt, v6: bool, progs: PolicyPrograms | None = None) -> str:
        pp = progs or self.progs
        if ps.for_xdp:
            prog = pp.set_policy(ps, hook=XDP, entry=ENTRY, v6=v6,
                                 xdp=XdpSlots(SENTINEL_ALLOW, SENTINEL_DENY, ENTRY))
            self.write_state(p, v6)
            rc = run_xdp(prog.fds[0], b"\0" * 64).retval
            return {ALLOW_RC: "allow", DENY_RC: "deny", defs.XDP_PASS: "pass"}.get(rc, f"rc={rc}")
        prog = pp.set_policy(ps, hook=ING, entry=ENTRY, v6=v6)
        self.write_state(p, v6)
        r = run_tc(prog.fds[0], b"\0" * 64, cb=(SENTINEL_ALLOW, SENTINEL_DENY, ENTRY))
        return {ALLOW_RC: "allow", DENY_RC: "deny"}.get(r.retval, f"rc={r.retval}")

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.maps.close()


@pytest.fixture(scope="module")
def polenv() -> Iterator[PolEnv]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    with maps.private_bpffs() as root:
        e = PolEnv(root)
        try:
            yield e
        finally:
            e.close()


# ---------------------------------------------------------------------------------------------
# strategies: small universes so that matches and mismatches are both common

ADDR4 = ["10.0.0.1", "10.0.0.2", "10.0.0.5", "10.0.1.9", "192.168.3.4"]
NETS4 = ["10.0.0.0/30", "10.0.0.0/24", "10.0.0.2/32", "10.0.1.0/24", "192.168.0.0/16", "0.0.0.0/0"]


def v6ify(a: str) -> str:
    """Map the v4 universe into fd00::/64 preserving containment."""
    addr, _, plen = a.partition("/")
    n = int(ipaddress.IPv4Address(addr))
    out = str(ipaddress.IPv6Address((0xFD00 << 112) | n))
    return out + (f"/{96 + int(plen)}" if plen and int(plen) else "/0" if plen else "")


SETS = ["s:a", "s:b", "n:web"]
PROTOS = [6, 17, 1]
PORTS = st.integers(0, 12)


@st.composite
def port_ranges(draw: st.DrawFn) -> tuple[PortRange, ...]:
    out = []
    for _ in range(draw(st.integers(0, 2))):
        a = draw(PORTS)
        b = draw(st.integers(a, 12))
        out.append(PortRange(a, b))
    return tuple(out)


@st.composite
def rules(draw: st.DrawFn) -> Rule:
    opt = lambda s: draw(st.one_of(st.none(), s))  # noqa: E731
    small = lambda s: tuple(draw(st.lists(s, max_size=2, unique=True)))  # noqa: E731
    return Rule(
        action=draw(st.sampled_from([Action.ALLOW, Action.DENY, Action.PASS, Action.LOG])),
        protocol=opt(st.sampled_from(PROTOS)),
        not_protocol=opt(st.sampled_from(PROTOS)),
        src_nets=small(st.sampled_from(NETS4)),
        not_src_nets=small(st.sampled_from(NETS4[:-1])),
        dst_nets=small(st.sampled_from(NETS4)),
        not_dst_nets=small(st.sampled_from(NETS4[:-1])),
        src_ip_sets=small(st.sampled_from(SETS[:2])),
        not_src_ip_sets=small(st.sampled_from(SETS[:2])),
        dst_ip_sets=small(st.sampled_from(SETS[:2])),
        not_dst_ip_sets=small(st.sampled_from(SETS[:2])),
        src_ports=draw(port_ranges()),
        not_src_ports=draw(port_ranges()),
        dst_ports=draw(port_ranges()),
        not_dst_ports=draw(port_ranges()),
        dst_named_port_ip_sets=small(st.just("n:web")),
        not_dst_named_port_ip_sets=small(st.just("n:web")),
        icmp_type=(t := opt(st.integers(0, 3))),
        icmp_code=opt(st.integers(0, 2)) if t is not None else None,
        not_icmp_type=(nt := opt(st.integers(0, 3))),
        not_icmp_code=opt(st.integers(0, 2)) if nt is not None else None,
    )


@st.composite
def tiers(draw: st.DrawFn, max_tiers: int = 2) -> tuple[Tier, ...]:
    out = []
    for i in range(draw(st.integers(0, max_tiers))):
        pols = tuple(Policy(f"p{i}{j}", tuple(draw(st.lists(rules(), max_size=3))),
                            staged=draw(st.booleans()) and draw(st.booleans()))
                     for j in range(draw(st.integers(1, 2))))
        out.append(Tier(f"t{i}", pols, draw(st.sampled_from([Action.DENY, Action.PASS]))))
    return tuple(out)


@st.composite
def profiles(draw: st.DrawFn) -> tuple[Profile, ...]:
    return tuple(Profile(f"pr{i}", tuple(draw(st.lists(rules(), max_size=3))))
                 for i in range(draw(st.integers(0, 2))))


@st.composite
def packets(draw: st.DrawFn) -> Pkt:
    proto = draw(st.sampled_from(PROTOS + [47]))
    if proto == 1:
        t, c = draw(st.integers(0, 3)), draw(st.integers(0, 2))
        return Pkt(draw(st.sampled_from(ADDR4)), draw(st.sampled_from(ADDR4)), proto, 0,
                   t | c << 8, t, c, draw(st.booleans()))
    return Pkt(draw(st.sampled_from(ADDR4)), draw(st.sampled_from(ADDR4)), proto,
               draw(PORTS), draw(PORTS), 0, 0, draw(st.booleans()))


@st.composite
def members(draw: st.DrawFn) -> dict[str, list[str]]:
    return {
        "s:a": draw(st.lists(st.sampled_from(NETS4[:-1] + ADDR4), max_size=3)),
        "s:b": draw(st.lists(st.sampled_from(ADDR4), max_size=3)),
        "n:web": draw(st.lists(st.builds(lambda a, p, pr: f"{a},{pr}:{p}", st.sampled_from(ADDR4),
                                         PORTS, st.sampled_from(["tcp", "udp"])), max_size=3)),
    }


def to_v6(x):  # type: ignore[no-untyped-def]
    """Translate a v4 PolicySet/Pkt/members into the v6 universe."""
    from dataclasses import fields, is_dataclass, replace

    if isinstance(x, Pkt):
        return replace(x, src=v6ify(x.src), dst=v6ify(x.dst),
                       proto=58 if x.proto == 1 else x.proto)
    if isinstance(x, dict):
        return {k: [v6ify(m.partition(",")[0]) + ("," + m.partition(",")[2] if "," in m else "")
                    for m in v] for k, v in x.items()}
    if isinstance(x, Rule):
        kw = {}
        for f in ("src_nets", "not_src_nets", "dst_nets", "not_dst_nets"):
            kw[f] = tuple(v6ify(n) for n in getattr(x, f))
        for f in ("protocol", "not_protocol"):
            if getattr(x, f) == 1:
                kw[f] = 58
        return replace(x, **kw)
    if is_dataclass(x):
        kw = {}
        for f in fields(x):
            v = getattr(x, f.name)
            if isinstance(v, tuple):
                kw[f.name] = tuple(to_v6(i) for i in v)
        return replace(x, **kw)
    return x


SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("v6", [False, True], ids=["v4", "v6"])
@SETTINGS
@given(t=tiers(), pr=profiles(), pkts=st.lists(packets(), min_size=1, max_size=4), mem=members())
def test_workload_policy_matches_reference(polenv: PolEnv, v6: bool, t, pr, pkts, mem) -> None:
    ps = PolicySet(tiers=t, profiles=pr)
    if v6:
        ps, mem, pkts = to_v6(ps), to_v6(mem), [to_v6(p) for p in pkts]
    polenv.set_members(mem)
    for p in pkts:
        assert polenv.verdict(ps, p, v6) == refmodel.evaluate(ps, p, mem, v6), p


@SETTINGS
@given(pre=tiers(1), fwd=tiers(1), normal=tiers(1), hprof=profiles(),
       pkts=st.lists(packets(), min_size=1, max_size=4), mem=members(), suppress=st.booleans(),
       host_iface=st.booleans(), wt=tiers(1))
def test_host_policy_matches_reference(polenv: PolEnv, pre, fwd, normal, hprof, pkts, mem,
                                       suppress, host_iface, wt) -> None:
    pre = tuple(Tier(t.name, t.policies, Action.PASS) for t in pre)  # pre-DNAT never drops at end
    ps = PolicySet(tiers=wt, for_host_interface=host_iface, host_pre_dnat_tiers=pre,
                   host_forward_tiers=fwd, host_normal_tiers=normal, host_profiles=hprof,
                   suppress_normal_host_policy=suppress)
    polenv.set_members(mem)
    for p in pkts:
        assert polenv.verdict(ps, p, False) == refmodel.evaluate(ps, p, mem, False), p


@SETTINGS
@given(t=tiers(2), pkts=st.lists(packets(), min_size=1, max_size=4), mem=members())
def test_xdp_policy_matches_reference(polenv: PolEnv, t, pkts, mem) -> None:
    t = tuple(Tier(x.name, x.policies, Action.PASS) for x in t)
    ps = PolicySet(for_host_interface=True, for_xdp=True, suppress_normal_host_policy=False,
                   host_normal_tiers=t)
    polenv.set_members(mem)
    for p in pkts:
        assert polenv.verdict(ps, p, False) == refmodel.evaluate(ps, p, mem, False), p


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(t=tiers(3), pr=profiles(), pkts=st.lists(packets(), min_size=1, max_size=4), mem=members())
def test_split_programs_match_reference(polenv: PolEnv, t, pr, pkts, mem) -> None:
    """A tiny jump budget forces splitting into many sub-programs; verdicts must not change."""
    small = PolicyPrograms(polenv.maps, polenv.ids, max_jumps=8)
    ps = PolicySet(tiers=t, profiles=pr)
    polenv.set_members(mem)
    try:
        for p in pkts:
            assert polenv.verdict(ps, p, False, small) == refmodel.evaluate(ps, p, mem, False), p
    except PolicyTooLarge:
        reject()  # more than 24 parts at this artificial budget
    finally:
        small.uninstall(ING, ENTRY)


# ---------------------------------------------------------------------------------------------
# specific behaviours


def test_pol_rc_and_log_flag(polenv: PolEnv) -> None:
    p = Pkt("10.0.0.1", "10.0.0.2", 6, 1, 80)
    ps = PolicySet(profiles=(Profile("x", (Rule(Action.LOG), Rule(Action.ALLOW, protocol=6))),))
    assert polenv.verdict(ps, p, False) == "allow"
    s = polenv.read_state(False)
    assert s.pol_rc == defs.POL_ALLOW
    assert s.flags & defs.ST_LOG_PACKET
    assert polenv.verdict(PolicySet(), p, False) == "deny"
    assert polenv.read_state(False).pol_rc == defs.POL_DENY


def test_identical_policy_shares_one_program(polenv: PolEnv) -> None:
    pp = PolicyPrograms(polenv.maps, polenv.ids)
    ps1 = PolicySet(profiles=(Profile("x", (Rule(Action.ALLOW, protocol=6),)),))
    ps2 = PolicySet(profiles=(Profile("x", (Rule(Action.ALLOW, protocol=6),)),))  # equal value
    a = pp.set_policy(ps1, hook=ING, entry=60, v6=False)
    b = pp.set_policy(ps2, hook=ING, entry=61, v6=False)
    assert a is b and a.refs == 2 and pp.stats["loads"] == 1
    c = pp.set_policy(PolicySet(), hook=ING, entry=62, v6=False)
    assert c is not a and pp.stats["loads"] == 2
    assert pp.set_policy(ps1, hook=ING, entry=63, v6=True) is not a  # family is part of the key
    pp.uninstall(ING, 60)
    assert a.refs == 1 and a.fds  # still in slot 61
    pp.uninstall(ING, 61)
    assert a.refs == 0 and not a.fds  # last slot released: program closed
    for e in (62, 63):
        pp.uninstall(ING, e)
    assert pp.loaded_programs() == []


def test_replacing_a_split_policy_removes_stale_parts(polenv: PolEnv) -> None:
    pp = PolicyPrograms(polenv.maps, polenv.ids, max_jumps=4)
    big = PolicySet(profiles=(Profile("x", tuple(Rule(Action.DENY, protocol=6, dst_ports=(PortRange(i, i),))
                                                  for i in range(1, 20))),))
    prog = pp.set_policy(big, hook=ING, entry=70, v6=False)
    assert len(prog.fds) > 3
    jm = polenv.maps.jumps(ING)
    stride = defs.TC_POLICY_STRIDE
    assert all(jm.get(70 + k * stride) is not None for k in range(len(prog.fds)))
    pp.set_policy(PolicySet(), hook=ING, entry=70, v6=False)
    assert jm.get(70) is not None
    assert all(jm.get(70 + k * stride) is None for k in range(1, len(prog.fds)))
    pp.uninstall(ING, 70)


@pytest.mark.parametrize("v6", [False, True], ids=["v4", "v6"])
def test_thousand_rule_policy_loads(polenv: PolEnv, v6: bool) -> None:
    """Hundreds of rules with several criteria each still load (split as the limits demand)."""
    n = 1000
    nets = [f"10.{i // 250}.{i % 250}.0/24" for i in range(n)]
    if v6:
        nets = [f"fd00:{i:x}::/64" for i in range(n)]
    rs = tuple(Rule(Action.ALLOW, protocol=6, src_nets=(nets[i], nets[(i + 7) % n]),
                    dst_ports=(PortRange(1000 + i, 1000 + i), PortRange(5000, 5010)))
               for i in range(n))
    ps = PolicySet(tiers=(Tier("t", (Policy("big", rs),)),))
    pp = PolicyPrograms(polenv.maps, polenv.ids)
    last_src = str(ipaddress.ip_network(nets[n - 1]).network_address + 1)
    dst = "fd00::1" if v6 else "10.255.0.1"
    assert polenv.verdict(ps, Pkt(last_src, dst, 6, 1, 1000 + n - 1), v6, pp) == "allow"
    assert polenv.verdict(ps, Pkt(last_src, dst, 6, 1, 999), v6, pp) == "deny"
    prog = pp.installed(ING, ENTRY)
    assert prog is not None and sum(prog.insn_counts) > 10000
    pp.uninstall(ING, ENTRY)


@pytest.mark.parametrize("max_jumps", [DEFAULT_MAX_JUMPS, 8], ids=["whole", "split"])
def test_a_program_from_the_bytecode_cache_loads_and_decides_as_the_generated_one(
        polenv: PolEnv, tmp_path: pathlib.Path, max_jumps: int) -> None:
    """Stored by one loader, loaded by another whose maps are other fds (the pins opened again, as a
    new process opens them): the kernel takes it, gives it the generated program's tag and maps, and
    it decides every packet as the reference model does."""
    ps = PolicySet(tiers=(Tier("t", (Policy("p", (
        Rule(Action.DENY, protocol=6, src_ip_sets=("s:bad",)),
        Rule(Action.ALLOW, protocol=6, src_nets=("10.1.0.0/16", "fd00:1::/64"), dst_ports=(PortRange(80, 90),)),
        Rule(Action.ALLOW, protocol=17, dst_ip_sets=("s:dns",), dst_ports=(PortRange(53, 53),)))),)),),
        profiles=(Profile("kns.x", (Rule(Action.DENY),)),))
    mem = {"s:bad": ["10.1.2.3/32", "fd00:1::3/128"], "s:dns": ["10.9.9.9/32", "fd00:9::9/128"]}
    polenv.set_members(mem)
    cache = PolicyBytecodeCache(str(tmp_path))
    first = PolicyPrograms(polenv.maps, polenv.ids, max_jumps=max_jumps, bytecode_cache=cache)
    again = maps.MapSet(polenv.maps.pin_root, sizes=dict(polenv.maps.sizes)).ensure()
    second = PolicyPrograms(again, polenv.ids, max_jumps=max_jumps, bytecode_cache=cache)
    try:
        assert again.state.fd != polenv.maps.state.fd
        for v6 in (False, True):
            a = first.acquire(ps, hook=ING, v6=v6)
            b = second.acquire(ps, hook=ING, v6=v6)
            assert len(a.fds) == len(b.fds) and (len(a.fds) > 1) == (max_jumps == 8)
            for fa, fb in zip(a.fds, b.fds):
                ia, ib = sc.prog_info(fa), sc.prog_info(fb)
                assert ia.tag == ib.tag and sorted(ia.map_ids) == sorted(ib.map_ids)
            pkts = [Pkt("10.1.2.3" if not v6 else "fd00:1::3", "10.0.0.1" if not v6 else "fd00::1", 6, 1234, 80),
                    Pkt("10.1.2.4" if not v6 else "fd00:1::4", "10.0.0.1" if not v6 else "fd00::1", 6, 1234, 85),
                    Pkt("10.1.2.4" if not v6 else "fd00:1::4", "10.0.0.1" if not v6 else "fd00::1", 6, 1234, 95),
                    Pkt("10.7.0.1" if not v6 else "fd00:7::1", "10.9.9.9" if not v6 else "fd00:9::9", 17, 999, 53),
                    Pkt("10.7.0.1" if not v6 else "fd00:7::1", "10.9.9.8" if not v6 else "fd00:9::8", 17, 999, 53)]
            for p in pkts:
                assert polenv.verdict(ps, p, v6, second) == refmodel.evaluate(ps, p, mem, v6), p
            second.uninstall(ING, ENTRY)
            second.release(b)
            first.release(a)
        assert second.stats["cached"] == 2 and second.stats["generated"] == 0
        assert first.stats["generated"] == 2
    finally:
        again.close()
