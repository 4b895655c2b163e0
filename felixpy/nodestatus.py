"""``felixpy status``: a read-only view of the running daemon, over a root-only unix socket.

The daemon serves :class:`StatusServer` on a unix socket (default
:data:`DEFAULT_STATUS_SOCKET`, mode 0600, and only peers with uid 0 are
answered).  A connection asks once and gets one JSON object back.  The
snapshot is taken by the daemon's runner thread — the only thread that may
look at the dataplane — between two event batches: the server posts a
:class:`StatusRequest` on the daemon's event queue and waits for the answer
(:data:`ANSWER_TIMEOUT`; a long apply makes it wait).

:func:`snapshot` reads only the dataplane's public attributes (its tables,
IP-set dataplanes and route syncers, each asked for ``status_counts()`` when it
has one; ``last_apply``; ``unsupported``) and the metrics registries (the
``felixpy_drift_repairs`` counter, 0 while nothing registers it).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from felixpy import __version__
from felixpy.errors import FelixpyError

if TYPE_CHECKING:
    from prometheus_client.registry import Collector



def _log() -> Any:
    """structlog, imported on first use: ``felixpy status`` (the client) never needs it."""
    import structlog

    return structlog.get_logger(__name__)


DEFAULT_STATUS_SOCKET = "/var/run/calico/felixpy-status.sock"
ANSWER_TIMEOUT = 5.0
DRIFT_METRIC = "felixpy_drift_repairs"
_COUNT_KEYS = {"chains": "chains", "rules": "rules", "sets": "ip_sets", "members": "ip_set_members",
               "bpf_sets": "bpf_ip_sets", "bpf_members": "bpf_ip_set_members",
               "routes": "routes", "bpf_programs": "bpf_programs", "bpf_attach_points": "bpf_attach_points"}


class StatusError(FelixpyError):
    """The status endpoint could not be reached or answered nonsense."""


@dataclass
class StatusRequest:
    """Posted on the daemon's event queue; the runner thread fills in :attr:`reply`."""

    reply: Future[dict[str, Any]] = field(default_factory=Future)

    def answer(self, make: Callable[[], dict[str, Any]]) -> None:
        try:
            self.reply.set_result(make())
        except Exception as exc:  # a snapshot bug must not take down the runner
            _log().exception("Status snapshot failed")
            self.reply.set_exception(exc)


# ----------------------------------------------------------------------------------- snapshot
class _Report(Protocol):
    started: float
    duration: float
    failed_steps: list[str]
    held_back: list[str]


def _iso(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).isoformat(timespec="seconds")


def _counts(objects: Iterable[object]) -> dict[str, int]:
    out: dict[str, int] = {}
    seen: set[int] = set()
    for obj in objects:
        target = obj if hasattr(obj, "status_counts") else getattr(obj, "root", None)  # nft layer views
        if target is None or id(target) in seen or not hasattr(target, "status_counts"):
            continue
        seen.add(id(target))
        for key, n in target.status_counts().items():
            if key in _COUNT_KEYS:
                out[_COUNT_KEYS[key]] = out.get(_COUNT_KEYS[key], 0) + int(n)
    return out


def drift_repairs(registries: Iterable[Collector]) -> int:
    """``felixpy_drift_repairs`` summed over its labels; 0 when no such counter is registered."""
    total = 0.0
    for reg in registries:
        for metric in reg.collect():
            if metric.name == DRIFT_METRIC:
                total += sum(s.value for s in metric.samples if s.name in (DRIFT_METRIC, DRIFT_METRIC + "_total"))
    return int(total)


def snapshot(*, session: Any, now: float, uptime: float, registries: Iterable[Collector]) -> dict[str, Any]:
    """The status document.  *session*: the daemon's current feed session (or None); *now*: the
    daemon clock's monotonic time, against which the session's and applies' times are measured."""
    wall = time.time()

    def when(mono: float) -> str:
        return _iso(wall - (now - mono))

    dp = getattr(session, "dataplane", None)
    cfg = getattr(session, "config", None)
    doc: dict[str, Any] = {
        "version": __version__, "pid": os.getpid(), "uptime_seconds": round(uptime, 3),
        "feed": {"connected": session is not None, "name": getattr(session, "feed", None) and session.feed.name,
                 "since": when(session.started) if session is not None else None,
                 "messages": getattr(session, "messages_in", 0)},
        "in_sync": False, "dirty": None, "mode": None, "backend": None, "ipv6": None,
        "last_apply": None, "applies": 0, "counts": {}, "unsupported": {},
        "drift_repairs": drift_repairs(registries),
    }
    if cfg is not None:
        doc["mode"] = "bpf" if cfg.BPFEnabled else "nftables" if cfg.nftables_enabled else "iptables"
        doc["ipv6"] = cfg.Ipv6Support
    if dp is None:
        return doc
    backends = sorted({str(b) for t in dp.tables if (b := getattr(t, "backend", None))})
    doc["backend"] = ",".join(backends) if backends else ("nftables" if doc["mode"] == "nftables" else None)
    last: _Report | None = dp.last_apply
    doc["in_sync"] = bool(dp.in_sync_reported and (last is None or not (last.failed_steps or last.held_back)))
    doc["dirty"] = bool(dp.needs_sync)
    doc["applies"] = dp.apply_count
    if last is not None:
        doc["last_apply"] = {"at": when(last.started), "duration_seconds": round(last.duration, 6),
                             "ok": not (last.failed_steps or last.held_back),
                             "failed_steps": list(last.failed_steps), "held_back": list(last.held_back)}
    doc["counts"] = _counts([*dp.tables, *dp.ipsets, *dp.route_syncers(), *dp.devices])
    doc["unsupported"] = dict(dp.unsupported)
    return doc


def render_human(doc: Mapping[str, Any]) -> str:
    """The status document as a two-column table."""
    feed = doc["feed"]
    rows: list[tuple[str, str]] = [
        ("felixpy", f"{doc['version']} (pid {doc['pid']}, up {doc['uptime_seconds']:.0f} s)"),
        ("feed", f"connected since {feed['since']} ({feed['name']}, {feed['messages']} messages)"
         if feed["connected"] else "not connected"),
        ("in sync", "yes" if doc["in_sync"] else "no"),
        ("mode", f"{doc['mode'] or '-'} (backend {doc['backend'] or '-'}"
                 f"{', IPv4+IPv6' if doc['ipv6'] else ', IPv4' if doc['ipv6'] is False else ''})"),
    ]
    last = doc["last_apply"]
    if last is None:
        rows.append(("last apply", "none yet"))
    else:
        outcome = "ok" if last["ok"] else "failed: " + ", ".join(last["failed_steps"] + last["held_back"])
        rows.append(("last apply", f"{last['at']}, {last['duration_seconds'] * 1000:.1f} ms, {outcome} "
                                   f"(apply #{doc['applies']})"))
    for key, label in (("chains", "chains"), ("rules", "rules"), ("ip_sets", "IP sets"),
                       ("ip_set_members", "IP-set members"), ("routes", "routes"),
                       ("bpf_ip_sets", "BPF IP sets"), ("bpf_ip_set_members", "BPF IP-set members"),
                       ("bpf_programs", "BPF programs"), ("bpf_attach_points", "BPF attach points")):
        if key in doc["counts"]:
            rows.append((label, str(doc["counts"][key])))
    rows.append(("unsupported", "; ".join(f"{k}: {v}" for k, v in doc["unsupported"].items()) or "none"))
    rows.append(("drift repairs", str(doc["drift_repairs"])))
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k.ljust(width)}  {v}\n" for k, v in rows)


# ------------------------------------------------------------------------------------- server
def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        with contextlib.suppress(OSError):
            self.rfile.readline(256)  # the request line ("status"); nothing else is asked
        if _peer_uid(self.connection) != 0:
            self.wfile.write(b'{"error": "felixpy status is for root only"}\n')
            return
        req = StatusRequest()
        self.server.post(req)
        try:
            doc = req.reply.result(timeout=self.server.answer_timeout)
        except FutureTimeout:
            doc = {"error": f"the daemon did not answer within {self.server.answer_timeout:g} s (busy applying?)"}
        except Exception as exc:
            doc = {"error": f"status snapshot failed: {exc}"}
        self.wfile.write(json.dumps(doc).encode() + b"\n")


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, post: Callable[[StatusRequest], None], answer_timeout: float) -> None:
        self.post = post
        self.answer_timeout = answer_timeout
        old = os.umask(0o177)  # the socket file is born 0600
        try:
            super().__init__(path, _Handler)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)


class StatusServer:
    """The daemon side: serve status on *path* until :meth:`stop`."""

    def __init__(self, path: str, post: Callable[[StatusRequest], None],
                 answer_timeout: float = ANSWER_TIMEOUT) -> None:
        self.path = path
        self._post = post
        self._timeout = answer_timeout
        self._server: _Server | None = None

    def start(self) -> bool:
        """Bind and serve; False (logged) if another live daemon already serves this path."""
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        if os.path.exists(self.path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
                _log().error("Another process serves felixpy status on this socket; not serving status",
                          path=self.path)
                return False
            except OSError:
                os.unlink(self.path)  # stale: a previous daemon died without cleaning up
            finally:
                probe.close()
        self._server = _Server(self.path, self._post, self._timeout)
        threading.Thread(target=self._server.serve_forever, name="status", daemon=True).start()
        _log().info("Status endpoint serving", path=self.path)
        return True

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


# ------------------------------------------------------------------------------------- client
def query(path: str, timeout: float = ANSWER_TIMEOUT + 2) -> dict[str, Any]:
    """Ask the daemon at *path*; raises :class:`StatusError` with a sentence a person can act on."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(path)
        except FileNotFoundError:
            raise StatusError(f"no status socket at {path}: is `felixpy run` running "
                              "(and started with this --status-socket)?") from None
        except PermissionError:
            raise StatusError(f"permission denied on {path}: felixpy status is for root only") from None
        except ConnectionRefusedError:
            raise StatusError(f"nothing listens on {path}: the daemon that made it has stopped") from None
        s.sendall(b"status\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        raise StatusError(f"no answer from {path} within {timeout:g} s") from None
    finally:
        s.close()
    try:
        doc = json.loads(data)
    except ValueError:
        raise StatusError(f"{path} answered something that is not felixpy status: {data[:80]!r}") from None
    if not isinstance(doc, dict):
        raise StatusError(f"{path} answered something that is not felixpy status: {data[:80]!r}")
    if "error" in doc:
        raise StatusError(f"{path}: {doc['error']}")
    return doc
