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

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client as prom
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString as _untyped_float_to_go_string



def floatToGoString(value: float) -> str:  # noqa: N802 - prometheus-client's name for it
    """Go's float formatting as prometheus-client writes sample values (``1.0``, ``NaN``, ``+Inf``)."""
    return str(_untyped_float_to_go_string(value))  # type: ignore[no-untyped-call]


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_OM_ONLY_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"counter": "counter", "gauge": "gauge", "summary": "summary", "histogram": "histogram",
          "unknown": "untyped", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}

QUANTILES = (0.5, 0.9, 0.99)  # libcalico-go's DefObjectives, which every Felix summary uses
SUMMARY_MAX_AGE = 600.0  # seconds: the Go client's default window for a summary's quantiles
SUMMARY_MAX_SAMPLES = 4096
_lock = threading.Lock()


class QuantileSummary:
    """A summary with Felix's quantiles: ``name{quantile="0.5|0.9|0.99"}``, ``name_sum``, ``name_count``.

    prometheus-client's Summary has no quantiles.  Felix's (Go) summaries report the 0.5, 0.9 and
    0.99 quantiles over the last ten minutes; this one keeps the most recent observations of that
    window (at most :data:`SUMMARY_MAX_SAMPLES`) and ranks them when scraped.  ``_sum`` and
    ``_count`` are cumulative, as in Go.  Same ``observe()``/``time()`` API as prometheus-client's.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry | None = REGISTRY, clock: Callable[[], float] = time.monotonic) -> None:
        if labelnames:
            raise ValueError("QuantileSummary has no labels (none of Felix's summaries do)")
        self.name = name
        self.documentation = documentation
        self._clock = clock
        self._lock = threading.Lock()
        self._window: deque[tuple[float, float]] = deque(maxlen=SUMMARY_MAX_SAMPLES)
        self._sum = 0.0
        self._count = 0
        if registry is not None:
            registry.register(self)

    def observe(self, value: float) -> None:
        with self._lock:
            self._window.append((self._clock(), value))
            self._sum += value
            self._count += 1

    @contextlib.contextmanager
    def time(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - start)

    def quantiles(self) -> dict[float, float]:
        with self._lock:
            horizon = self._clock() - SUMMARY_MAX_AGE
            while self._window and self._window[0][0] < horizon:
                self._window.popleft()
            values = sorted(v for _, v in self._window)
        if not values:
            return {q: float("nan") for q in QUANTILES}  # as Go reports an empty window
        # Nearest rank: the smallest observation with at least q of the window at or below it.
        return {q: values[max(0, math.ceil(q * len(values)) - 1)] for q in QUANTILES}

    def describe(self) -> list[Metric]:
        return [Metric(self.name, self.documentation, "summary")]

    def collect(self) -> Iterator[Metric]:
        m = Metric(self.name, self.documentation, "summary")
        for q, v in self.quantiles().items():
            m.add_sample(self.name, {"quantile": floatToGoString(q)}, v)
        with self._lock:
            m.add_sample(self.name + "_sum", {}, self._sum)
            m.add_sample(self.name + "_count", {}, float(self._count))
        yield m


_M = TypeVar("_M", prom.Counter, prom.Gauge, QuantileSummary)


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
        self.apply_time = QuantileSummary("felix_int_dataplane_apply_time_seconds",
                                       "Time in seconds that it took to apply a dataplane update.", registry=r)
        self.failures = prom.Counter("felix_int_dataplane_failures",
                                     "Number of times dataplane updates failed and will be retried.", registry=r)
        self.messages = prom.Counter("felix_int_dataplane_messages",
                                     "Number dataplane messages by type.", ["type"], registry=r)
        self.msg_batch_size = QuantileSummary("felix_int_dataplane_msg_batch_size",
                                           "Number of messages processed in each batch.", registry=r)
        self.iface_msg_batch_size = QuantileSummary("felix_int_dataplane_iface_msg_batch_size",
                                                 "Number of interface state messages processed in each batch.",
                                                 registry=r)
        self.addr_msg_batch_size = QuantileSummary("felix_int_dataplane_addr_msg_batch_size",
                                                   "Number of interface address messages processed in each batch.",
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
    family = metric.name + "_info" if metric.type == "info" else metric.name
    yield f"# HELP {family} {_escape_help(metric.documentation)}\n"
    yield f"# TYPE {family} {_TYPES.get(metric.type, 'untyped')}\n"
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
