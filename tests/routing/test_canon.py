"""The address and MAC canonicalisers' fast paths (``drivers/netlink/types.py``) answer exactly as the
full parse does: for canonical input they return it unchanged, and anything else still goes through
``ipaddress`` / the MAC parser, which canonicalise or refuse it as before."""

from __future__ import annotations

import ipaddress

import pytest

from felixpy.drivers.netlink.types import canon_ip, canon_mac

ADDRESSES = [
    "10.0.0.1", "0.0.0.0", "255.255.255.255", "192.168.0.1/24", "1.2.3.4/32",
    "010.0.0.1", "10.0.0.01", "256.0.0.1", "10.0.0", "10.0.0.1.5", "10..0.1", "", "1.2.3.-4", "+1.2.3.4",
    "1.2.3.4 ", " 1.2.3.4", "1.2.3.4\n", "01.2.3.4", "1.2.3.255", "1.2.3.249", "1.2.3.250", "1.2.3.\u0661", "1.2.3.\u00b2", "1.2.3.0x1", "1111.2.3.4",
    "fd00::1", "FD00:0::1", "::ffff:10.0.0.1", "fd00::1/64", "::", "1:2:3:4:5:6:7:8:9",
]


def _reference(addr: str) -> str:
    return str(ipaddress.ip_address(addr.split("/", 1)[0]))


@pytest.mark.parametrize("addr", ADDRESSES)
def test_canon_ip_answers_as_ipaddress_does(addr: str) -> None:
    try:
        want = _reference(addr)
    except ValueError:
        with pytest.raises(ValueError):
            canon_ip(addr)
        return
    assert canon_ip(addr) == want


@pytest.mark.parametrize("mac,want", [
    ("66:00:00:00:00:01", "66:00:00:00:00:01"), ("66:0A:00:00:00:01", "66:0a:00:00:00:01"),
    ("66-0a-00-00-00-01", "66:0a:00:00:00:01"), ("6:a:0:0:0:1", "06:0a:00:00:00:01"),
])
def test_canon_mac(mac: str, want: str) -> None:
    assert canon_mac(mac) == want


@pytest.mark.parametrize("mac", ["66:00:00:00:00", "66:00:00:00:00:01:02", "zz:00:00:00:00:01", ""])
def test_canon_mac_refuses(mac: str) -> None:
    with pytest.raises(ValueError):
        canon_mac(mac)
