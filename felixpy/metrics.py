"""The daemon's Prometheus metrics, with Felix's names.

Metrics live in a registry owned by :class:`DataplaneMetrics` (not the global
default), so several dataplanes in one test process don't collide; drivers that
register their own ``felix_*`` metrics use the default registry, which
:func:`serve` exposes together with ours.
"""

from __future__ import annotations

from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

import prometheus_client as prom
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry


class DataplaneMetrics:
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


class _Union:
    """A collector that yields both our registry's and the default registry's metrics."""

    def __init__(self, *registries: CollectorRegistry) -> None:
        self._registries = registries

    def collect(self) -> Iterator[Metric]:
        for reg in self._registries:
            yield from reg.collect()


def serve(metrics: DataplaneMetrics, host: str, port: int) -> WSGIServer:
    """Start the scrape endpoint; returns the server (``.shutdown()`` stops it)."""
    combined = CollectorRegistry(auto_describe=False)
    combined.register(_Union(metrics.registry, prom.REGISTRY))
    server, _thread = prom.start_http_server(port, addr=host or "0.0.0.0", registry=combined)
    return server
