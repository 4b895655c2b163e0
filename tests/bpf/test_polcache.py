"""The policy-program bytecode cache (:mod:`felixpy.bpf.polcache`) and the deferred source writes
(:meth:`PolicyPrograms.deferred_writes`), over the fakes: a cached program is byte for byte what the
generator gives with this process's map fds, anything that does not verify is regenerated and
rewritten, the cache stays bounded, and a source written after the attach never lets a restart keep
a wrong program."""

from __future__ import annotations

import ctypes
import os
import pathlib

import pytest

from felixpy.bpf import defs, polcache, progtag
from felixpy.bpf.policy_ir import ALLOW_ALL, DENY_ALL, Action, Policy, PolicySet, Profile, Rule, Tier, ports
from felixpy.bpf.policyload import PolicyPrograms, generator_fingerprint
from felixpy.bpf.polsource import MemorySources, parse_source
from felixpy.bpf.polcache import PolicyBytecodeCache
from felixpy.bpf.polprog import PolicyProgramBuilder, ProgramMaps, XdpSlots
from felixpy.drivers.bpfendpoints import BPFEndpoints, WorkloadPolicy
from felixpy.drivers.bpfendpoints.fake import FakeBPF, fake_kernel
from felixpy.ifacemonitor.events import IfaceState

ING, EGR, XDP = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS, defs.HOOK_XDP


def _rules(n: int, *, sets: bool = True) -> tuple[Rule, ...]:
    return tuple(Rule(Action.ALLOW if i % 3 else Action.DENY, protocol=6,
                      src_nets=(f"10.{i}.0.0/16", f"fd00:{i:x}::/64"), dst_ports=ports(80 + i, (9000, 9000 + i)),
                      src_ip_sets=(f"s:{i % 4}",) if sets else (), not_dst_ip_sets=("s:x",) if sets and i % 5 == 0 else ())
                 for i in range(n))


SETS = {
    "allow-all": ALLOW_ALL,
    "deny-all": DENY_ALL,
    "workload": PolicySet(tiers=(Tier("default", (Policy("p", _rules(12)),)),),
                          profiles=(Profile("kns.a", (Rule(Action.ALLOW, dst_named_port_ip_sets=("n:http",)),)),)),
    "host": PolicySet(host_pre_dnat_tiers=(Tier("t", (Policy("pre", _rules(3)),), Action.PASS),),
                      host_normal_tiers=(Tier("t", (Policy("h", _rules(5, sets=False)),)),),
                      host_forward_tiers=(Tier("t", (Policy("f", _rules(2)),)),),
                      host_profiles=(Profile("hp", (Rule(Action.ALLOW, icmp_type=8),)),),
                      for_host_interface=True, suppress_normal_host_policy=False),
}


def programs(fb: FakeBPF, cache: PolicyBytecodeCache | None, **kw: object) -> tuple[PolicyPrograms, list[bytes]]:
    """A policy-program loader over *fb*'s maps, recording every instruction text the kernel was given."""
    loaded: list[bytes] = []

    def load(prog_type: int, insns: bytes, *, name: str = "", **rest: object) -> int:
        loaded.append(insns)
        return fb.progs.load(prog_type, insns, name=name)

    pp = PolicyPrograms(fb.kernel.maps, prog_load=load, close_fd=fb.progs.close, prog_fd_by_id=fb.progs.fd_by_id,
                        prog_info=fb.progs.info, map_id=lambda fd: fd, sources=MemorySources(),
                        bytecode_cache=cache, **kw)  # type: ignore[arg-type]
    return pp, loaded


def fresh(pp: PolicyPrograms, ps: PolicySet, hook: int, v6: bool, xdp: XdpSlots | None = None) -> list[bytes]:
    """What the generator gives for *ps* with *pp*'s maps (no cache in the way)."""
    m = pp.maps
    builder = PolicyProgramBuilder(ProgramMaps(m.state.fd, m.ipsets(v6).fd, m.progs(hook).fd, m.jumps(hook).fd),
                                   pp.ipset_ids.get_or_alloc, v6=v6, xdp=xdp, max_jumps=pp.max_jumps,
                                   max_insns=pp.max_insns)
    return builder.build(ps)


CASES = [(name, hook, v6) for name in SETS for hook in (ING, EGR) for v6 in (False, True)]


def test_a_cached_program_is_the_fresh_build_with_this_processs_map_fds(tmp_path: pathlib.Path) -> None:
    """Stored by one process, loaded by another whose maps have other fds: every part is exactly what
    the generator gives in the second process -- both families, both TC hooks, XDP, split programs."""
    cases = [(SETS[n], h, v6, None) for n, h, v6 in CASES]
    cases += [(PolicySet(host_normal_tiers=SETS["host"].host_normal_tiers, for_xdp=True, for_host_interface=True,
                         suppress_normal_host_policy=False), XDP, v6, XdpSlots(allow=3, deny=4, entry=7))
              for v6 in (False, True)]
    first, loaded1 = programs(fake_kernel(), PolicyBytecodeCache(str(tmp_path)), max_jumps=16)
    for ps, hook, v6, xdp in cases:
        first.acquire(ps, hook=hook, v6=v6, xdp=xdp)
    assert first.stats["generated"] == len(cases) and first.stats["cached"] == 0
    assert any(len(first.loaded_programs()[i].fds) > 1 for i in range(len(cases)))  # some are split

    second, loaded2 = programs(fake_kernel(), PolicyBytecodeCache(str(tmp_path)), max_jumps=16)
    assert second.maps.state.fd != first.maps.state.fd  # another process's fds
    for ps, hook, v6, xdp in cases:  # (in the first's order: the IP sets get the same ids)
        second.acquire(ps, hook=hook, v6=v6, xdp=xdp)
    assert second.stats["cached"] == len(cases) and second.stats["generated"] == 0
    want = [part for ps, hook, v6, xdp in cases for part in fresh(second, ps, hook, v6, xdp)]
    assert loaded2 == want
    assert loaded2 != loaded1  # (the fds really differ: a cache that kept them would fail above)


def test_the_key_covers_every_input(tmp_path: pathlib.Path) -> None:
    """Another hook, family, IP-set id, size limit or generator is another entry: never a hit."""
    cache = PolicyBytecodeCache(str(tmp_path))
    ps = SETS["workload"]
    pp, _ = programs(fake_kernel(), cache)
    pp.acquire(ps, hook=ING, v6=False)
    for hook, v6, kw in ((EGR, False, {}), (ING, True, {}), (ING, False, {"max_jumps": 8}),
                         (ING, False, {"max_insns": 100})):
        other, _ = programs(fake_kernel(), cache, **kw)
        other.acquire(ps, hook=hook, v6=v6)
        assert other.stats["cached"] == 0 and other.stats["generated"] == 1
    renumbered, _ = programs(fake_kernel(), cache)
    ids = renumbered.ipset_ids  # another process that numbered one set differently (its hash was taken)
    ids._by_name["s:0"], ids._by_id[7] = 7, "s:0"
    renumbered.acquire(ps, hook=ING, v6=False)
    assert renumbered.stats["cached"] == 0
    newer, _ = programs(fake_kernel(), cache, generator=lambda: "another version")
    newer.acquire(ps, hook=ING, v6=False)
    assert newer.stats["cached"] == 0
    same, _ = programs(fake_kernel(), cache)
    same.acquire(ps, hook=ING, v6=False)
    assert same.stats["cached"] == 1


def test_without_a_generator_fingerprint_the_cache_is_not_used(tmp_path: pathlib.Path) -> None:
    cache = PolicyBytecodeCache(str(tmp_path))
    for _ in range(2):
        pp, _ = programs(fake_kernel(), cache, generator=lambda: "")
        pp.acquire(ALLOW_ALL, hook=ING, v6=False)
        assert pp.stats["generated"] == 1 and pp.stats["cached"] == 0
    assert cache.stats["stored"] == 0


def _only_entry(tmp_path: pathlib.Path) -> pathlib.Path:
    (entry,) = (tmp_path / polcache.SUBDIR).iterdir()
    return entry


@pytest.mark.parametrize("damage", ["flip a code byte", "flip a header byte", "truncate", "empty", "other format",
                                    "other key", "relocation moved"])
def test_a_damaged_or_stale_entry_is_never_loaded_but_regenerated_and_rewritten(tmp_path: pathlib.Path,
                                                                             damage: str) -> None:
    ps = SETS["workload"]
    first, _ = programs(fake_kernel(), PolicyBytecodeCache(str(tmp_path)))
    first.acquire(ps, hook=ING, v6=False)
    entry = _only_entry(tmp_path)
    good = entry.read_bytes()
    blob = bytearray(good)
    head = polcache._HEAD.size
    if damage == "flip a code byte":
        blob[-20] ^= 0x01
    elif damage == "flip a header byte":
        blob[head + 5] ^= 0x20
    elif damage == "truncate":
        del blob[len(blob) // 2:]
    elif damage == "empty":
        blob = bytearray()
    elif damage == "other format":
        blob[8] += 1
    else:
        # A well-formed entry (valid checksum) that is wrong: another key's entry under this name, or
        # relocations that do not point at the map loads.
        parts = first.loaded_programs()[0]
        pm = ProgramMaps(first.maps.state.fd, first.maps.ipsets(False).fd, first.maps.progs(ING).fd,
                         first.maps.jumps(ING).fd)
        code = fresh(first, ps, ING, False)
        assert len(code) == len(parts.fds)
        if damage == "other key":
            blob = bytearray(polcache.encode("0" * 64, code, pm) or b"")
        else:
            import json
            import hashlib
            raw = bytes(polcache.encode(entry.stem, code, pm) or b"")
            hlen = polcache._HEAD.unpack_from(raw)[3]
            header = json.loads(raw[head:head + hlen])
            header["maps"][0][1] += 1
            hb = json.dumps(header, separators=(",", ":")).encode()
            rest = hb + raw[head + hlen:]
            blob = bytearray(polcache._HEAD.pack(polcache.MAGIC, polcache.FORMAT, hashlib.sha256(rest).digest(),
                                                 len(hb)) + rest)
    entry.write_bytes(bytes(blob))

    cache = PolicyBytecodeCache(str(tmp_path))
    second, loaded = programs(fake_kernel(), cache)
    second.acquire(ps, hook=ING, v6=False)
    assert second.stats["cached"] == 0 and second.stats["generated"] == 1
    assert cache.stats["rejected"] == 1 and cache.stats["stored"] == 1
    assert loaded == fresh(second, ps, ING, False)
    assert entry.read_bytes() == good  # rewritten: the next start loads it again
    third, _ = programs(fake_kernel(), PolicyBytecodeCache(str(tmp_path)))
    third.acquire(ps, hook=ING, v6=False)
    assert third.stats["cached"] == 1


def test_only_what_the_kernel_loaded_is_cached(tmp_path: pathlib.Path) -> None:
    cache = PolicyBytecodeCache(str(tmp_path))
    pp, _ = programs(fake_kernel(), cache)

    def refuse(*_a: object, **_k: object) -> int:
        raise OSError(22, "verifier says no")

    pp.prog_load = refuse
    with pytest.raises(OSError):
        pp.acquire(ALLOW_ALL, hook=ING, v6=False)
    assert cache.stats["stored"] == 0 and not (tmp_path / polcache.SUBDIR).exists()


def test_the_cache_is_bounded_and_keeps_what_was_used_last(tmp_path: pathlib.Path) -> None:
    cache = PolicyBytecodeCache(str(tmp_path), max_entries=8)
    pp, _ = programs(fake_kernel(), cache)
    sets = [PolicySet(profiles=(Profile(f"p{i}", (Rule(Action.ALLOW, protocol=6, dst_ports=ports(i + 1)),)),))
            for i in range(20)]
    pp.acquire(sets[0], hook=ING, v6=False)
    first = _only_entry(tmp_path)
    for i, ps in enumerate(sets[1:], 1):
        # Entries written a second apart, and the first one used again each time: most recent of all.
        os.utime(first, (1000 + i * 10, 1000 + i * 10))
        for e in (tmp_path / polcache.SUBDIR).iterdir():
            if e != first and e.stat().st_mtime > 100000:
                os.utime(e, (1000 + i * 10 - 5, 1000 + i * 10 - 5))
        pp.acquire(ps, hook=ING, v6=False)
        names = os.listdir(tmp_path / polcache.SUBDIR)
        assert len(names) <= 8 and first.name in names
    assert cache.stats["evicted"] >= 12
    assert not [n for n in os.listdir(tmp_path / polcache.SUBDIR) if not n.endswith(".bin")]  # no temp files

    by_bytes = PolicyBytecodeCache(str(tmp_path / "b"), max_bytes=3 * first.stat().st_size)
    pp2, _ = programs(fake_kernel(), by_bytes)
    for ps in sets[:6]:
        pp2.acquire(ps, hook=EGR, v6=False)
    total = sum(e.stat().st_size for e in (tmp_path / "b" / polcache.SUBDIR).iterdir())
    assert total <= 3 * first.stat().st_size


def test_what_a_crashed_writer_left_is_swept(tmp_path: pathlib.Path) -> None:
    d = tmp_path / polcache.SUBDIR
    d.mkdir()
    old, recent = d / ".tmp-abc.123", d / ".tmp-def.456"
    for f in (old, recent):
        f.write_bytes(b"half an entr")
    os.utime(old, (1000, 1000))
    pp, _ = programs(fake_kernel(), PolicyBytecodeCache(str(tmp_path)))
    pp.acquire(ALLOW_ALL, hook=ING, v6=False)
    assert not old.exists() and recent.exists()  # (a recent one may be another writer's, mid-write)
    assert len([n for n in os.listdir(d) if n.endswith(".bin")]) == 1


def test_a_cache_directory_that_cannot_be_written_only_costs_generation(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    pp, _ = programs(fake_kernel(), PolicyBytecodeCache(str(blocker)))
    prog = pp.acquire(ALLOW_ALL, hook=ING, v6=False)
    assert prog.fds and pp.stats["generated"] == 1


# -- deferred source writes -------------------------------------------------------------------------


def test_inside_deferred_writes_sources_wait_for_the_flush_and_a_released_program_drops_its_write() -> None:
    fb = fake_kernel()
    pp = fb.kernel.policies
    with pp.deferred_writes():
        kept = pp.acquire(SETS["workload"], hook=ING, v6=False)
        gone = pp.acquire(ALLOW_ALL, hook=EGR, v6=True)
        assert pp.sources.names() == []
        pp.release(gone)
        pp.flush_deferred()
        assert pp.sources.names() == [kept.name]
        later = pp.acquire(DENY_ALL, hook=EGR, v6=False)
        assert pp.sources.names() == [kept.name]
    assert pp.sources.names() == sorted([kept.name, later.name])  # leaving the block flushes the rest
    outside = pp.acquire(ALLOW_ALL, hook=ING, v6=True)
    assert outside.name in pp.sources.names()  # outside: written before acquire returns, as always


def test_a_deferred_source_records_the_ip_set_ids_the_program_was_built_with() -> None:
    """Written late (a retry may be an apply later), the source still names the ids the program embeds:
    with the ids of the time of writing a restart could take the program for another input's."""
    fb = fake_kernel()
    pp = fb.kernel.policies
    ps = SETS["workload"]
    with pp.deferred_writes():
        prog = pp.acquire(ps, hook=ING, v6=False)
        built = dict(prog.key[4])  # type: ignore[arg-type]
        for i, name in enumerate(sorted(ps.ip_sets())):  # deleted and back with other ids before the write
            pp.ipset_ids.release(name)
            pp.ipset_ids._by_name[name], pp.ipset_ids._by_id[99 + i] = 99 + i, name
    blob = pp.sources.read(prog.name)
    assert blob is not None and parse_source(blob).ip_set_ids == built != pp._ipset_ids(ps)


def test_a_deferred_source_that_fails_is_retried_and_the_program_stays() -> None:
    fb = fake_kernel()
    pp = fb.kernel.policies
    store = pp.sources
    assert isinstance(store, MemorySources)
    failing = {"on": True}
    real_write = store.write

    def write(name: str, blob: bytes) -> None:
        if failing["on"]:
            raise OSError(28, "no space")
        real_write(name, blob)

    store.write = write  # type: ignore[method-assign]
    with pp.deferred_writes():
        prog = pp.acquire(ALLOW_ALL, hook=ING, v6=False)
    assert prog.fds and store.names() == []
    failing["on"] = False
    pp.flush_deferred()
    assert store.names() == [prog.name]


OTHER = PolicySet(profiles=(Profile("x", (Rule(Action.DENY, protocol=17),)),))


def _driver(fb: FakeBPF, names: list[str], policy_of: dict[str, PolicySet]) -> BPFEndpoints:
    drv = BPFEndpoints(fb.kernel)
    for i, name in enumerate(names):
        drv.on_iface_kind(name, 10 + i, "veth")
        drv.on_iface_state(name, IfaceState.UP, 10 + i)
        for v in (4, 6):
            drv.set_workload(v, name, WorkloadPolicy(to_workload=policy_of[name], from_workload=policy_of[name]))
    return drv


NAMES = [f"cali{i}" for i in range(6)]
POLICY_OF = {name: (SETS["workload"], ALLOW_ALL, OTHER)[i % 3] for i, name in enumerate(NAMES)}


def slot_code(fb: FakeBPF, ifindex: int, v: int) -> dict[int, str]:
    """Per TC hook, the (map-fd-masked) code of the first part in the interface's policy slot."""
    st = fb.kernel.maps.ifstate.get(ctypes.c_uint32(ifindex))
    assert st is not None
    out = {}
    for hook, fld in ((ING, "egress_policy"), (EGR, "ingress_policy")):
        got = fb.kernel.maps.jumps(hook).get(ctypes.c_uint32(getattr(st, f"{fld}_v{v}")))
        assert got is not None
        out[hook] = fb.progs.tags[int(got.value if hasattr(got, "value") else got)].split(":", 2)[2]
    return out


def test_the_driver_writes_the_sources_while_the_attach_runs_and_before_the_loops_other_steps() -> None:
    fb = fake_kernel()
    drv = _driver(fb, NAMES, POLICY_OF)
    pol = fb.kernel.policies
    seen: dict[str, object] = {}

    def during() -> None:  # the loop's device steps: they run while tc attaches, after the flush (once)
        if not seen:
            seen["sources"] = pol.sources.names()
            seen["attached"] = dict(fb.attacher.attached)

    drv.apply_during(during)
    loaded = sorted(p.name for p in pol.loaded_programs())
    # Written before the attach finished (with the default-deny programs' the apply held and released since).
    assert set(loaded) <= set(seen["sources"]) and seen["attached"] == {}  # type: ignore[call-overload]
    assert drv.ready_interfaces(4) == drv.ready_interfaces(6) == frozenset(NAMES)
    assert pol.sources.names() == loaded


def test_a_restart_before_the_deferred_sources_were_written_generates_and_keeps_only_matching_programs() -> None:
    """The first run dies with its programs in their slots and its interfaces READY, before any source
    was written: the restart finds no source, generates each program and compares it with the slot's --
    the same code is kept, a changed policy's slot gets the new program; and the restart writes its
    sources for the next one."""
    fb1 = fake_kernel()
    drv1 = _driver(fb1, NAMES, POLICY_OF)
    pol1 = fb1.kernel.policies
    pol1.flush_deferred = lambda **_: pol1._pending_sources.clear()  # type: ignore[method-assign]  # (lost)
    drv1.apply()
    assert pol1.sources.names() == [] and drv1.ready_interfaces(6) == frozenset(NAMES)

    fb2 = fb1.restarted()
    now = dict(POLICY_OF, cali0=OTHER)  # changed meanwhile: its slots must not keep the old program
    drv2 = _driver(fb2, NAMES, now)
    drv2.apply()
    pol2 = fb2.kernel.policies
    assert pol2.stats["adopted"] > 0 and pol2.stats["generated"] >= pol2.stats["adopted"]
    assert drv2.ready_interfaces(4) == drv2.ready_interfaces(6) == frozenset(NAMES)
    for i, name in enumerate(NAMES):
        for v in (4, 6):
            want = progtag.masked(fresh(pol2, now[name], ING, v == 6)[0]).hex()
            assert slot_code(fb2, 10 + i, v) == {ING: want, EGR: progtag.masked(
                fresh(pol2, now[name], EGR, v == 6)[0]).hex()}
    assert pol2.sources.names() == sorted(p.name for p in pol2.loaded_programs())


def test_generator_fingerprint_is_available_for_the_cache() -> None:
    assert generator_fingerprint()  # the installed tree's files are readable: the cache is usable
