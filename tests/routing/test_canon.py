"""The address and MAC canonicalisers' fast paths (``drivers/netlink/types.py``) answer exactly as the
full parse does: for canonical input they return it unchanged, and anything else still goes through
``ipaddress`` / the MAC parser, which canonicalise or refuse it as before."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable

import pytest

from felixpy.drivers.netlink.types import canon_cidr, canon_ip, canon_mac

ADDRESSES = [
    "10.0.0.1", "0.0.0.0", "255.255.255.255", "192.168.0.1/24", "1.2.3.4/32",
    "010.0.0.1", "10.0.0.01", "256.0.0.1", "10.0.0", "10.0.0.1.5", "10..0.1", "", "1.2.3.-4", "+1.2.3.4",
    "1.2.3.4 ", " 1.2.3.4", "1.2.3.4\n", "01.2.3.4", "1.2.3.255", "1.2.3.249", "1.2.3.250", "1.2.3.\u0661", "1.2.3.\u00b2", "1.2.3.0x1", "1111.2.3.4",
    "fd00::1", "FD00:0::1", "::ffff:10.0.0.1", "fd00::1/64", "::", "1:2:3:4:5:6:7:8:9",
]


def _answers_as(fast: Callable[[str], str], reference: Callable[[str], str], text: str) -> None:
    """*fast* returns what *reference* returns for *text*, or raises ValueError where it does."""
    try:
        want = reference(text)
    except ValueError:
        with pytest.raises(ValueError):
            fast(text)
        return
    assert fast(text) == want, text


def _reference(addr: str) -> str:
    return str(ipaddress.ip_address(addr.split("/", 1)[0]))


@pytest.mark.parametrize("addr", ADDRESSES)
def test_canon_ip_answers_as_ipaddress_does(addr: str) -> None:
    _answers_as(canon_ip, _reference, addr)


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


CIDRS = [
    "10.0.0.1", "10.0.0.1/32", "10.0.0.1/24", "10.65.3.0/26", "0.0.0.0/0", "255.255.255.255/0", "1.2.3.4/1",
    "128.0.0.1/1", "10.0.0.0/024", "10.0.0.0/33", "10.0.0.0/ 24", "10.0.0.0/+24", "10.0.0.0/-1", "010.0.0.1/32",
    "10.0.0.1/", "1.2.3/24", "10.0.0.0/255.255.255.0", "10.0.0.0/0.0.0.255", "10.0.0.0/24 ", " 10.0.0.0/24",
    "10.0.0.0/24\n", "10.0.0.0/\u0662\u0664", "10.0.0.0/\u00b2", "10.0.0.0/2\u0664", "10.0.0.0/0x18", "10.0.0.0//24",
    "10.0.0.0/24/24", "fd00::1", "fd00::1/64", "FD00::1/128", "::ffff:10.0.0.1/128", "fd00::/129", "",
]


def _reference_cidr(cidr: str) -> str:
    return str(ipaddress.ip_network(cidr, strict=False))


def _same_as_ipaddress(cidr: str) -> None:
    _answers_as(canon_cidr, _reference_cidr, cidr)


@pytest.mark.parametrize("cidr", CIDRS)
def test_canon_cidr_answers_as_ipaddress_does(cidr: str) -> None:
    _same_as_ipaddress(cidr)


def test_canon_cidr_masks_every_prefix_length_as_ipaddress_does() -> None:
    rnd = random.Random(17)
    for n in range(0, 34):
        for _ in range(40):
            addr = ".".join(str(rnd.randrange(256)) for _ in range(4))
            _same_as_ipaddress(f"{addr}/{n}")
    for _ in range(500):  # and strings near the fast path's edges
        parts = [rnd.choice(["0", "00", "01", "9", "10", "99", "199", "249", "250", "255", "256", "1000", ""])
                 for _ in range(rnd.choice([3, 4, 4, 4, 5]))]
        plen = rnd.choice(["", "/", "/0", "/00", "/8", "/08", "/32", "/33", "/320", "/3"])
        _same_as_ipaddress(".".join(parts) + plen)
