"""Command line: ``felixpy run | feed | replay | demo | version``.

``felixpy-dataplane-driver`` (no arguments) is the entry point Felix execs as its
external ``DataplaneDriver``: messages on fd 3, replies on fd 4.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from felixpy import __version__

if TYPE_CHECKING:  # imported lazily at run time: a subcommand only pays for what it uses (grpc, pyroute2)
    from felixpy.daemon import Daemon
    from felixpy.feed.client import FeedClient
    from felixpy.ifacemonitor import InterfaceMonitor
    from felixpy.transports.grpcsvc import GrpcServer
    from felixpy.transports.stream import UnixSocketServer


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="felixpy", description="A Python port of Calico Felix's Linux dataplane.")
    sub = p.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser("run", help="run the dataplane daemon")
    src = run.add_mutually_exclusive_group(required=True)
    src.add_argument("--listen", metavar="unix:PATH|grpc:unix:PATH",
                     help="serve one feed at a time on a unix socket (framed) or gRPC")
    src.add_argument("--driver", action="store_true",
                     help="Felix external-driver mode: read fd 3, write fd 4, exit when Felix closes the pipe")
    run.add_argument("--config-file", help="optional Felix-style config file (Name = value, or YAML)")
    run.add_argument("--no-iface-monitor", action="store_true",
                     help="don't watch interfaces (treat the interface set as in sync at once)")

    feed = sub.add_parser("feed", help="stream a YAML scenario to a daemon (or record it)")
    feed.add_argument("scenario", help="scenario YAML path, or 'demo' for the bundled one")
    feed.add_argument("--to", metavar="unix:PATH|grpc:unix:PATH", help="daemon to stream to")
    feed.add_argument("--record", metavar="FILE", help="also write the raw framed stream to FILE")
    feed.add_argument("--no-steps", action="store_true", help="send only the initial batch")
    feed.add_argument("--in-sync-timeout", type=float, default=60.0)
    feed.add_argument("--hold", type=float, default=0.0, help="keep the feed open this long at the end")
    feed.add_argument("--replace", action="store_true",
                      help="take over from an active feed (a calc graph that restarted while its old connection "
                           "never closed); without it a daemon with an active feed refuses this one")

    rep = sub.add_parser("replay", help="stream a recorded framed file to a daemon")
    rep.add_argument("file")
    rep.add_argument("--to", required=True, metavar="unix:PATH|grpc:unix:PATH")
    rep.add_argument("--hold", type=float, default=0.0)

    demo = sub.add_parser("demo", help="run a demo node in sandbox network namespaces")
    demo.add_argument("--mode", default="iptables-legacy",
                      choices=["iptables-legacy", "iptables-nft", "nftables"])
    demo.add_argument("--scenario", default="demo")

    sub.add_parser("version", help="print the version")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "version":
        print(f"felixpy {__version__}")
        return 0
    if args.cmd == "run":
        return _run(args)
    if args.cmd == "feed":
        return _feed(args)
    if args.cmd == "replay":
        return _replay(args)
    if args.cmd == "demo":
        from felixpy import demo

        return demo.main(mode=args.mode, scenario=args.scenario)
    return 2


def _configure_logging(config_file: str | None) -> None:
    from felixpy import config as configmod
    from felixpy import logs

    cfg, _ = configmod.load(config_file=config_file)
    logs.configure(cfg.LogSeverityScreen)


def _run(args: argparse.Namespace) -> int:
    from felixpy.daemon import Daemon
    from felixpy.dataplane.wiring import build_dataplane

    _configure_logging(args.config_file)
    daemon = Daemon(build=build_dataplane, config_file=args.config_file, exit_when_feed_closes=args.driver)
    daemon.install_signal_handlers()
    monitor = None if args.no_iface_monitor else _start_iface_monitor(daemon, args.config_file)
    servers: list[GrpcServer | UnixSocketServer] = []
    try:
        if args.driver:
            from felixpy.transports.stream import open_pipe_feed

            open_pipe_feed(daemon.events).start()
        elif args.listen.startswith("grpc:"):
            from felixpy.transports.grpcsvc import GrpcServer

            g = GrpcServer(args.listen[len("grpc:"):], daemon.events)
            g.start()
            servers.append(g)
        elif args.listen.startswith("unix:"):
            from felixpy.transports.stream import UnixSocketServer

            u = UnixSocketServer(args.listen[len("unix:"):], daemon.events)
            u.start()
            servers.append(u)
        else:
            print(f"felixpy: bad --listen {args.listen!r}", file=sys.stderr)
            return 2
        return daemon.run()
    finally:
        for s in servers:
            s.stop()
        if monitor is not None:
            monitor.stop()


def _start_iface_monitor(daemon: Daemon, config_file: str | None) -> InterfaceMonitor | None:
    try:
        from felixpy.ifacemonitor import InterfaceMonitor
    except ImportError:
        return None
    from felixpy import config as configmod

    cfg, _ = configmod.load(config_file=config_file)
    mon = InterfaceMonitor(cfg, **daemon.iface_callbacks())
    mon.start()
    return mon


def _feed(args: argparse.Namespace) -> int:
    from felixpy.feed.client import connect
    from felixpy.feed.framing import write_recording
    from felixpy.feed.scenario import bundled_scenario_path, load_scenario

    path = bundled_scenario_path(args.scenario) if args.scenario in ("demo",) else args.scenario
    sc = load_scenario(path)
    if args.record:
        n = write_recording(args.record, sc.all_messages())
        print(f"recorded {n} messages to {args.record}")
    if not args.to:
        return 0
    client = connect(args.to, replace=args.replace)
    client.send(sc.initial)
    print(f"sent {len(sc.initial)} messages (initial batch, ending with InSync)")
    try:
        client.wait_in_sync(args.in_sync_timeout)
        print("daemon reports DataplaneInSync")
    except TimeoutError as exc:
        if client.closed and not client.received and not args.replace:
            print("felixpy feed: the daemon refused this feed: another feed is active (nothing was changed; "
                  "--replace takes over from a calc graph whose old connection never closed)", file=sys.stderr)
        else:
            print(f"felixpy feed: {exc}", file=sys.stderr)
        client.close()
        return 1
    if not args.no_steps:
        for i, step in enumerate(sc.steps):
            time.sleep(step.after_seconds)
            client.send(step.messages)
            print(f"step {i + 1}: sent {len(step.messages)} messages {step.description}".rstrip())
    time.sleep(args.hold)
    _print_replies(client)
    client.close()
    return 0


def _replay(args: argparse.Namespace) -> int:
    from felixpy.feed.client import connect
    from felixpy.feed.framing import read_recording

    msgs = list(read_recording(args.file))
    client = connect(args.to)
    client.send(msgs)
    print(f"replayed {len(msgs)} messages")
    time.sleep(args.hold)
    _print_replies(client)
    client.close()
    return 0


def _print_replies(client: FeedClient) -> None:
    from felixpy.messages import from_payload_of

    for m in list(client.received):
        name, payload = from_payload_of(m)
        if name != "process_status_update":
            print(f"  <- {name}: {str(payload).strip() or '{}'}".replace("\n", " "))


def driver_main() -> int:
    """Felix's external driver: exec'd with no arguments, fds 3 and 4 open."""
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print("felixpy-dataplane-driver: Felix external dataplane driver (reads fd 3, writes fd 4)")
        return 0
    for fd in (3, 4):
        try:
            os.fstat(fd)
        except OSError:
            print(f"felixpy-dataplane-driver: fd {fd} is not open; Felix must exec this driver",
                  file=sys.stderr)
            return 2
    return main(["run", "--driver"])


if __name__ == "__main__":
    sys.exit(main())
