"""Run the real daemon (from this checkout) as a subprocess inside a network namespace."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Each daemon's socket and log live in a temp dir, removed when this process exits
# (tests read logs after stop(); the demo keeps its log for the user).
_TMPDIRS: set[str] = set()


@atexit.register
def _remove_tmpdirs() -> None:
    for d in list(_TMPDIRS):
        shutil.rmtree(d, ignore_errors=True)


@dataclass
class DaemonProcess:
    netns: str
    socket_path: str
    transport: str  # "unix" | "grpc"
    proc: subprocess.Popen[bytes]
    log_path: str
    env: dict[str, str] = field(default_factory=dict)
    status_socket: str = ""  # ``felixpy status --socket``: per daemon, never the shared default path

    @property
    def target(self) -> str:
        return f"grpc:unix:{self.socket_path}" if self.transport == "grpc" else f"unix:{self.socket_path}"

    def logs(self) -> str:
        with contextlib.suppress(FileNotFoundError):
            return Path(self.log_path).read_text(errors="replace")
        return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 10) -> int:
        return self.proc.wait(timeout)

    def keep_logs(self) -> None:
        """Leave this daemon's log directory behind when the process exits."""
        _TMPDIRS.discard(os.path.dirname(self.log_path))

    def stop(self, timeout: float = 10) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def start_daemon(netns: str, *, transport: str = "unix", env: Mapping[str, str] | None = None,
                 extra_args: tuple[str, ...] = (), iface_monitor: bool = True,
                 wait_socket: float = 15.0) -> DaemonProcess:
    tmp = tempfile.mkdtemp(prefix="fpyd-")
    _TMPDIRS.add(tmp)
    sock = os.path.join(tmp, "felixpy.sock")
    log_path = os.path.join(tmp, "daemon.log")
    status_socket = os.path.join(tmp, "status.sock")
    listen = f"grpc:unix:{sock}" if transport == "grpc" else f"unix:{sock}"
    # The daemon writes Felix's MTU file: keep it out of the machine's /var/lib/calico.
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "FELIXPY_MTU_FILE": os.path.join(tmp, "mtu"), **(env or {})}
    args = ["ip", "netns", "exec", netns, sys.executable, "-m", "felixpy", "run", "--listen", listen,
            "--status-socket", status_socket, *extra_args]
    if not iface_monitor:
        args.append("--no-iface-monitor")
    log_f = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(args, stdout=log_f, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO))
    log_f.close()
    d = DaemonProcess(netns, sock, transport, proc, log_path, dict(env or {}), status_socket)
    deadline = time.monotonic() + wait_socket
    while not os.path.exists(sock):
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited {proc.returncode} before listening:\n{d.logs()}")
        if time.monotonic() > deadline:
            d.stop()
            raise RuntimeError(f"daemon did not listen within {wait_socket}s:\n{d.logs()}")
        time.sleep(0.02)
    return d


def http_status(netns: str, port: int, path: str) -> int | None:
    """The HTTP status of ``http://127.0.0.1:<port>/<path>`` inside *netns* (a daemon's health or
    metrics server), or None when nothing serves there (yet, or any more)."""
    from felixpy.testing import netns as nsmod

    with nsmod.entered(netns):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return None
