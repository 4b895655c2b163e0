"""Felix's IP set names and ownership prefixes."""

from __future__ import annotations

import pytest

from felixpy.drivers.ipsets.naming import IPVersionConfig


def test_main_and_temp_names() -> None:
    v4, v6 = IPVersionConfig(4), IPVersionConfig(6)
    assert v4.name_for_main("this-host") == "cali40this-host"
    assert v6.name_for_main("s:abc") == "cali60s:abc"
    long_id = "s:qMt7iLlGDhvLnCjM0l9nzxbabcdefghijklmn"
    assert v4.name_for_main(long_id) == "cali40s:qMt7iLlGDhvLnCjM0l9nzxb"
    assert len(v4.name_for_main(long_id)) == 31
    assert v4.name_for_temp(0) == "cali4t0" and v6.name_for_temp(12) == "cali6t12"
    assert v4.family == "inet" and v6.family == "inet6"


@pytest.mark.parametrize(("name", "v4", "v6"), [
    ("cali40s:abc", True, False),
    ("cali4t3", True, False),
    ("cali4-s:old-format", True, False),
    ("felix-4abc", True, False),
    ("felix-masq-ipam-pools", True, False),
    ("felix-all-ipam-pools", True, False),
    ("cali60s:abc", False, True),
    ("cali6t0", False, True),
    ("felix-6abc", False, True),
    ("KUBE-CLUSTER-IP", False, False),
    ("calico-x", False, False),
    ("xcali40", False, False),
])
def test_ownership(name: str, v4: bool, v6: bool) -> None:
    assert IPVersionConfig(4).owns(name) is v4
    assert IPVersionConfig(6).owns(name) is v6


def test_temp_and_main() -> None:
    c = IPVersionConfig(4)
    assert c.is_temp("cali4t1") and not c.is_temp("cali40t1")
    assert c.is_main("cali40t1") and not c.is_main("cali4t1")
    with pytest.raises(ValueError):
        IPVersionConfig(5)
