"""``felixpy explain``: arguments and the command (registered in :mod:`felixpy.cli`)."""

from __future__ import annotations

import argparse
import sys

from felixpy.drivers.cmdshim import SubprocessRunner
from felixpy.explain.packet import make_packet
from felixpy.explain.readers import READERS, in_background, read_kernel

EXIT_NOT_FELIXPY = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", required=True, help="source IP (v4 or v6)")
    p.add_argument("--dst", required=True, help="destination IP (same family as --src)")
    p.add_argument("--proto", required=True, help="tcp, udp, icmp, icmpv6 or a protocol number")
    p.add_argument("--sport", type=int, help="source port (default 40000, an ephemeral port)")
    p.add_argument("--dport", type=int, help="destination port")
    p.add_argument("--icmp-type", type=int, help="ICMP type (default: echo request)")
    p.add_argument("--icmp-code", type=int, help="ICMP code (default 0)")
    p.add_argument("--from-iface", help="interface the packet arrives on (default: the route back to --src)")
    p.add_argument("--to-iface", help="interface the packet leaves by (default: the route to --dst)")
    p.add_argument("--netns", help="network namespace to read (default: this process's)")
    p.add_argument("--mode", choices=[r.mode for r in READERS],
                   help="read only this dataplane mode (default: the first that holds felixpy's state)")
    p.add_argument("--bpf-pin-root",
                   help="BPF mode: where the daemon pins its maps (default: $FELIXPY_BPF_PIN_ROOT or "
                        "/sys/fs/bpf/tc/globals); read in this process's mount namespace")
    p.add_argument("--json", action="store_true", help="print a JSON object (verdict, path, …)")


def main(args: argparse.Namespace) -> int:
    """0: explained; 2: bad arguments; 3: the kernel holds no felixpy state explain can read (none, or
    BPF mode without felixpy's pins at the pin root)."""
    try:
        pkt = make_packet(args.src, args.dst, args.proto, sport=args.sport, dport=args.dport,
                          icmp_type=args.icmp_type, icmp_code=args.icmp_code)
    except ValueError as exc:
        print(f"felixpy explain: {exc}", file=sys.stderr)
        return 2
    runner = SubprocessRunner(netns=args.netns)
    reading = in_background(lambda: read_kernel(runner, pkt.ip_version, mode=args.mode,
                                                 bpf_pin_root=args.bpf_pin_root))
    # The evaluator, the rule model and the printer are imported while the dump tools run.
    from felixpy.explain.output import to_json, to_text
    from felixpy.explain.query import NotFelixpyState, explain_packet

    state = reading.result()
    try:
        ex = explain_packet(state, pkt, from_iface=args.from_iface, to_iface=args.to_iface)
    except NotFelixpyState as exc:
        where = f" (netns {args.netns})" if args.netns else ""
        print(f"felixpy explain: {exc}{where}", file=sys.stderr)
        return EXIT_NOT_FELIXPY
    print(to_json(ex) if args.json else to_text(ex))
    return 0
