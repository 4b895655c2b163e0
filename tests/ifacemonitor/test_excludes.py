from __future__ import annotations

import pytest

from felixpy.errors import ConfigError
from felixpy.ifacemonitor.excludes import exclusion_matcher


def test_literal_names_match_exactly() -> None:
    excluded = exclusion_matcher(["kube-ipvs0"])
    assert excluded("kube-ipvs0")
    assert not excluded("kube-ipvs01")
    assert not excluded("xkube-ipvs0")


def test_literals_are_not_regexes() -> None:
    excluded = exclusion_matcher(["eth.0"])
    assert excluded("eth.0")
    assert not excluded("eth10")


def test_slash_entries_are_unanchored_regexes() -> None:
    excluded = exclusion_matcher(["/^veth/", "/docker/"])
    assert excluded("veth123")
    assert excluded("br-docker0")
    assert not excluded("eth0")


def test_empty_list_excludes_nothing() -> None:
    assert not exclusion_matcher([])("kube-ipvs0")


def test_bad_regex_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        exclusion_matcher(["/(/"])
