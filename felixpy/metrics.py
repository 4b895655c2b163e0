"""The daemon's Prometheus metrics, exposed under Felix's exact series names.

Metrics are ordinary prometheus-client collectors.  The daemon's own live in a
registry owned by :class:`DataplaneMetrics` (so several dataplanes in one test
process don't collide); drivers register theirs once per process in the
default ``REGISTRY`` through :func:`get_or_create`.  :func:`serve` exposes both.

Exposition.  Felix is written in Go, whose client exposes a counter named
``felix_ipset_calls`` as ``felix_ipset_calls`` (``# TYPE … counter``) and has
no ``_created`` series.  prometheus-client's text encoder always renames a
counter to ``…_total`` and adds ``…_created``, which would break every
existing Calico dashboard and alert.  :func:`exposition` is therefore our
encoder for the Prometheus text format 0.0.4: one family per collected
metric under its own name, counter samples under the family name, and no
``_created`` samples.  Gauges and summaries come out exactly as
prometheus-client would write them (minus ``_created``).  Every metric the
scrape endpoint serves goes through it; metrics that Felix does not have are
named ``felixpy_*``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client as prom
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_OM_ONLY_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"counter": "counter", "gauge": "gauge", "summary": "summary", "histogram": "histogram",
          "unknown": "untyped", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}

_M = TypeVar("_M", prom.Counter, prom.Gauge, prom.Summary, prom.Histogram)
_lock = threading.Lock()


def get_or_create(cls: type[_M], name: str, documentation: str, labels: Sequence[str] = (),
                  registry: CollectorRegistry = REGISTRY) -> _M:
    """The collector registered under *name* in *registry*, else a new one (registered there).

    Idempotent across re-imports and reloads of a driver's metrics module (prometheus-client offers
    no public lookup, and a second registration fails with "Duplicated timeseries").
    """
    with _lock:
        by_name: dict[str, Any] = getattr(registry, "_names_to_collectors", {})
        found = by_name.get(name)
        if found is None and cls is prom.Counter:
            found = by_name.get(name + "_total")
        if found is not None:
            if type(found).__name__ != cls.__name__:  # by name: importlib.reload makes new classes
                raise TypeError(f"metric {name} already registered as {type(found).__name__}")
            return found  # type: ignore[no-any-return]
        return cls(name, documentation, list(labels), registry=registry)


class DataplaneMetrics:
    """Felix's ``felix_int_dataplane_*`` metrics (``felix/dataplane/linux/int_dataplane.go``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.apply_time = prom.Summary("felix_int_dataplane_apply_time_seconds",
                                       "Time in seconds that it took to apply a dataplane update.", registry=r)
        self.failures = prom.Counter("felix_int_dataplane_failures",
                                     "Number of times dataplane updates failed and will be retried.", registry=r)
        self.messages = prom.Counter("felix_int_dataplane_messages",
                                     "Number dataplane messages by type.", ["type"], registry=r)
        self.msg_batch_size = prom.Summary("felix_int_dataplane_msg_batch_size",
                                           "Number of messages processed in each batch.", registry=r)
        self.iface_msg_batch_size = prom.Summary("felix_int_dataplane_iface_msg_batch_size",
                                                 "Number of interface state messages processed in each batch.",
                                                 registry=r)
        self.initial_resync_time = prom.Gauge("felix_int_dataplane_initial_resync_time_seconds",
                                              "Time in seconds that it took to do the initial resync.",
                                              registry=r)


# ----------------------------------------------------------------------------------- exposition
def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _sample_line(name: str, labels: dict[str, str], value: float) -> str:
    if labels:
        inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}} {floatToGoString(value)}\n"
    return f"{name} {floatToGoString(value)}\n"


def _family(metric: Metric) -> Iterator[str]:
    yield f"# HELP {metric.name} {_escape_help(metric.documentation)}\n"
    yield f"# TYPE {metric.name} {_TYPES.get(metric.type, 'untyped')}\n"
    for s in metric.samples:
        if any(s.name == metric.name + suffix for suffix in _OM_ONLY_SUFFIXES):
            continue
        name = metric.name if metric.type == "counter" and s.name == metric.name + "_total" else s.name
        yield _sample_line(name, s.labels, s.value)


def collect_all(collectors: Iterable[Collector]) -> Iterator[Metric]:
    for c in collectors:
        yield from c.collect()


def exposition(collectors: Iterable[Collector]) -> bytes:
    """Prometheus text format 0.0.4 with Felix's (Go client's) series names; see the module doc."""
    return "".join(line for m in collect_all(collectors) for line in _family(m)).encode("utf-8")


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Scrapes are not worth a log line each."""


def wsgi_app(collectors: Sequence[Collector]) -> Callable[..., list[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        body = exposition(collectors)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve(metrics: DataplaneMetrics, host: str, port: int) -> WSGIServer:
    """Start the scrape endpoint (``/metrics``) on a thread; ``.shutdown()`` stops it."""
    server = make_server(host or "0.0.0.0", port, wsgi_app([metrics.registry, REGISTRY]),
                         ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
