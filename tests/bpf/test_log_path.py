from felixpy.bpf.attachpoint import LogPath, log_path


def test_log_level_rules() -> None:
    assert log_path("off", {}, "eth0", is_wep=False) == LogPath(False, None)
    assert log_path("info", {"all": "tcp"}, "eth0", is_wep=False) == LogPath(False, None)
    assert log_path("debug", {}, "cali1", is_wep=True) == LogPath(True, "")  # match-all filter
    f = {"eth0": "port 22", "weps": "icmp"}
    assert log_path("Debug", f, "eth0", is_wep=False) == LogPath(True, "port 22")
    assert log_path("debug", f, "cali1", is_wep=True) == LogPath(True, "icmp")
    assert log_path("debug", f, "eth1", is_wep=False) == LogPath(False, None)  # no filter applies
    assert log_path("debug", {"all": ""}, "eth1", is_wep=False) == LogPath(True, "")
