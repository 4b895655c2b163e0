"""Felix's ipset metric names, exposed exactly, and safe against re-import."""

from __future__ import annotations

import importlib

from prometheus_client import REGISTRY, generate_latest

from felixpy.drivers.ipsets import IPSets, metrics
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType


def test_names_and_counting() -> None:
    calls_before = metrics.ipset_calls.get()
    lines_before = metrics.ipset_lines_executed.get()
    d = IPSets(4, FakeIPSet(), sleep=lambda _s: None)
    d.add_or_replace_ip_set(IPSetMetadata("s:m", IPSetType.HASH_IP), ["10.0.0.1", "10.0.0.2"])
    d.apply_updates()
    d.apply_deletions()
    assert metrics.ipset_calls.get() == calls_before + 1
    assert metrics.ipset_lines_executed.get() == lines_before + 4  # create, 2 adds, COMMIT
    text = generate_latest(REGISTRY).decode()
    for name in ("felix_ipset_calls ", "felix_ipset_errors ", "felix_ipset_lines_executed ",
                 'felix_ipsets_calico{ip_version="4"} 1.0', "felix_ipsets_total ", "felix_exec_time_micros_count "):
        assert name in text, name


def test_reimport_does_not_double_register() -> None:
    before = metrics.ipset_calls
    reloaded = importlib.reload(metrics)
    assert reloaded.ipset_calls is before
    assert REGISTRY.get_sample_value("felix_ipset_calls") == before.get()
