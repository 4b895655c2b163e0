"""The explain cross-check every FV connectivity assertion runs: explain's verdict = what the packet did.

For one matrix (one IP family) the node's kernel is read once (:func:`read_kernel`,
whatever mode holds felixpy's state) and every cell is evaluated in-process: the
probe's first packet (conntrack NEW) and its reply (ESTABLISHED, addresses and ports
swapped — an echo reply for ICMP).  A probe gets through exactly when both are
allowed: e.g. host → unknown ``cali`` interface is allowed out but its reply is
dropped by the fail-closed dispatch, which is how that probe fails.

In the BPF modes the harness passes the node's pin root (its private bpffs), so the same
cells are explained from the pins.  :func:`cross_check_flows` does the same for probes named by
source namespace and destination address (fv/test_hostendpoints.py's outside namespaces), the
source address being the one the kernel picks in that namespace (``ip route get``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from felixpy.drivers.cmdshim import SubprocessRunner
from felixpy.explain.output import to_text
from felixpy.explain.packet import Packet, make_packet
from felixpy.explain.path import Explanation
from felixpy.explain.query import explain_packet
from felixpy.explain.readers import KernelState, read_kernel
from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod

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


def _states(netns: str, v: int, bpf_pin_root: str | None) -> list[tuple[str, KernelState]]:
    runner = SubprocessRunner(netns=netns)
    state = read_kernel(runner, v, full=True, bpf_pin_root=bpf_pin_root)
    if bpf_pin_root is not None:
        assert state.bpf is not None, f"the pins under {bpf_pin_root} were not read: {state.bpf_problem}"
    states = [("full dump", state)]
    if state.ruleset is not None and state.ruleset.backend == "nftables" and state.bpf is None:
        # The CLI's own path in nftables mode: chains, sets and maps read one by one over netlink.
        states.append(("per-object netlink", read_kernel(runner, v, full=False)))
    return states


def _disagreement(what: str, how: str, got: bool, ok: bool, ex_req: Explanation, ex_reply: Explanation) -> str:
    return (f"{what} ({how} read): packet {'passed' if got else 'blocked'}, explain says "
            f"{'allow' if ok else 'deny'}\n  request:\n    "
            + to_text(ex_req).replace("\n", "\n    ") + "\n  reply:\n    "
            + to_text(ex_reply).replace("\n", "\n    "))


def cross_check(netns: str, v: int, endpoints: Mapping[str, cc.Endpoint], actual: Mapping[Cell, bool],
                label: str, *, bpf_pin_root: str | None = None) -> None:
    """Raise AssertionError naming every cell where explain disagrees with the real probe."""
    __tracebackhide__ = True
    states = _states(netns, v, bpf_pin_root)
    wrong: list[str] = []
    for (probe, s, d), got in sorted(actual.items()):
        for how, st in states:
            ok, ex_req, ex_reply = explain_cell(st, probe, endpoints[s].ip(v), endpoints[d].ip(v))
            if ok != got:
                wrong.append(_disagreement(f"{probe} {s} -> {d}", how, got, ok, ex_req, ex_reply))
    if wrong:
        raise AssertionError(f"[{label} IPv{v}] felixpy explain disagrees with {len(wrong)} of {len(actual)} "
                             "probes:\n" + "\n".join(wrong))


Flow = tuple[str, str, cc.Probe]   # source namespace, destination address, probe


def source_address(netns: str, dst: str) -> str:
    """The address a socket in ``netns`` sends from towards ``dst`` (the route's preferred source)."""
    out = nsmod.run_in(netns, "ip", "-j", "route", "get", dst).stdout
    routes = json.loads(out or "[]")
    if not routes or "prefsrc" not in routes[0]:
        raise AssertionError(f"no source address in {netns} towards {dst}: {out!r}")
    return str(routes[0]["prefsrc"])


def cross_check_flows(netns: str, v: int, actual: Mapping[Flow, bool], label: str, *,
                      bpf_pin_root: str | None = None) -> None:
    """As :func:`cross_check`, for probes named by source namespace and destination address."""
    __tracebackhide__ = True
    states = _states(netns, v, bpf_pin_root)
    wrong: list[str] = []
    for (src_ns, dst, probe), got in sorted(actual.items(), key=str):
        src = source_address(src_ns, dst)
        for how, st in states:
            ok, ex_req, ex_reply = explain_cell(st, probe, src, dst)
            if ok != got:
                wrong.append(_disagreement(f"{probe} {src_ns} ({src}) -> {dst}", how, got, ok, ex_req, ex_reply))
    if wrong:
        raise AssertionError(f"[{label} IPv{v}] felixpy explain disagrees with {len(wrong)} of {len(actual)} "
                             "probes:\n" + "\n".join(wrong))
