"""Felix's metric names, types and labels, checked on a real scrape of the metrics server.

The expected list is Felix's (``felix/dataplane/linux/int_dataplane.go``, ``felix/iptables/table.go``,
``felix/ipsets/ipsets.go``, ``felix/nftables/table.go``, ``felix/routetable/route_table.go``; summaries
via libcalico-go's ``NewSummary``, i.e. quantiles 0.5/0.9/0.99).  felixpy has no BPF mode in the daemon,
so no ``felix_bpf_*`` series.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Mapping

import prometheus_client as prom
import pytest
from prometheus_client.registry import CollectorRegistry

from felixpy import metrics
from felixpy.feed.client import connect
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import netns as nsmod
from felixpy.testing.daemon import start_daemon

C, G, S = "counter", "gauge", "summary"
IPT = ("ip_version", "table")
INT_DATAPLANE: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "felix_int_dataplane_failures": (C, ()),
    "felix_int_dataplane_messages": (C, ("type",)),
    "felix_int_dataplane_apply_time_seconds": (S, ()),
    "felix_int_dataplane_msg_batch_size": (S, ()),
    "felix_int_dataplane_iface_msg_batch_size": (S, ()),
    "felix_int_dataplane_addr_msg_batch_size": (S, ()),
    "felix_int_dataplane_initial_resync_time_seconds": (G, ()),
}
ROUTE_TABLE = {
    "felix_route_table_resync_seconds": (S, ()),
    "felix_route_table_partial_resync_seconds": (S, ()),
    "felix_route_table_conntrack_wait_seconds": (S, ()),
    "felix_route_table_num_routes": (G, ("table",)),
    "felix_route_table_num_ifaces": (G, ("table",)),
}
IPTABLES = {
    "felix_iptables_restore_calls": (C, ()),
    "felix_iptables_restore_errors": (C, ()),
    "felix_iptables_save_calls": (C, ()),
    "felix_iptables_save_errors": (C, ()),
    "felix_iptables_chains": (G, IPT),
    "felix_iptables_rules": (G, IPT),
    "felix_iptables_lines_executed": (C, IPT),
}
IPSETS = {
    "felix_ipsets_calico": (G, ("ip_version",)),
    "felix_ipsets_total": (G, ()),
    "felix_ipset_calls": (C, ()),
    "felix_ipset_errors": (C, ()),
    "felix_ipset_lines_executed": (C, ()),
    "felix_exec_time_micros": (S, ()),
}
NFTABLES = {
    "felix_nft_calls": (C, ()),
    "felix_nft_errors": (C, ()),
    "felix_nft_list_calls": (C, ()),
    "felix_nft_list_errors": (C, ()),
    "felix_nft_chains": (G, IPT),
    "felix_nft_rules": (G, IPT),
    "felix_nft_lines_executed": (C, IPT),
    "felix_nft_sets": (G, ("ip_version",)),
    "felix_nft_set_calls": (C, ()),
    "felix_nft_set_errors": (C, ()),
    "felix_nft_maps": (G, ("ip_version",)),
}
ALL = {**INT_DATAPLANE, **ROUTE_TABLE, **IPTABLES, **IPSETS, **NFTABLES}
# Per mode: the series that must be there.  The other backend's metrics may be registered too (its module
# imported) with zero counters or childless gauges; if they are there, they must still be right.
REQUIRED = {
    "iptables-legacy": {**INT_DATAPLANE, **ROUTE_TABLE, **IPTABLES, **IPSETS},
    "nftables": {**INT_DATAPLANE, **ROUTE_TABLE, **NFTABLES},
}
MODE_ENV = {"iptables-legacy": {"FELIX_IPTABLESBACKEND": "legacy"}, "nftables": {"FELIX_NFTABLESMODE": "Enabled"}}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def parse(text: str) -> tuple[dict[str, str], dict[str, set[tuple[str, frozenset[str]]]]]:
    """Family name -> type, and family name -> {(sample name, label names)}."""
    types: dict[str, str] = {}
    samples: dict[str, set[tuple[str, frozenset[str]]]] = {}
    family = ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family, kind = line[7:].split(" ")
            types[family] = kind
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m, line
            samples.setdefault(family, set()).add((m.group(1), frozenset(_LABEL.findall(m.group(2) or ""))))
    return types, samples


def _want(name: str, kind: str, labels: tuple[str, ...]) -> set[tuple[str, frozenset[str]]]:
    if kind == S:
        return {(name, frozenset({"quantile", *labels})), (name + "_sum", frozenset(labels)),
                (name + "_count", frozenset(labels))}
    return {(name, frozenset(labels))}


def check(text: str, required: Mapping[str, tuple[str, tuple[str, ...]]]) -> None:
    types, samples = parse(text)
    for name, (kind, labels) in required.items():
        assert types.get(name) == kind, f"{name}: type {types.get(name)} (want {kind})"
        assert samples.get(name) == _want(name, kind, labels), f"{name}: {samples.get(name)}"
    for family, kind in types.items():
        got = samples.get(family, set())
        names = {s for s, _ in got}
        assert not family.endswith("_created") and not any(s.endswith("_created") for s in names)
        if kind == C:
            assert names <= {family}, family  # no ``_total`` renaming
        assert family.startswith(("felix_", "felixpy_", "python_", "process_")), family
        if family.startswith("felix_"):
            assert family in ALL, f"{family} is not one of Felix's names: prefix felixpy-only metrics felixpy_"
            want_kind, labels = ALL[family]
            assert kind == want_kind and got <= _want(family, kind, labels), (family, kind, got)


def test_exposition_keeps_counter_names_and_drops_created() -> None:
    reg = CollectorRegistry()
    prom.Counter("felix_x_calls", "Calls.", ["ip_version"], registry=reg).labels("4").inc(3)
    prom.Gauge("felix_x_things", 'Things "quoted".', registry=reg).set(2)
    s = metrics.QuantileSummary("felix_x_seconds", "Seconds.", registry=reg)
    for v in (1.0, 2.0, 3.0, 4.0):
        s.observe(v)
    text = metrics.exposition([reg]).decode()
    assert text.splitlines() == [
        "# HELP felix_x_calls Calls.", "# TYPE felix_x_calls counter", 'felix_x_calls{ip_version="4"} 3.0',
        '# HELP felix_x_things Things "quoted".', "# TYPE felix_x_things gauge", "felix_x_things 2.0",
        "# HELP felix_x_seconds Seconds.", "# TYPE felix_x_seconds summary",
        'felix_x_seconds{quantile="0.5"} 2.0', 'felix_x_seconds{quantile="0.9"} 4.0',
        'felix_x_seconds{quantile="0.99"} 4.0', "felix_x_seconds_sum 10.0", "felix_x_seconds_count 4.0"]


def test_summary_quantiles_cover_the_last_ten_minutes_and_sum_count_are_cumulative() -> None:
    now = [0.0]
    s = metrics.QuantileSummary("felix_y_seconds", "Y.", registry=None, clock=lambda: now[0])
    assert all(v != v for v in s.quantiles().values())  # NaN while empty, as Go reports
    for v in range(1, 101):
        s.observe(float(v))
    assert s.quantiles() == {0.5: 50.0, 0.9: 90.0, 0.99: 99.0}
    now[0] = metrics.SUMMARY_MAX_AGE + 1
    s.observe(7.0)
    assert s.quantiles() == {0.5: 7.0, 0.9: 7.0, 0.99: 7.0}
    (m,) = s.collect()
    assert {x.name: x.value for x in m.samples if not x.labels} == {"felix_y_seconds_sum": 5057.0,
                                                                     "felix_y_seconds_count": 101.0}


def test_get_or_create_returns_the_registered_collector_and_refuses_another_kind() -> None:
    reg = CollectorRegistry()
    c = metrics.get_or_create(prom.Counter, "felix_z_calls", "Z.", registry=reg)
    assert metrics.get_or_create(prom.Counter, "felix_z_calls", "Z.", registry=reg) is c
    with pytest.raises(TypeError):
        metrics.get_or_create(prom.Gauge, "felix_z_calls", "Z.", registry=reg)


def _scrape(ns: str, url: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    with nsmod.entered(ns):
        while True:
            try:
                with urllib.request.urlopen(url, timeout=3) as r:
                    assert r.headers["Content-Type"] == metrics.CONTENT_TYPE
                    return str(r.read().decode())
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@pytest.mark.kernel
@pytest.mark.parametrize("mode", sorted(REQUIRED))
def test_real_scrape_has_felix_names_types_and_labels(netns: str, mode: str) -> None:
    env = {"FELIX_PROMETHEUSMETRICSENABLED": "true", "FELIX_PROMETHEUSMETRICSHOST": "127.0.0.1",
           "FELIX_PROMETHEUSMETRICSPORT": "9091", **MODE_ENV[mode]}
    d = start_daemon(netns, env=env, iface_monitor=False)
    try:
        c = connect(d.target)
        c.send([to_dataplane(0, pb.ConfigUpdate(config={"Ipv6Support": "true"})),
                to_dataplane(1, pb.IPSetUpdate(id="s:m", members=["10.0.0.1"], type=pb.IPSetUpdate.IP)),
                to_dataplane(2, pb.InSync())])
        c.wait_in_sync(30)
        check(_scrape(netns, "http://127.0.0.1:9091/metrics"), REQUIRED[mode])
        c.close()
    finally:
        d.stop()
