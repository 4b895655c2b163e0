"""Shared by the real-daemon kernel tests (feed safety, persistent failure): a small datastore, feeding it,
and the node's kernel state read back (iptables-nft mode)."""

from __future__ import annotations

import re

from felixpy.feed.client import connect
from felixpy.feed.scenario import scenario_from_dict
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.daemon import DaemonProcess
from felixpy.testing.netns import run_in

_COUNTERS = re.compile(r"\[\d+:\d+\]")


def datastore(members: list[str], *, port: int | None = None, policy: bool = True,
              in_sync: bool = True) -> list[pb.ToDataplane]:
    """One workload ``calia`` whose policy (unless *policy* is false) allows only the set ``s:clients``."""
    rule: dict[str, object] = {"action": "allow", "src_ip_set_ids": ["s:clients"]}
    if port is not None:
        rule.update(protocol="tcp", dst_ports=[port])
    msgs = list(scenario_from_dict({
        "config": {"ReportingIntervalSecs": "0"},
        "ipsets": [{"id": "s:clients", "members": members}],
        "profiles": [{"name": "kns", "inbound": [{"action": "allow"}], "outbound": [{"action": "allow"}]}],
        "policies": [{"name": "guard", "inbound": [rule]}] if policy else [],
        "workloads": [{"name": "calia", "ipv4_nets": ["10.65.0.2/32"], "profile_ids": ["kns"],
                       **({"tiers": [{"name": "default", "ingress": ["guard"]}]} if policy else {})}],
    }).initial)
    return msgs if in_sync else [m for m in msgs if not m.HasField("in_sync")]


def feed_until_in_sync(d: DaemonProcess, msgs: list[pb.ToDataplane]) -> None:
    """One complete feed: send, wait for DataplaneInSync, close."""
    c = connect(d.target)
    c.send(msgs)
    c.wait_in_sync(20)
    c.close()


def rules(ns: str) -> str:
    """Both families' iptables-nft rules, without counters or timestamps."""
    return "".join(_COUNTERS.sub("", ln) + "\n" for cmd in ("iptables-nft-save", "ip6tables-nft-save")
                   for ln in run_in(ns, cmd).stdout.splitlines() if not ln.startswith("#"))


def kernel(ns: str) -> str:
    """Rules plus every ipset and member."""
    return rules(ns) + "\n".join(sorted(run_in(ns, "ipset", "save").stdout.splitlines()))
