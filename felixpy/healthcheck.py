"""``felixpy health --live|--ready``: an exec probe for Kubernetes (the image has no curl).

Asks the daemon's own health server (``HealthHost``:``HealthPort``, resolved from the
environment and config file exactly as the daemon resolves them) for ``/liveness``
or ``/readiness``.  Exit 0 when it answers 200, 1 otherwise (503, refused, timed out,
health disabled) with the reason on stderr, so ``kubectl describe pod`` shows why.
"""

from __future__ import annotations

import argparse
import sys

WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}  # listening on all → ask loopback


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("health", help="probe the running daemon's health endpoint (exit 0 healthy, 1 not)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--live", action="store_true", help="liveness: the dataplane loop is running")
    which.add_argument("--ready", action="store_true", help="readiness: in sync with its feed and programmed")
    p.add_argument("--config-file", help="the daemon's config file, if it uses one")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")


def url_for(host: str, port: int, ready: bool) -> str:
    host = WILDCARDS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/{'readiness' if ready else 'liveness'}"


def main(args: argparse.Namespace) -> int:
    # Imported here: the CLI registers this command for every invocation, and urllib is ~35 ms of
    # every other command's start (``felixpy explain`` among them).
    import urllib.error
    import urllib.request

    from felixpy import config as configmod

    cfg, _ = configmod.load(config_file=args.config_file)
    if not cfg.HealthEnabled:
        print("felixpy health: HealthEnabled is false (set FELIX_HEALTHENABLED=true)", file=sys.stderr)
        return 1
    url = url_for(cfg.HealthHost, cfg.HealthPort, args.ready)
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as r:
            body = r.read().decode(errors="replace")
            code = r.status
    except urllib.error.HTTPError as exc:
        code, body = exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        print(f"felixpy health: {url}: {exc}", file=sys.stderr)
        return 1
    if code == 200:
        print(body)
        return 0
    print(f"felixpy health: {url} answered {code}: {body}", file=sys.stderr)
    return 1
