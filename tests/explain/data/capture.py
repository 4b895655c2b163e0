"""Regenerate the captured kernel state the explain unit tests read (run as root, takes ~1 min).

    .venv/bin/python -m tests.explain.data.capture

For each *tables mode: an FV node (namespaces, workloads a/b/c, the real daemon) fed the
datastore below, then ``ip[6]tables-save`` / ``ipset save`` or ``nft -j list ruleset`` and
``ip -j addr``/``ip -j route`` of the node namespace are written next to this file.  The
namespaces are deleted afterwards.
"""

from __future__ import annotations

import sys
from pathlib import Path

from felixpy.testing import netns as nsmod
from fv.datastore import addr, datastore, nets, policy, tier, workload
from fv.harness import FvNode

HERE = Path(__file__).resolve().parent
LONG = "a-policy-with-a-name-long-enough-to-be-hashed"


def state() -> dict[str, list[dict[str, object]]]:
    v4b, v6b = addr("b", 4), addr("b", 6)
    sets = [{"id": "s:clients", "type": "net", "members": nets("c")},
            {"id": "n:http-b", "type": "ip_and_port", "members": [f"{v4b},tcp:8081", f"{v6b},tcp:8081"]}]
    pols = [policy("t1-deny-a", tier="tier1", inbound=[{"action": "deny", "src_net": nets("a")},
                                                        {"action": "pass"}]),
            policy(LONG, inbound=[{"action": "allow", "src_ip_set_ids": ["s:clients"]},
                                  {"action": "allow", "protocol": "tcp", "dst_named_port_ip_set_ids": ["n:http-b"]},
                                  {"action": "allow", "protocol": "udp", "dst_ports": [5353, "6000:6010"]}]),
            policy("out-no-ping", outbound=[{"action": "deny", "protocol": "icmp", "icmp_type": 8},
                                            {"action": "deny", "protocol": "icmpv6", "icmp_type": 128},
                                            {"action": "allow"}])]
    wls = [workload("a"),
           workload("b", tiers=[tier("tier1", ingress=["t1-deny-a"]), tier("default", ingress=[LONG])]),
           workload("c", egress=["out-no-ping"])]
    return datastore(ipsets=sets, policies=pols, workloads=wls)


def main() -> None:
    modes = sys.argv[1:] or ["iptables-legacy", "iptables-nft", "nftables"]
    for mode in modes:
        node = FvNode.create(mode)
        try:
            node.apply(state())
            out = HERE / mode
            out.mkdir(exist_ok=True)
            run = lambda *cmd: nsmod.run_in(node.netns, *cmd).stdout  # noqa: E731
            if mode == "nftables":
                (out / "nft.json").write_text(run("nft", "-j", "list", "ruleset"))
            else:
                b = mode.split("-")[1]
                (out / "iptables-save.txt").write_text(run(f"iptables-{b}-save"))
                (out / "ip6tables-save.txt").write_text(run(f"ip6tables-{b}-save"))
                (out / "ipset-save.txt").write_text(run("ipset", "save"))
            (out / "addr.json").write_text(run("ip", "-j", "addr"))
            for v in (4, 6):
                (out / f"route{v}.json").write_text(run("ip", f"-{v}", "-j", "route"))
        finally:
            node.close()


if __name__ == "__main__":
    main()
