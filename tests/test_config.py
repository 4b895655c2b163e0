from __future__ import annotations

from pathlib import Path

import pytest

from felixpy import config
from felixpy.config import Config, ProtoPort
from felixpy.errors import ConfigError


def test_defaults_match_felix() -> None:
    c = Config()
    assert c.IptablesMarkMask == 0xFFFF0000
    assert c.MaxIpsetSize == 1048576
    assert c.InterfacePrefix == ("cali",)
    assert c.ChainInsertMode == "insert"
    assert c.DefaultEndpointToHostAction == "DROP"
    assert c.HealthPort == 9099 and c.PrometheusMetricsPort == 9091
    assert c.ReportingIntervalSecs == 30 and c.DataplaneWatchdogTimeout == 90
    assert c.VXLANPort == 4789 and c.VXLANVNI == 4096
    assert ProtoPort("tcp", 22) in c.FailsafeInboundHostPorts
    assert ProtoPort("udp", 53) in c.FailsafeOutboundHostPorts


def test_layers_env_beats_file_beats_datastore(tmp_path: Path) -> None:
    f = tmp_path / "felix.cfg"
    f.write_text("[global]\nLogSeverityScreen = WARNING\nMaxIpsetSize = 5000\n")
    c, problems = config.load({"LogSeverityScreen": "DEBUG", "MaxIpsetSize": "100", "IptablesBackend": "nft"},
                              config_file=str(f), environ={"FELIX_MAXIPSETSIZE": "7", "PATH": "/bin"})
    assert problems == []
    assert c.LogSeverityScreen == "WARNING"  # file beats datastore
    assert c.MaxIpsetSize == 7  # env beats file
    assert c.IptablesBackend == "nft"


def test_config_file_is_ini_and_every_section_counts_as_felix_reads_it(tmp_path: Path) -> None:
    f = tmp_path / "felix.cfg"
    f.write_text("# Felix config\n[global]\nIpv6Support = false\n; a comment\nIptablesMarkMask=0xff000000\n"
                 "[logging]\nLogSeverityScreen = ERROR\nEndpointStatusPathPrefix = none\n")
    assert config.file_layer(str(f)) == {"Ipv6Support": "false", "IptablesMarkMask": "0xff000000",
                                         "LogSeverityScreen": "ERROR", "EndpointStatusPathPrefix": "none"}
    c, problems = config.load(config_file=str(f), environ={})
    assert problems == [] and c.Ipv6Support is False and c.IptablesMarkMask == 0xFF000000
    assert c.LogSeverityScreen == "ERROR"


def test_absent_config_file_is_not_an_error(tmp_path: Path) -> None:
    assert config.file_layer(str(tmp_path / "missing.cfg")) == {}


@pytest.mark.parametrize("text, where", [
    ("Ipv6Support = false\n", "a key outside any section"),
    ("Ipv6Support: false\n", "a key outside any section"),  # YAML is not guessed at
    ("[global]\nIpv6Support false\n", "not a valid INI config file"),
])
def test_malformed_config_file_is_a_config_error_naming_the_file(tmp_path: Path, text: str, where: str) -> None:
    f = tmp_path / "felix.cfg"
    f.write_text(text)
    with pytest.raises(ConfigError) as exc:
        config.file_layer(str(f))
    assert str(f) in str(exc.value) and where in str(exc.value)


def test_bad_values_are_reported_by_name_and_fall_back_to_defaults() -> None:
    c, problems = config.load({"ChainInsertMode": "sideways", "HealthPort": "99999", "Ipv6Support": "maybe",
                               "FailsafeInboundHostPorts": "sctp:22", "MaxIpsetSize": "12"}, environ={})
    assert {p.param for p in problems} == {"ChainInsertMode", "HealthPort", "Ipv6Support",
                                           "FailsafeInboundHostPorts"}
    assert c.ChainInsertMode == "insert" and c.HealthPort == 9099 and c.Ipv6Support is True
    assert c.FailsafeInboundHostPorts == Config().FailsafeInboundHostPorts
    assert c.MaxIpsetSize == 12


def test_failsafe_syntax_with_nets() -> None:
    c, problems = config.load({"FailsafeInboundHostPorts": "22, udp:10.0.0.0/8:53, tcp:[fd00::/64]:443"},
                              environ={})
    assert problems == []
    assert c.FailsafeInboundHostPorts == (ProtoPort("tcp", 22), ProtoPort("udp", 53, "10.0.0.0/8"),
                                          ProtoPort("tcp", 443, "fd00::/64"))


def test_unknown_params_are_ignored_and_names_case_insensitive() -> None:
    c, problems = config.load({"SomethingElse": "x", "ipv6support": "false"}, environ={})
    assert problems == [] and c.Ipv6Support is False


def test_restart_detection_ignores_informational_params() -> None:
    a = Config()
    assert config.restart_needed(a, a.replace(CalicoVersion="v3.30", ClusterGUID="x")) == []
    assert config.restart_needed(a, a.replace(MaxIpsetSize=10, ChainInsertMode="append")) == [
        "ChainInsertMode", "MaxIpsetSize"]


def test_none_means_the_zero_value_and_empty_is_ignored_as_felix_does() -> None:
    c, problems = config.load({"EndpointStatusPathPrefix": "none", "XDPEnabled": "none", "VXLANMTU": "none",
                               "FailsafeInboundHostPorts": "none", "VXLANEnabled": "none", "HealthPort": ""},
                              environ={"FELIX_LOGPREFIX": ""})
    assert problems == []
    assert c.EndpointStatusPathPrefix == "" and c.XDPEnabled is False and c.VXLANMTU == 0
    assert c.FailsafeInboundHostPorts == () and c.VXLANEnabled is None
    assert c.HealthPort == 9099 and c.LogPrefix == "calico-packet"  # empty: not set at all
    c, problems = config.load({"ChainInsertMode": "none"}, environ={})
    assert [p.param for p in problems] == ["ChainInsertMode"] and c.ChainInsertMode == "insert"


def test_bpf_host_conntrack_bypass_defaults_and_force_track_interface_filters() -> None:
    c = Config()
    assert c.BPFHostConntrackBypass is False  # config_params.go's default (the API doc says true)
    assert c.BPFForceTrackPacketsFromIfaces == ("docker+",)
    c, problems = config.load({"BPFHostConntrackBypass": "true",
                               "BPFForceTrackPacketsFromIfaces": "docker0, br-+"}, environ={})
    assert not problems
    assert c.BPFHostConntrackBypass and c.BPFForceTrackPacketsFromIfaces == ("docker0", "br-+")
    c, problems = config.load({"BPFForceTrackPacketsFromIfaces": "docker0,not an iface,+x"}, environ={})
    assert [p.param for p in problems] == ["BPFForceTrackPacketsFromIfaces"]
    assert "not an iface" in str(problems[0]) and "+x" in str(problems[0])
    assert c.BPFForceTrackPacketsFromIfaces == ("docker+",)  # a bad list falls back whole, as Felix's


def test_bpf_per_attach_point_maps_follow_the_interface_map_size() -> None:
    """The globals and counters maps hold an entry per interface and hook: a node sized for 5,000
    interfaces gets room for them, and the defaults stay Felix's sizes."""
    from dataclasses import replace

    from felixpy.bpf import maps
    from felixpy.dataplane.wiring import bpf_map_sizes

    default = bpf_map_sizes(Config())
    assert default["cali_ap_glob"] == maps.AP_GLOBALS.max_entries == 4000
    assert default["cali_counters6"] == maps.COUNTERS.max_entries and default["cali_iface4"] == 1000
    big = bpf_map_sizes(replace(Config(), BPFMapSizeIfState=10_064))
    assert big["cali_ap_glob"] >= 2 * 10_064 and big["cali_counters6"] >= 2 * 10_064
    assert set(big) <= {s.name for s in maps.ALL_SPECS}  # every name a map the bundle opens
