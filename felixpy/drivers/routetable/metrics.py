"""Felix's ``felix_route_table_*`` metrics (``felix/routetable/route_table.go``).

=========================================  =======  ===========================================
name                                       kind     meaning
=========================================  =======  ===========================================
felix_route_table_resync_seconds           summary  time to list all routes in a full resync
felix_route_table_partial_resync_seconds   summary  time to resync one interface's routes
felix_route_table_conntrack_wait_seconds   summary  time waiting for conntrack cleanups
felix_route_table_num_routes               gauge    routes felixpy manages, by ``table``
felix_route_table_num_ifaces               gauge    interfaces tracked, by ``table``
=========================================  =======  ===========================================

The ``table`` label is Felix's ``IPv<version>:<table index>`` (``IPv4:254`` for main).
"""

from __future__ import annotations

from prometheus_client import Gauge

from felixpy.metrics import QuantileSummary, get_or_create

resync_seconds = get_or_create(QuantileSummary, "felix_route_table_resync_seconds",
                               "Time taken to list all the routes during a resync.")
partial_resync_seconds = get_or_create(QuantileSummary, "felix_route_table_partial_resync_seconds",
                                       "Time taken to resync the routes of a single interface.")
conntrack_wait_seconds = get_or_create(QuantileSummary, "felix_route_table_conntrack_wait_seconds",
                                       "Time waiting for conntrack cleanups to finish.")
num_routes = get_or_create(Gauge, "felix_route_table_num_routes",
                           "Number of routes that Felix is managing in the particular routing table.", ("table",))
num_ifaces = get_or_create(Gauge, "felix_route_table_num_ifaces",
                           "Number of interfaces that Felix is monitoring for the particular routing table.",
                           ("table",))


def table_label(ip_version: int, table_index: int) -> str:
    return f"IPv{ip_version}:{table_index}"
