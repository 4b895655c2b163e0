#!/usr/bin/env python3
"""Benchmark the BPF dataplane pieces (issue #8).  Root; touches no interface.

Sections (markdown tables on stdout):

1. compile  -- bcc compile + load per variant: the first compile in a process (cold, LLVM
   start-up included), every other variant, and a cache hit; resident memory of a process that
   compiled all variants in-process versus one that had a worker compile them.
2. policy   -- 1,000 endpoints sharing 50 distinct policy sets (2 programs per endpoint, one per
   direction): generation + load + slot install per endpoint, amortised; the same work done by
   generating C and compiling with bcc (the alternative the bytecode generator was chosen over);
   and policies with hundreds/thousands of rules (parts, instructions, load time).
3. packet   -- per-packet cost from BPF_PROG_TEST_RUN ``duration``: the policy program alone for
   1/10/100/1000-rule policies (packet matching the last rule) and the whole TC chain (new flow,
   established flow), next to the number of iptables rules the same policy walks.

Maps live on a private bpffs mounted on a temp dir.  Usage:
``.venv/bin/python bench/bench_bpf.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))

from felixpy.bpf import build, defs, maps  # noqa: E402
from felixpy.bpf import pktgen as pg  # noqa: E402
from felixpy.bpf.attachpoint import AttachPoint, configure  # noqa: E402
from felixpy.bpf.build import EpType, Program, Variant  # noqa: E402
from felixpy.bpf.hook import ProgramsMap  # noqa: E402
from felixpy.bpf.ipsets import BPFIPSets, IPSetIDAllocator  # noqa: E402
from felixpy.bpf.policy_ir import (  # noqa: E402
    Action,
    Policy,
    PolicySet,
    PortRange,
    Profile,
    Rule,
    Tier,
)
from felixpy.bpf.policyload import PolicyPrograms  # noqa: E402
from felixpy.bpf.testrun import run_tc  # noqa: E402

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
SIZES = {"cali_v4_ct4": 65536, "cali_v6_ct4": 65536, "cali_counters6": 4096}
RESULTS: dict[str, object] = {}


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def table(title: str, header: list[str], rows: list[list[object]]) -> None:
    print(f"\n#### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    sys.stdout.flush()


def all_variants() -> list[Variant]:
    vs = [Variant(Program.TC, hook, ep, v6, dbg) for hook in (ING, EGR) for ep in EpType
          for v6 in (False, True) for dbg in (False, True)]
    vs += [Variant(Program.XDP, defs.HOOK_XDP, EpType.HEP, v6, dbg)
           for v6 in (False, True) for dbg in (False, True)]
    vs += [Variant(Program.TC_PREAMBLE, ING), Variant(Program.TC_PREAMBLE, EGR),
           Variant(Program.XDP_PREAMBLE, defs.HOOK_XDP, EpType.HEP)]
    return vs


# ------------------------------------------------------------------------------------------------
# 1. compile


def bench_compile(root: str) -> None:
    rows = []
    vs = all_variants()
    rss0 = rss_mib()
    t0 = time.perf_counter()
    first = build.load_variant(vs[0], root)
    cold = time.perf_counter() - t0
    rows.append([vs[0].label + " (cold: first in process)", f"{cold * 1e3:.0f}",
                 f"{first.load_seconds * 1e3:.1f}"])
    by_kind: dict[str, list[float]] = {}
    loads: dict[str, list[float]] = {}
    for v in vs[1:]:
        lv = build.load_variant(v, root)
        kind = v.program.value + ("_debug" if v.debug else "")
        by_kind.setdefault(kind, []).append(lv.compile_seconds)
        loads.setdefault(kind, []).append(lv.load_seconds)
    for kind, ts in by_kind.items():
        rows.append([f"{kind} x{len(ts)}", f"{statistics.median(ts) * 1e3:.0f} (min {min(ts) * 1e3:.0f}, "
                     f"max {max(ts) * 1e3:.0f})", f"{statistics.median(loads[kind]) * 1e3:.1f}"])
    t0 = time.perf_counter()
    n = 1000
    for _ in range(n):
        build.load_variant(vs[3], root)
    hit_us = (time.perf_counter() - t0) / n * 1e6
    rows.append(["any variant, cached (same process)", f"{hit_us / 1e3:.4f}", "-"])
    table("Compile + load per variant (bcc 0.26 / clang 14, in-process)",
          ["variant", "compile ms (median)", "load (verifier) ms"], rows)
    RESULTS["compile"] = {"cold_ms": cold * 1e3, "by_kind_ms": {k: statistics.median(v) * 1e3
                                                                for k, v in by_kind.items()},
                          "cache_hit_us": hit_us, "variants": len(vs)}
    print(f"\n{len(vs)} variants compiled; RSS {rss0:.0f} -> {rss_mib():.0f} MiB in this process.")


_MEM_SCRIPT = textwrap.dedent("""
    import os, sys, json, resource
    sys.path.insert(0, {repo!r})
    import structlog; structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    from felixpy.bpf import maps, build, defs
    from felixpy.bpf.hook import ProgramsMap
    from felixpy.bpf.worker import WorkerLoader
    sys.path.insert(0, {bench!r})
    from bench_bpf import all_variants, rss_mib
    with maps.private_bpffs() as root:
        ms = maps.MapSet(root, sizes={sizes!r}).ensure()
        base = rss_mib()
        if {worker!r}:
            loader = WorkerLoader(root); loader.prefetch(all_variants())
            pm = ProgramsMap(ms, root, loader=loader)
        else:
            pm = ProgramsMap(ms, root)
        for v in all_variants():
            if v.program.value in ("tc", "xdp"):
                pm.layout(v)
            else:
                pm.preamble_fd(v.hook)
        print(json.dumps({{"base": base, "after": rss_mib(), "bcc_imported": "bcc" in sys.modules,
                          "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
""")


def bench_memory() -> None:
    rows = []
    out = {}
    here = Path(__file__).resolve().parent
    for worker in (False, True):
        script = _MEM_SCRIPT.format(repo=str(here.parent), bench=str(here), sizes=SIZES,
                                    worker=worker)
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print(p.stderr[-2000:], file=sys.stderr)
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        out["worker" if worker else "in_process"] = r
        rows.append(["worker process" if worker else "in-process (bcc in the daemon)",
                     f"{r['base']:.0f}", f"{r['after']:.0f}",
                     "yes" if r["bcc_imported"] else "no"])
    table(f"Resident memory of the loading process with all {len(all_variants())} variants loaded",
          ["how", "RSS before MiB", "RSS after MiB", "bcc/LLVM in process"], rows)
    RESULTS["memory"] = out


# ------------------------------------------------------------------------------------------------
# 2. policy programs at scale


def policy_set(i: int, n_rules: int = 20) -> PolicySet:
    rules = []
    for j in range(n_rules):
        k = j % 5
        if k == 0:
            rules.append(Rule(Action.ALLOW, protocol=6, src_nets=(f"10.{i % 250}.{j}.0/24",),
                              dst_ports=(PortRange(80 + j, 80 + j), PortRange(8000, 8080))))
        elif k == 1:
            rules.append(Rule(Action.ALLOW, protocol=17, dst_nets=(f"172.16.{j}.0/24", "172.17.0.0/16"),
                              dst_ports=(PortRange(53, 53),)))
        elif k == 2:
            rules.append(Rule(Action.ALLOW, src_ip_sets=(f"s:pol{i}-{j}",), protocol=6))
        elif k == 3:
            rules.append(Rule(Action.ALLOW, protocol=6, dst_named_port_ip_sets=(f"n:pol{i}-{j}",)))
        else:
            rules.append(Rule(Action.DENY, protocol=1, icmp_type=8, not_src_nets=("10.0.0.0/8",)))
    half = n_rules // 2
    return PolicySet(tiers=(Tier("default", (Policy(f"np{i}a", tuple(rules[:half])),
                                             Policy(f"np{i}b", tuple(rules[half:])))),),
                     profiles=(Profile(f"kns.ns{i}", (Rule(Action.ALLOW),)),))


def c_for_policy(ps: PolicySet, root: str) -> str:
    """C for bcc implementing the same policy (used only to measure the bcc-C alternative)."""
    import ipaddress

    lines = [
        "#include <uapi/linux/bpf.h>",
        "struct st { u8 pad[8]; u32 src; u8 p1[12]; u32 dst; u8 p2[28]; u32 post_dst; u8 p3[32];",
        "  s32 pol_rc; u16 sport; u16 dport; u16 pre_dport; u16 post_dport; u8 proto; u8 p4[407]; };",
        "struct ipk { u32 plen; u64 id; u32 addr; u16 port; u8 proto; u8 pad; } __attribute__((packed));",
        f'BPF_TABLE_PINNED("percpu_array", u32, struct st, st_map, 2, "{root}/cali_state6");',
        f'BPF_TABLE_PINNED("lpm_trie", struct ipk, u32, ipsets, 1048576, "{root}/cali_v4_ip_sets",'
        " BPF_F_NO_PREALLOC);",
        f'BPF_TABLE_PINNED("prog", u32, u32, progs, 400, "{root}/cali_progs_ing2");',
        "static inline __attribute__((always_inline)) int inset(u64 id, u32 a, u16 port, u8 proto) {",
        "  struct ipk k = {}; k.plen = 128; k.id = id; k.addr = a; k.port = port; k.proto = proto;",
        "  return ipsets.lookup(&k) != 0; }",
        "int pol(struct __sk_buff *skb) {",
        "  u32 z = 0; struct st *s = st_map.lookup(&z); if (!s) return 2;",
    ]
    sid = 1
    for t in ps.tiers:
        for p in t.policies:
            for r in p.rules:
                conds = []
                if r.protocol is not None:
                    conds.append(f"s->proto == {r.protocol}")
                for field, nets in (("src", r.src_nets), ("post_dst", r.dst_nets)):
                    if nets:
                        ors = []
                        for n in nets:
                            net = ipaddress.ip_network(n)
                            m = int.from_bytes(net.netmask.packed, "little")
                            v = int.from_bytes(net.network_address.packed, "little")
                            ors.append(f"(s->{field} & {m}u) == {v}u")
                        conds.append("(" + " || ".join(ors) + ")")
                for n in r.not_src_nets:
                    net = ipaddress.ip_network(n)
                    conds.append(f"(s->src & {int.from_bytes(net.netmask.packed, 'little')}u) != "
                                 f"{int.from_bytes(net.network_address.packed, 'little')}u")
                for _ in r.src_ip_sets:
                    conds.append(f"inset({sid}, s->src, s->sport, s->proto)")
                    sid += 1
                port_ors = [f"(s->post_dport >= {pr.first} && s->post_dport <= {pr.last})"
                            for pr in r.dst_ports]
                for _ in r.dst_named_port_ip_sets:
                    port_ors.append(f"inset({sid}, s->post_dst, s->post_dport, s->proto)")
                    sid += 1
                if port_ors:
                    conds.append("(" + " || ".join(port_ors) + ")")
                if r.icmp_type is not None:
                    conds.append(f"(s->dport & 0xff) == {r.icmp_type}")
                target = "allow" if r.action is Action.ALLOW else "deny"
                lines.append(f"  if ({' && '.join(conds) or '1'}) goto {target};")
        lines.append("  goto deny;")
    lines += ["deny: s->pol_rc = 2; progs.call(skb, skb->cb[1]); return 2;",
              "allow: s->pol_rc = 1; progs.call(skb, skb->cb[0]); return 2; }"]
    return "\n".join(lines)


def bench_policy(root: str, ms: maps.MapSet, quick: bool) -> None:
    n_eps, n_sets = (200, 10) if quick else (1000, 50)
    ids = IPSetIDAllocator()
    ipsets = BPFIPSets(ms.ipsets(False), ids, False)
    sets = [policy_set(i) for i in range(n_sets)]
    for ps in sets:
        for s in ps.ip_sets():
            ipsets.replace(s, ["10.1.2.3", "10.9.0.0/16"] if s.startswith("s:") else ["10.1.2.3,tcp:8080"])
    ipsets.apply()
    pp = PolicyPrograms(ms, ids)
    t0 = time.perf_counter()
    for e in range(n_eps):
        ps = sets[e % n_sets]
        pp.set_policy(ps, hook=ING, entry=e, v6=False)  # workload egress
        pp.set_policy(ps, hook=EGR, entry=e, v6=False)  # workload ingress
    total = time.perf_counter() - t0
    progs = pp.loaded_programs()
    gen = [p.gen_seconds for p in progs]
    load = [p.load_seconds for p in progs]
    per_ep_ms = total / n_eps * 1e3
    # Re-apply the same policy to every endpoint (e.g. after a resync): all cache hits.
    t0 = time.perf_counter()
    for e in range(n_eps):
        ps = sets[e % n_sets]
        pp.set_policy(ps, hook=ING, entry=e, v6=False)
        pp.set_policy(ps, hook=EGR, entry=e, v6=False)
    resync_ms = (time.perf_counter() - t0) / n_eps * 1e3

    # The alternative: C for bcc, one compile per distinct program.
    c_times = []
    os.environ["BCC_KERNEL_SOURCE"] = build.headers_dir()
    from bcc import BPF

    for i in range(3):
        src = c_for_policy(sets[i], root)
        t = time.perf_counter()
        b = BPF(text=src.encode())
        b.load_func(b"pol", BPF.SCHED_CLS)
        c_times.append(time.perf_counter() - t)
        b.cleanup()
    c_per_prog = statistics.median(c_times)
    c_per_ep_ms = c_per_prog * len(progs) / n_eps * 1e3
    table(f"Policy programs: {n_eps} endpoints x 2 directions, {n_sets} distinct 20-rule policy sets",
          ["approach", "distinct programs", "per program: generate ms", "per program: load ms",
           "total s", "amortised ms / endpoint"],
          [["bytecode (felixpy.bpf.polprog)", len(progs), f"{statistics.median(gen) * 1e3:.2f}",
            f"{statistics.median(load) * 1e3:.2f}", f"{total:.2f}", f"{per_ep_ms:.2f}"],
           ["same, all cache hits (resync)", 0, "-", "-", f"{resync_ms * n_eps / 1e3:.2f}",
            f"{resync_ms:.3f}"],
           ["bcc C compile per program (measured x3)", len(progs), f"{c_per_prog * 1e3:.0f} (compile+load)",
            "-", f"{c_per_prog * len(progs):.1f} (est.)", f"{c_per_ep_ms:.1f} (est.)"]])
    RESULTS["policy_scale"] = {"endpoints": n_eps, "sets": n_sets, "programs": len(progs),
                               "gen_ms_median": statistics.median(gen) * 1e3,
                               "load_ms_median": statistics.median(load) * 1e3,
                               "total_s": total, "per_endpoint_ms": per_ep_ms,
                               "resync_per_endpoint_ms": resync_ms,
                               "bcc_c_per_program_ms": c_per_prog * 1e3,
                               "bcc_c_per_endpoint_ms_est": c_per_ep_ms}
    for e in range(n_eps):
        pp.uninstall(ING, e)
        pp.uninstall(EGR, e)

    rows = []
    big = {}
    for n in ((100, 1000) if quick else (100, 500, 1000, 2000, 5000)):
        rs = tuple(Rule(Action.ALLOW, protocol=6, src_nets=(f"10.{(i // 250) % 250}.{i % 250}.0/24",
                                                             "192.168.0.0/16"),
                        dst_ports=(PortRange(1000 + i % 60000, 1000 + i % 60000), PortRange(5000, 5010)))
                   for i in range(n))
        ps = PolicySet(tiers=(Tier("t", (Policy("big", rs),)),))
        t0 = time.perf_counter()
        prog = pp.set_policy(ps, hook=ING, entry=900, v6=False)
        dt = time.perf_counter() - t0
        rows.append([n, len(prog.fds), sum(prog.insn_counts), f"{prog.gen_seconds * 1e3:.1f}",
                     f"{prog.load_seconds * 1e3:.1f}", f"{dt * 1e3:.1f}"])
        big[n] = {"parts": len(prog.fds), "insns": sum(prog.insn_counts),
                  "gen_ms": prog.gen_seconds * 1e3, "load_ms": prog.load_seconds * 1e3}
        pp.uninstall(ING, 900)
    table("Large policies (one tier; each rule: tcp, 2 source CIDRs, 2 port ranges)",
          ["rules", "sub-programs", "instructions", "generate ms", "load (verifier) ms", "total ms"], rows)
    RESULTS["large_policies"] = big


# ------------------------------------------------------------------------------------------------
# 3. per-packet cost


def bench_packet(root: str, ms: maps.MapSet, pm: ProgramsMap, quick: bool) -> None:
    from felixpy.bpf import asm
    from felixpy.bpf import syscall as sc

    repeat = 20000 if quick else 200000
    b = asm.Block()
    b.mov64_imm(asm.R0, 100)
    b.exit()
    sentinel = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, b.assemble(), name="sentinel")
    ms.progs(ING).set(399, sentinel)
    pp = PolicyPrograms(ms)
    rows = []
    out = {}
    for n in (1, 10, 100, 1000):
        rs = tuple(Rule(Action.ALLOW, protocol=6, src_nets=(f"10.{i // 250}.{i % 250}.0/24",),
                        dst_ports=(PortRange(1000 + i, 1000 + i),)) for i in range(n))
        ps = PolicySet(tiers=(Tier("t", (Policy("p", rs),)),))
        prog = pp.set_policy(ps, hook=ING, entry=800, v6=False)
        # State for a packet matching only the last rule.
        import ctypes

        from felixpy.bpf import maptypes as mt

        s = mt.TcState4()
        src = f"10.{(n - 1) // 250}.{(n - 1) % 250}.9"
        ctypes.memmove(s.ip_src, mt.addr_bytes(src, False), 4)
        s.ip_proto, s.dport, s.post_nat_dport = 6, 1000 + n - 1, 1000 + n - 1
        ms.state.set(0, bytes(s).ljust(512, b"\0"))
        r = run_tc(prog.fds[0], b"\0" * 64, cb=(399, 399, 800), repeat=repeat)
        assert r.retval == 100, r
        rows.append([f"policy program, {n} rules (match on rule {n})", f"{r.duration_ns}",
                     f"{2 * n} (2 per rule: match->mark, mark->RETURN)"])
        out[f"policy_{n}_ns"] = r.duration_ns
        pp.uninstall(ING, 800)
    os.close(sentinel)
    ms.progs(ING).delete(399)

    # Whole chain: preamble -> main -> policy(100 rules, last matches) -> allowed.
    rs = tuple(Rule(Action.ALLOW, protocol=17, src_nets=(f"10.{i // 250}.{i % 250}.0/24",),
                    dst_ports=(PortRange(53, 53),)) for i in range(100))
    ap = AttachPoint("lo", 1, ING, EpType.WEP, policy_idx_v4=801)
    configure(ap, pm, ms)
    pp.set_policy(PolicySet(tiers=(Tier("t", (Policy("p", rs),)),)), hook=ING, entry=801, v6=False)
    wl = "10.0.99.2"
    from felixpy.bpf import maptypes as mt

    ms.routes(False).set(mt.route_key(wl + "/32"),
                         mt.route_value(defs.RT_WORKLOAD | defs.RT_LOCAL, ifindex=1))
    pre = pm.preamble_fd(ING)
    pkt = pg.udp_pkt(wl, 7, "192.0.2.1", 53)
    news = []
    for i in range(300 if quick else 2000):
        r = run_tc(pre, pg.udp_pkt(wl, 1024 + i, "192.0.2.1", 53))
        news.append(r.duration_ns)
    est = run_tc(pre, pkt, repeat=repeat)  # first iteration creates CT, the rest hit it
    rows.append(["TC chain, new flow (100-rule policy, last rule matches; CT create)",
                 f"{int(statistics.median(news))}", "~200 + endpoint/dispatch chains"])
    rows.append(["TC chain, established flow (conntrack hit, policy skipped)", f"{est.duration_ns}",
                 "0 (conntrack ESTABLISHED accept early)"])
    out["chain_new_ns"] = statistics.median(news)
    out["chain_established_ns"] = est.duration_ns
    table("Per-packet cost (BPF_PROG_TEST_RUN duration, ns/packet)",
          ["case", "ns / packet", "iptables rules walked for the same policy"], rows)
    RESULTS["packet"] = out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_bpf needs root", file=sys.stderr)
        return 1
    print(f"Kernel {os.uname().release}, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}.  Noisy VM: treat as +-25%.")
    with maps.private_bpffs() as root:
        ms = maps.MapSet(root, sizes=SIZES).ensure()
        bench_compile(root)
        pm = ProgramsMap(ms, root)
        bench_policy(root, ms, args.quick)
        bench_packet(root, ms, pm, args.quick)
        ms.close()
    bench_memory()
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
