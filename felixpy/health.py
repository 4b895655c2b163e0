"""Liveness and readiness, as Felix's health aggregator.

Reporters register with a timeout (0 = none) and report ``live``/``ready``.  A
reporter whose last report is older than its timeout is not live.  The HTTP
endpoints ``/liveness`` and ``/readiness`` answer 200 when every reporter is
live (resp. ready), else 503, with a JSON body naming each reporter's state.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class _Reporter:
    timeout: float
    live: bool = True
    ready: bool = False
    last: float = 0.0


class HealthAggregator:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._reporters: dict[str, _Reporter] = {}

    def register(self, name: str, timeout: float) -> None:
        with self._lock:
            self._reporters[name] = _Reporter(timeout=timeout, last=self._clock())

    def report(self, name: str, *, live: bool = True, ready: bool = False) -> None:
        with self._lock:
            r = self._reporters[name]
            r.live, r.ready, r.last = live, ready, self._clock()

    def summary(self) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            out = {}
            for name, r in self._reporters.items():
                stale = r.timeout > 0 and now - r.last > r.timeout
                out[name] = {"live": r.live and not stale, "ready": r.ready and not stale}
        return out

    def live(self) -> bool:
        return all(s["live"] for s in self.summary().values())

    def ready(self) -> bool:
        return all(s["ready"] for s in self.summary().values())


def serve(agg: HealthAggregator, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") == "/liveness":
                ok = agg.live()
            elif self.path.rstrip("/") == "/readiness":
                ok = agg.ready()
            else:
                self.send_error(404)
                return
            body = json.dumps(agg.summary()).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
