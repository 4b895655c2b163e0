"""Felix's ipset metric names, exposed exactly, and safe against re-import."""

from __future__ import annotations

import importlib

from prometheus_client import REGISTRY

from felixpy.drivers.ipsets import IPSets, metrics
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.metrics import exposition


def _value(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_names_and_counting() -> None:
    calls_before = _value("felix_ipset_calls_total")
    lines_before = _value("felix_ipset_lines_executed_total")
    d = IPSets(4, FakeIPSet(), sleep=lambda _s: None)
    d.add_or_replace_ip_set(IPSetMetadata("s:m", IPSetType.HASH_IP), ["10.0.0.1", "10.0.0.2"])
    d.apply_updates()
    d.apply_deletions()
    assert _value("felix_ipset_calls_total") == calls_before + 1
    assert _value("felix_ipset_lines_executed_total") == lines_before + 4  # create, 2 adds, COMMIT
    assert d.status_counts() == {"sets": 1, "members": 2}
    text = exposition([REGISTRY]).decode()
    for name in ("# TYPE felix_ipset_calls counter\n", "\nfelix_ipset_calls ", "\nfelix_ipset_errors ",
                 f"\nfelix_ipset_lines_executed {lines_before + 4}", 'felix_ipsets_calico{ip_version="4"} 1.0',
                 "\nfelix_ipsets_total ", "\nfelix_exec_time_micros_count "):
        assert name in text, name
    ipset_lines = "\n".join(ln for ln in text.splitlines() if "ipset" in ln)  # other drivers' names are theirs
    assert "_total " not in ipset_lines.replace("felix_ipsets_total ", "") and "_created" not in text


def test_reimport_does_not_double_register() -> None:
    before = metrics.ipset_calls
    reloaded = importlib.reload(metrics)
    assert reloaded.ipset_calls is before
