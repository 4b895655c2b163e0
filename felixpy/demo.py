"""``felixpy demo``: a node in sandbox namespaces, fed by a scenario, shown with real packets.

1. creates a node namespace and one workload namespace per workload endpoint
   in the scenario (CNI-style veths named as the scenario says);
2. starts the real daemon inside the node namespace on a unix socket;
3. probes the workload matrix (TCP 8080, ICMP) before the feed, after the
   initial batch reaches ``DataplaneInSync``, and after each scripted step;
4. plugs an "outside" namespace into the node's ``eth0`` and locks that host
   interface down with a deny-all host endpoint: only the failsafe ports
   (SSH 22 here) still answer (in ``--mode bpf`` through the host-endpoint programs on
   ``eth0``, docs/bpf.md);
5. prints what the daemon programmed (our chains, sets) and tears it all down,
   also on Ctrl-C or failure.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from typing import Any

from felixpy.feed.client import connect
from felixpy.feed.scenario import bundled_scenario_path, load_scenario
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import conncheck as cc
from felixpy.testing.daemon import start_daemon
from felixpy.testing.topology import node

MODES = {
    "iptables-legacy": {"FELIX_IPTABLESBACKEND": "legacy"},
    "iptables-nft": {"FELIX_IPTABLESBACKEND": "nft"},
    "nftables": {"FELIX_NFTABLESMODE": "Enabled"},
    # Policy in BPF programs on the workload interfaces (TCX), the attach-gap rules in iptables-legacy.
    "bpf": {"FELIX_BPFENABLED": "true", "FELIX_IPTABLESBACKEND": "legacy", "FELIX_BPFATTACHTYPE": "TCX"},
}


def say(msg: str = "") -> None:
    print(msg, flush=True)


def _workloads(initial: tuple[pb.ToDataplane, ...]) -> list[tuple[str, str, str]]:
    out = []
    for m in initial:
        if m.HasField("workload_endpoint_update"):
            ep = m.workload_endpoint_update.endpoint
            v4 = ep.ipv4_nets[0].split("/")[0] if ep.ipv4_nets else ""
            v6 = ep.ipv6_nets[0].split("/")[0] if ep.ipv6_nets else ""
            out.append((ep.name, v4, v6))
    return out


def with_real_macs(sc: Any, macs: dict[str, str]) -> Any:
    """Report each workload's real MAC, as the CNI plugin does (it is used for static ARP)."""

    def fix(msgs: tuple[pb.ToDataplane, ...]) -> tuple[pb.ToDataplane, ...]:
        out = []
        for m in msgs:
            if m.HasField("workload_endpoint_update") and m.workload_endpoint_update.endpoint.name in macs:
                m2 = pb.ToDataplane()
                m2.CopyFrom(m)
                m2.workload_endpoint_update.endpoint.mac = macs[m2.workload_endpoint_update.endpoint.name]
                m = m2
            out.append(m)
        return tuple(out)

    return dataclasses.replace(sc, initial=fix(sc.initial),
                               steps=tuple(dataclasses.replace(st, messages=fix(st.messages)) for st in sc.steps))


def _show(title: str, eps: list[cc.Endpoint]) -> None:
    say(f"\n== {title}")
    for version in (4, 6):
        for proto, port in (("tcp", 8080), ("icmp", 0)):
            m = cc.matrix(eps, eps, proto, port, version, timeout=0.5)
            say(f"-- IPv{version} {proto}{':' + str(port) if port else ''} (rows: source, columns: destination)")
            say(cc.render(m))


def _programmed(ns: str, mode: str) -> None:
    say("\n== What the daemon programmed in the node namespace")
    if mode == "nftables":
        cmds = [["nft", "list", "tables"]]
    else:
        b = MODES[mode].get("FELIX_IPTABLESBACKEND", "legacy")
        cmds = [[f"iptables-{b}-save"], [f"ip6tables-{b}-save"]]
    for cmd in cmds:
        out = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True).stdout
        ours = [line for line in out.splitlines() if "cali" in line]
        say(f"$ {' '.join(cmd)} | grep -c cali  →  {len(ours)} lines")
        for line in ours[:8]:
            say(f"    {line[:110]}")
    sets = subprocess.run(["ip", "netns", "exec", ns, "ipset", "list", "-name"], capture_output=True,
                          text=True).stdout.split()
    say(f"$ ipset list -name  →  {sets or 'none'}")


HEP_PORTS = (22, 8080)


def _host_endpoint_messages(seq: int) -> list[pb.ToDataplane]:
    """A deny-all policy (IPv6 neighbour discovery allowed) and a host endpoint for eth0 using it."""
    nd = pb.Rule(action="allow", protocol=pb.Protocol(name="icmpv6"))
    deny = pb.Rule(action="deny")
    pid = pb.PolicyID(name="demo-lockdown", kind="GlobalNetworkPolicy")
    pol = pb.ActivePolicyUpdate(id=pid, policy=pb.Policy(inbound_rules=[nd, deny], outbound_rules=[nd, deny],
                                                          tier="default", original_selector="has(host)"))
    hep = pb.HostEndpointUpdate(id=pb.HostEndpointID(endpoint_id="demo-node-eth0"), endpoint=pb.HostEndpoint(
        name="eth0", tiers=[pb.TierInfo(name="default", ingress_policies=[pid], egress_policies=[pid])]))
    return [pb.ToDataplane(sequence_number=seq, active_policy_update=pol),
            pb.ToDataplane(sequence_number=seq + 1, host_endpoint_update=hep)]


def _show_outside(title: str, outside_ns: str, out: Any) -> None:
    say(f"\n== {title}")
    for version in (4, 6):
        cells = []
        for port in HEP_PORTS:
            ok = cc.probe(outside_ns, out.node_ip(version), "tcp", port, timeout=0.5)
            cells.append(f"tcp:{port} {'open' if ok else 'blocked'}")
        say(f"-- IPv{version} outside → node {out.node_ip(version)}: " + ", ".join(cells))


def _host_endpoint_step(n: Any, client: Any, seq: int, *, bpf: bool = False) -> None:
    out = n.add_outside("eth0", "10.98.0", "fd00:98")
    servers = cc.Servers()
    try:
        servers.start(n.netns, tcp_ports=HEP_PORTS, udp_ports=())
        say(f"\nhost interface eth0 ({out.node4}, {out.node6}) leads to an outside namespace")
        _show_outside("Outside → node before any host endpoint", out.netns, out)
        client.send(_host_endpoint_messages(seq))
        try:
            client.wait_for(lambda m: m.HasField("host_endpoint_status_update")
                            and m.host_endpoint_status_update.status.status == "up", 10)
        except TimeoutError:
            say("(no 'up' status for the host endpoint within 10s)")
        if bpf:  # the status is the resolution's; the programs may still be compiling (first start)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and cc.probe(out.netns, out.node_ip(4), "tcp", HEP_PORTS[1],
                                                            timeout=0.5):
                time.sleep(1.0)
        _show_outside("After a deny-all host endpoint on eth0: only failsafe ports answer", out.netns, out)
    finally:
        servers.stop()


def main(mode: str = "iptables-legacy", scenario: str = "demo") -> int:
    path = bundled_scenario_path(scenario) if scenario == "demo" else scenario
    sc = load_scenario(path)
    say(f"felixpy demo — {sc.description or path} (mode {mode})")
    with node("fpy-demo") as n:
        servers = cc.Servers()
        try:
            eps = []
            macs = {}
            for iface, v4, v6 in _workloads(sc.initial):
                short = iface.removeprefix("cali-")
                wl = n.add_workload(short, v4, v6, iface=iface)
                servers.start(wl.netns)
                eps.append(cc.Endpoint(short, wl.netns, v4, v6))
                macs[iface] = wl.mac
                say(f"workload {short:6} {iface:12} {v4:12} {v6:14} mac {wl.mac}")
            sc = with_real_macs(sc, macs)
            _show("Before felixpy: plain routing, no policy", eps)
            d = start_daemon(n.netns, env=MODES[mode])
            d.keep_logs()
            try:
                say(f"\nfelixpy daemon running in namespace {n.netns} (pid {d.proc.pid}), feed {d.target}")
                client = connect(d.target)
                client.send(sc.initial)
                t0 = time.monotonic()
                client.wait_in_sync(240 if mode == "bpf" else 60)  # BPF: the first start compiles (bcc)
                say(f"sent {len(sc.initial)} messages; DataplaneInSync after {time.monotonic() - t0:.2f}s")
                _show("After the initial batch", eps)
                for i, step in enumerate(sc.steps, 1):
                    time.sleep(step.after_seconds)
                    client.send(step.messages)
                    time.sleep(1.0)
                    _show(f"After step {i}: {step.description}", eps)
                last = sc.steps[-1].messages if sc.steps else sc.initial
                _host_endpoint_step(n, client, last[-1].sequence_number + 1 if last else 0, bpf=mode == "bpf")
                _programmed(n.netns, mode)
                statuses = [m for m in client.received if m.HasField("workload_endpoint_status_update")]
                say(f"\nendpoint status reports received: {len(statuses)}")
                client.close()
            finally:
                rc = d.stop()
                say(f"daemon stopped (exit {rc}); its log: {d.log_path}")
        finally:
            servers.stop()
    say("sandbox namespaces deleted")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
