"""One question, one answer: a packet against a :class:`~.readers.KernelState` read once.

The FV cross-check and the CLI both come through :func:`explain_packet`; the kernel
is read by the caller (once per matrix in FV), so many packets cost one read.
"""

from __future__ import annotations

from dataclasses import replace

from felixpy.explain.evaluate import direction_of, evaluate
from felixpy.explain.host import interfaces_for
from felixpy.explain.packet import Packet
from felixpy.explain.path import Explanation, explain
from felixpy.explain.readers import KernelState, is_bpf_mode


class NotFelixpyState(Exception):
    """The kernel holds no felixpy chains/tables for this IP family."""


class BPFModeState(NotFelixpyState):
    """felixpy runs in BPF mode: its policy is in the BPF programs, the *tables hold only the gap guards."""


def explain_packet(state: KernelState, pkt: Packet, *, from_iface: str | None = None,
                   to_iface: str | None = None) -> Explanation:
    rs = state.ruleset
    if rs is None:
        raise NotFelixpyState(
            f"no felixpy state for IPv{state.ip_version} in this network namespace: no cali- chains in "
            "iptables-nft-save or iptables-legacy-save, and no nftables 'calico' table")
    bpf = is_bpf_mode(state)
    if bpf and state.bpf is None:
        raise BPFModeState(
            f"felixpy runs this node in BPF mode ({rs.backend} holds only the guards around the BPF programs, "
            f"which decide the policy), but its BPF state cannot be read: "
            f"{state.bpf_problem or 'the pins were not read'}")
    iif, oif, notes = interfaces_for(state.host, pkt.src, pkt.dst)
    if from_iface is not None:
        iif = from_iface
        notes = [n for n in notes if "in interface" not in n]
    if to_iface is not None:
        oif = to_iface
        notes = [n for n in notes if "out interface" not in n]
    pkt = replace(pkt, iif=iif, oif=oif)
    direction = direction_of(pkt, rs.local_addrs)
    if bpf and state.bpf is not None:
        from felixpy.explain.bpf import explain_bpf

        mode = "bpf-legacy" if rs.backend == "iptables-legacy" else "bpf-nft"
        if oif is None and direction != "input":
            return Explanation(pkt.describe(), mode, rs.ip_version, direction, "deny",
                               decided_by={"by": "routing", "reason": f"no route to {pkt.dst}"}, notes=notes)
        ex = explain_bpf(state.bpf, pkt, direction, mode, ruleset=rs)
        ex.notes = notes + ex.notes
        return ex
    if oif is None and direction != "input":
        # No route: the kernel drops it (or the sender gets ENETUNREACH) before any rule is met.
        return Explanation(pkt.describe(), rs.backend, rs.ip_version, direction, "deny",
                           decided_by={"by": "routing", "reason": f"no route to {pkt.dst}"}, notes=notes)
    ex = explain(rs, evaluate(rs, pkt, direction))
    ex.notes = notes + ex.notes
    return ex
