"""Command line: ``felixpy run | status | feed | replay | demo | explain | health | version``.

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
from felixpy.errors import ConfigError, FelixpyError
from felixpy.nodestatus import DEFAULT_STATUS_SOCKET

if TYPE_CHECKING:  # imported lazily at run time: a subcommand only pays for what it uses (grpc, pyroute2)
    from felixpy.daemon import Daemon
    from felixpy.feed.scenario import Scenario
    from felixpy.feed.client import FeedClient
    from felixpy.ifacemonitor import InterfaceMonitor
    from felixpy.transports.grpcsvc import GrpcServer
    from felixpy.transports.stream import UnixSocketServer


RUN_EXIT_CODES = """\
exit codes:
  0    clean stop: SIGTERM/SIGINT, or (--driver) Felix closed the pipe
  1    fatal: dataplane programming failed persistently (fail closed, as Felix panics),
       the interface monitor failed, or the feed broke in --driver mode
  2    usage or input error: bad flags, a malformed config file, or a configuration felixpy
       cannot build (e.g. BPFEnabled=true)
  129  configuration changed in a way that needs a restart (the supervisor restarts us)
"""


def _status_socket_default() -> str:
    return os.environ.get("FELIXPY_STATUS_SOCKET", DEFAULT_STATUS_SOCKET)


class InputError(FelixpyError):
    """A file or value the user gave cannot be used (exit 2)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="felixpy", description="A Python port of Calico Felix's Linux dataplane.")
    p.add_argument("--version", action="version", version=f"felixpy {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the dataplane daemon", description="Run the dataplane daemon.",
                         epilog=RUN_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = run.add_mutually_exclusive_group(required=True)
    src.add_argument("--listen", metavar="unix:PATH|grpc:unix:PATH",
                     help="serve one feed at a time on a unix socket (framed) or gRPC")
    src.add_argument("--driver", action="store_true",
                     help="Felix external-driver mode: read fd 3, write fd 4, exit when Felix closes the pipe")
    run.add_argument("--config-file", metavar="FILE",
                     help="optional Felix config file (INI, e.g. a [global] section of Name = value lines)")
    run.add_argument("--no-iface-monitor", action="store_true",
                     help="don't watch interfaces (treat the interface set as in sync at once)")
    run.add_argument("--status-socket", metavar="PATH", default=_status_socket_default(),
                     help="serve `felixpy status` on this root-only unix socket (default $FELIXPY_STATUS_SOCKET "
                          f"or {DEFAULT_STATUS_SOCKET}; '' disables)")

    st = sub.add_parser("status", help="show what the running daemon is doing",
                        description="Ask the running daemon (root only) for its feed, sync, last apply and counts.")
    st.add_argument("--json", action="store_true", help="print the status document as JSON")
    st.add_argument("--socket", metavar="PATH", default=_status_socket_default(),
                    help=f"the daemon's status socket (default $FELIXPY_STATUS_SOCKET or {DEFAULT_STATUS_SOCKET})")

    feed = sub.add_parser("feed", help="stream a YAML scenario to a daemon (or record it)",
                          description="Stream a YAML scenario to a daemon, record it, or --check it.")
    feed.add_argument("scenario", help="scenario YAML path, or 'demo' for the bundled one")
    feed.add_argument("--to", metavar="unix:PATH|grpc:unix:PATH", help="daemon to stream to")
    feed.add_argument("--record", metavar="FILE", help="also write the raw framed stream to FILE")
    feed.add_argument("--check", action="store_true",
                      help="only validate the scenario (including its config values); send nothing")
    feed.add_argument("--no-steps", action="store_true", help="send only the initial batch")
    feed.add_argument("--in-sync-timeout", type=float, default=60.0, metavar="SECONDS",
                      help="how long to wait for DataplaneInSync after the initial batch (default 60)")
    feed.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                      help="keep the feed open this long at the end")
    feed.add_argument("--replace", action="store_true",
                      help="take over from an active feed (a calc graph that restarted while its old connection "
                           "never closed); without it a daemon with an active feed refuses this one")

    rep = sub.add_parser("replay", help="stream a recorded framed file to a daemon",
                         description="Stream a recording (felixpy feed --record) to a daemon.")
    rep.add_argument("file", help="recording written by `felixpy feed --record`")
    rep.add_argument("--to", required=True, metavar="unix:PATH|grpc:unix:PATH", help="daemon to stream to")
    rep.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                     help="keep the feed open this long at the end")

    demo = sub.add_parser("demo", help="run a demo node in sandbox network namespaces",
                          description="Run a demo node in sandbox network namespaces.")
    demo.add_argument("--mode", default="iptables-legacy", choices=["iptables-legacy", "iptables-nft", "nftables", "bpf"],
                      help="dataplane mode (default iptables-legacy)")
    demo.add_argument("--scenario", default="demo", help="scenario YAML path, or 'demo' for the bundled one")

    explain = sub.add_parser("explain", help="explain what the kernel's rules do with one packet",
                             description="Explain what the kernel's rules do with one packet.")
    from felixpy.explain import command as explain_command

    explain_command.add_arguments(explain)

    sub.add_parser("version", help="print the version", description="Print the version.")
    from felixpy import healthcheck

    healthcheck.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command.  felixpy's own errors and OSErrors end in one line on stderr, no traceback:
    exit 2 for usage and input errors, 1 for the rest."""
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (InputError, ConfigError) as exc:  # ScenarioError is a ConfigError
        print(f"felixpy {args.cmd}: {exc}", file=sys.stderr)
        return 2
    except (FelixpyError, OSError) as exc:
        print(f"felixpy {args.cmd}: {_describe(exc)}", file=sys.stderr)
        return 1


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{exc.strerror}{': ' + str(where) if where else ''}"
    return str(exc)


def _dispatch(args: argparse.Namespace) -> int:
    if args.cmd == "version":
        print(f"felixpy {__version__}")
        return 0
    if args.cmd == "run":
        return _run(args)
    if args.cmd == "status":
        return _status(args)
    if args.cmd == "feed":
        return _feed(args)
    if args.cmd == "replay":
        return _replay(args)
    if args.cmd == "health":
        from felixpy import healthcheck

        return healthcheck.main(args)
    if args.cmd == "explain":
        from felixpy.explain import command as explain_command

        return explain_command.main(args)
    if args.cmd == "demo":
        from felixpy import demo

        return demo.main(mode=args.mode, scenario=args.scenario)
    return 2


def _configure_logging(config_file: str | None) -> None:
    from felixpy import config as configmod
    from felixpy import logs

    logs.configure("INFO")  # so that what loading the config reports (typos, bad values) is formatted too
    cfg, _ = configmod.load(config_file=config_file)
    logs.configure(cfg.LogSeverityScreen)


def _run(args: argparse.Namespace) -> int:
    from felixpy.daemon import Daemon, limit_malloc_arenas
    from felixpy.dataplane.wiring import build_dataplane
    from felixpy.nodestatus import StatusServer

    limit_malloc_arenas()  # before any thread of ours mallocs

    if not (args.driver or args.listen.startswith(("grpc:", "unix:"))):
        raise InputError(f"bad --listen {args.listen!r}: expected unix:PATH or grpc:unix:PATH")
    _configure_logging(args.config_file)
    daemon = Daemon(build=build_dataplane, config_file=args.config_file, exit_when_feed_closes=args.driver)
    daemon.install_signal_handlers()
    status = StatusServer(args.status_socket, daemon.events.put) if args.status_socket else None
    if status is not None and not status.start():
        status = None
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
        else:
            from felixpy.transports.stream import UnixSocketServer

            u = UnixSocketServer(args.listen[len("unix:"):], daemon.events)
            u.start()
            servers.append(u)
        return daemon.run()
    finally:
        for s in servers:
            s.stop()
        if monitor is not None:
            monitor.stop()
        if status is not None:
            status.stop()


def _status(args: argparse.Namespace) -> int:
    import json

    from felixpy.nodestatus import query, render_human

    doc = query(args.socket)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render_human(doc), end="")
    return 0


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
    from felixpy.feed.framing import write_recording
    from felixpy.feed.scenario import bundled_scenario_path, load_scenario

    if not (args.to or args.record or args.check):
        raise InputError("nothing to do: give --to to stream to a daemon, --record FILE, or --check")
    path = bundled_scenario_path(args.scenario) if args.scenario in ("demo",) else args.scenario
    sc = load_scenario(path)
    if args.check:
        return _check_scenario(str(path), sc)
    if args.record:
        try:
            n = write_recording(args.record, sc.all_messages())
        except OSError as exc:
            raise InputError(f"cannot write recording: {_describe(exc)}") from None
        print(f"recorded {n} messages to {args.record}")
    if not args.to:
        return 0
    client = _connect(args.to, replace=args.replace)
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


def _check_scenario(path: str, sc: Scenario) -> int:
    """``feed --check``: the scenario parsed; now every ConfigUpdate's values, as the daemon would."""
    from felixpy import config as configmod

    errors: list[str] = []
    updates = [m.config_update for m in sc.all_messages() if m.HasField("config_update")]
    for i, upd in enumerate(updates):
        where = "config" if i == 0 else f"config update {i + 1}"
        problems, unknown = configmod.check_values(dict(upd.config))
        errors += [f"{where}.{p.param}: {p.raw!r}: {p.error}" for p in problems]
        errors += [f"{where}.{name}: unknown parameter{'; did you mean ' + guess + '?' if guess else ''}"
                   for name, guess in unknown]
    for e in errors:
        print(f"{path}: {e}", file=sys.stderr)
    if errors:
        return 2
    n = sum(1 for _ in sc.all_messages())
    print(f"{path}: OK ({n} messages: initial batch of {len(sc.initial)}, steps: {len(sc.steps)})")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from felixpy.feed.framing import FramingError, read_recording

    try:
        msgs = list(read_recording(args.file))
    except (OSError, FramingError) as exc:
        raise InputError(f"cannot read recording {args.file}: {_describe(exc)}") from None
    client = _connect(args.to)
    client.send(msgs)
    print(f"replayed {len(msgs)} messages")
    time.sleep(args.hold)
    _print_replies(client)
    client.close()
    return 0


def _connect(target: str, *, replace: bool = False) -> FeedClient:
    from felixpy.feed.client import connect

    try:
        return connect(target, replace=replace)
    except ValueError as exc:  # a malformed --to
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise FelixpyError(f"cannot connect to {target}: {exc.strerror or exc}") from None


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
