#!/usr/bin/env python3
"""Per-packet cost of the whole TC chain (preamble -> main -> policy program) under
BPF_PROG_TEST_RUN, next to the iptables rules the same policy renders to (issue #12).  Root;
touches no interface (TEST_RUN runs on the loopback of a throwaway namespace), maps on a
private bpffs.

For each policy size N (default 1, 10, 100): one ``pb.Policy`` whose N rules allow UDP to port
53, each from (to-WEP) or to (from-WEP) its own /24, and only the last rule's /24 holds the
packet's peer, so the policy program walks every rule before it allows.  The same policy is
turned into the BPF program the daemon would load (``from_proto.workload_policy_set``, as the BPF
endpoint manager does) and rendered into iptables chains with the project's renderer
(``RuleRenderer.policy_chains`` + ``workload_endpoint_chains``, what the *tables modes program).

Measured, per direction (to-WEP: TC egress of the host-side interface, the workload's ingress
policy; from-WEP: TC ingress, its egress policy):

* **new flow**: each run a packet of a new flow (a new source port), so conntrack misses and the
  policy program runs; ``repeat=1`` per flow (a repeated packet would hit the conntrack entry its
  first run made), median of ``--flows`` runs of the kernel's own per-run duration;
* **established**: one packet ``repeat=--repeat`` times (the first run creates the entry, the
  others hit it: policy skipped);
(``bench/bench_bpf.py`` times the policy program alone, without preamble, main and conntrack.)

Usage: ``.venv/bin/python bench/bench_bpf_chain.py [--rules 1,10,100] [--repeat N] [--flows N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import structlog  # noqa: E402

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))

from felixpy.bpf import defs, maps  # noqa: E402
from felixpy.bpf import from_proto as fp  # noqa: E402
from felixpy.bpf import maptypes as mt  # noqa: E402
from felixpy.bpf import pktgen as pg  # noqa: E402
from felixpy.bpf.attachpoint import AttachPoint, configure  # noqa: E402
from felixpy.bpf.build import EpType, headers_dir  # noqa: E402
from felixpy.bpf.hook import ProgramsMap  # noqa: E402
from felixpy.bpf.policyload import PolicyPrograms  # noqa: E402
from felixpy.bpf.testrun import run_tc  # noqa: E402
from felixpy.config import Config  # noqa: E402
from felixpy.proto import felixbackend_pb2 as pb  # noqa: E402
from felixpy.rules.groups import INBOUND, OUTBOUND, PolicyGroup, TierPolicyGroups  # noqa: E402
from felixpy.rules.names import PolicyID  # noqa: E402
from felixpy.rules.renderer import RuleRenderer  # noqa: E402
from felixpy.testing import netns  # noqa: E402

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
WL, PEER = "10.65.0.2", "192.0.2.1"
SIZES = {"cali_v4_ct4": 1 << 20, "cali_v6_ct4": 4096, "cali_counters6": 512}
ENTRY = {ING: 20, EGR: 21}
UNSPEC, SHOT = -1, 2
OTHER = "198.51.100.1"


def policy(n: int) -> pb.Policy:
    """N UDP/53 allows, each for its own /24; the packet's peer is in the last one's."""
    nets = [f"10.{100 + k // 250}.{k % 250}.0/24" for k in range(n - 1)] + [f"{PEER}/32"]
    udp53 = {"protocol": pb.Protocol(name="udp"), "dst_ports": [pb.PortRange(first=53, last=53)]}
    return pb.Policy(namespace="default", tier="default",
                     inbound_rules=[pb.Rule(action="allow", src_net=[c], **udp53) for c in nets],
                     outbound_rules=[pb.Rule(action="allow", dst_net=[c], **udp53) for c in nets])


def iptables_rules(n: int) -> dict[str, int]:
    """Rules the *tables modes render for this policy on one workload (IPv4)."""
    r = RuleRenderer(Config(), 4)
    pid = PolicyID("pol", "default", "NetworkPolicy")
    pi, po = r.policy_chains(pid, policy(n))
    ep = pb.WorkloadEndpoint(state="active", name="cali1", ipv4_nets=[f"{WL}/32"],
                             tiers=[pb.TierInfo(name="default", ingress_policies=[pb.PolicyID(
                                 name="pol", namespace="default", kind="NetworkPolicy")])])
    tiers = [TierPolicyGroups("default", ingress=(PolicyGroup(INBOUND, (pid,), "all()"),),
                              egress=(PolicyGroup(OUTBOUND, (pid,), "all()"),))]
    eps = {c.name: c for c in r.workload_endpoint_chains(ep, tiers)}
    tw = next(c for name, c in eps.items() if name.startswith("cali-tw-"))
    fw = next(c for name, c in eps.items() if name.startswith("cali-fw-"))
    return {"policy_in": len(pi.rules), "policy_out": len(po.rules), "tw": len(tw.rules), "fw": len(fw.rules)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rules", default="1,10,100")
    ap.add_argument("--repeat", type=int, default=100000)
    ap.add_argument("--flows", type=int, default=2000)
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ["BCC_KERNEL_SOURCE"] = headers_dir()
    sizes = [int(x) for x in args.rules.split(",")]
    out: dict[str, dict[str, float]] = {}
    with netns.netns("fpybt") as ns, maps.private_bpffs() as root, netns.entered(ns):
        ms = maps.MapSet(root, sizes=SIZES).ensure()
        pm = ProgramsMap(ms, root)
        pp = PolicyPrograms(ms)
        ms.routes(False).set(mt.route_key(WL + "/32"), mt.route_value(defs.RT_WORKLOAD | defs.RT_LOCAL, ifindex=1))
        for hook in (ING, EGR):
            configure(AttachPoint("lo", 1, hook, EpType.WEP, policy_idx_v4=ENTRY[hook]), pm, ms)
        pre = {hook: pm.preamble_fd(hook) for hook in (ING, EGR)}
        for size_no, n in enumerate(sizes):
            pol = policy(n)
            ep = pb.WorkloadEndpoint(name="cali1", tiers=[pb.TierInfo(
                name="default", ingress_policies=[pb.PolicyID(name="pol", namespace="default", kind="NetworkPolicy")],
                egress_policies=[pb.PolicyID(name="pol", namespace="default", kind="NetworkPolicy")])])
            pols = {("NetworkPolicy", "default", "pol"): pol}
            progs = {EGR: pp.set_policy(fp.workload_policy_set(ep, pols, {}, fp.INGRESS), hook=EGR,
                                        entry=ENTRY[EGR], v6=False),
                     ING: pp.set_policy(fp.workload_policy_set(ep, pols, {}, fp.EGRESS), hook=ING,
                                        entry=ENTRY[ING], v6=False)}
            row: dict[str, float] = {}
            for hook, name in ((EGR, "to_wep"), (ING, "from_wep")):
                def pkt(sport: int, hook: int = hook) -> bytes:
                    return (pg.udp_pkt(PEER, sport, WL, 53) if hook == EGR else pg.udp_pkt(WL, sport, PEER, 53))
                news = []
                for i in range(args.flows):
                    r = run_tc(pre[hook], pkt(1024 + size_no * args.flows + i))  # a new flow each
                    assert r.verdict == UNSPEC, (name, n, r)  # allowed (by the last rule)
                    news.append(r.duration_ns)
                # Policy really decides: a peer in none of the N /24s is dropped (end of tier).
                other = (pg.udp_pkt(OTHER, 7, WL, 53) if hook == EGR else pg.udp_pkt(WL, 7, OTHER, 53))
                assert run_tc(pre[hook], other).verdict == SHOT, (name, n)
                est = run_tc(pre[hook], pkt(9), repeat=args.repeat)
                assert est.verdict == UNSPEC, (name, n, est)
                row[f"{name}_new_ns"] = statistics.median(news)
                row[f"{name}_established_ns"] = est.duration_ns
            row.update({f"iptables_{k}": v for k, v in iptables_rules(n).items()})
            out[str(n)] = row
            for hook in (ING, EGR):
                pp.uninstall(hook, ENTRY[hook])
            print(f"{n} rules: {json.dumps(row)}", flush=True)
        ms.close()
    load = os.getloadavg()[0]
    print(f"\nPer-packet cost, BPF_PROG_TEST_RUN duration (ns/packet; new flow: median of {args.flows} "
          f"single runs; established: repeat={args.repeat}), load {load:.1f}, "
          f"next to the iptables rules felixpy's *tables modes render for the same policy (IPv4):\n")
    print("| rules (allow at the last) | direction | chain, new flow | chain, established "
          "| iptables: policy chain + endpoint chain |")
    print("|---|---|---|---|---|")
    for n in sizes:
        r = out[str(n)]
        for name, pc, ec in (("to_wep", "policy_in", "tw"), ("from_wep", "policy_out", "fw")):
            print(f"| {n} | {name.replace('_', '-')} | {r[f'{name}_new_ns']:.0f} | {r[f'{name}_established_ns']:.0f} | "
                  f"{int(r[f'iptables_{pc}'])} + {int(r[f'iptables_{ec}'])} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
