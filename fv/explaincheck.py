"""The explain cross-check every FV connectivity assertion runs: explain's verdict = what the packet did.

For one matrix (one IP family) the node's kernel is read once (:func:`read_kernel`,
whatever mode holds felixpy's state) and every cell is evaluated in-process: the
probe's first packet (conntrack NEW) and its reply (ESTABLISHED, addresses and ports
swapped — an echo reply for ICMP).  A probe gets through exactly when both are
allowed: e.g. host → unknown ``cali`` interface is allowed out but its reply is
dropped by the fail-closed dispatch, which is how that probe fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from felixpy.drivers.cmdshim import SubprocessRunner
from felixpy.explain.output import to_text
from felixpy.explain.packet import Packet, make_packet
from felixpy.explain.path import Explanation
from felixpy.explain.query import explain_packet
from felixpy.explain.readers import KernelState, read_kernel
from felixpy.testing import conncheck as cc

Cell = tuple[cc.Probe, str, str]
REPLY_SPORT = 40000


def _packets(probe: cc.Probe, src: str, dst: str) -> tuple[Packet, Packet]:
    if probe.proto == "icmp":
        v6 = ":" in src
        req = make_packet(src, dst, "icmpv6" if v6 else "icmp")
        reply = make_packet(dst, src, "icmpv6" if v6 else "icmp", icmp_type=129 if v6 else 0)
    else:
        req = make_packet(src, dst, probe.proto, sport=REPLY_SPORT, dport=probe.port)
        reply = make_packet(dst, src, probe.proto, sport=probe.port, dport=REPLY_SPORT)
    return req, replace(reply, ct_state="ESTABLISHED")


def explain_cell(state: KernelState, probe: cc.Probe, src_ip: str, dst_ip: str
                 ) -> tuple[bool, Explanation, Explanation]:
    req, reply = _packets(probe, src_ip, dst_ip)
    ex_req = explain_packet(state, req)
    ex_reply = explain_packet(state, reply)
    return ex_req.verdict == "allow" and ex_reply.verdict == "allow", ex_req, ex_reply


def cross_check(netns: str, v: int, endpoints: Mapping[str, cc.Endpoint], actual: Mapping[Cell, bool],
                label: str) -> None:
    """Raise AssertionError naming every cell where explain disagrees with the real probe."""
    __tracebackhide__ = True
    runner = SubprocessRunner(netns=netns)
    state = read_kernel(runner, v, full=True)
    states = [("full dump", state)]
    if state.ruleset is not None and state.ruleset.backend == "nftables":
        # The CLI's own path in nftables mode: chains, sets and maps read one by one over netlink.
        states.append(("per-object netlink", read_kernel(runner, v, full=False)))
    wrong: list[str] = []
    for (probe, s, d), got in sorted(actual.items()):
        for how, st in states:
            ok, ex_req, ex_reply = explain_cell(st, probe, endpoints[s].ip(v), endpoints[d].ip(v))
            if ok == got:
                continue
            wrong.append(f"{probe} {s} -> {d} ({how} read): packet {'passed' if got else 'blocked'}, explain says "
                         f"{'allow' if ok else 'deny'}\n  request:\n    "
                         + to_text(ex_req).replace("\n", "\n    ") + "\n  reply:\n    "
                         + to_text(ex_reply).replace("\n", "\n    "))
    if wrong:
        raise AssertionError(f"[{label} IPv{v}] felixpy explain disagrees with {len(wrong)} of {len(actual)} "
                             "probes:\n" + "\n".join(wrong))
