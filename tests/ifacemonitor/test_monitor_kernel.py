"""The monitor against the real kernel, inside throwaway namespaces only.

Every test watches a namespace made by the ``netns`` fixture (never the root
namespace) and changes it with ``ip -n``.  Links are left admin-down where the
test does not need them up, so that IPv6 link-local addresses do not add noise.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from felixpy.config import Config
from felixpy.ifacemonitor.monitor import InterfaceMonitor
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate
from felixpy.testing import netns as netnsmod

from .helpers import Recorder

pytestmark = pytest.mark.kernel

UP, DOWN = IfaceState.UP, IfaceState.DOWN
StartFn = Callable[..., tuple[InterfaceMonitor, Recorder]]


def ip(ns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True)


def ip_batch(ns: str, lines: list[str]) -> None:
    """Several changes from one process, microseconds apart."""
    subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", text=True,
                   check=True, capture_output=True)


def ifindex(ns: str, name: str) -> int:
    out = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "dev", name], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split(":", 1)[0])


def state(name: str, st: IfaceState, index: int) -> IfaceStateUpdate:
    """The update the monitor reports, with the link kind it decoded: every test interface is a
    veth but loopback (no kind); a vanished one (index 0) has none known."""
    return IfaceStateUpdate(name, st, index, None if not index else "" if name == "lo" else "veth")


def addrs(name: str, *a: str) -> IfaceAddrsUpdate:
    return IfaceAddrsUpdate(name, frozenset(a))


def last_addrs(rec: Recorder, name: str) -> frozenset[str] | None:
    seen = [u for u in rec.for_iface(name) if isinstance(u, IfaceAddrsUpdate)]
    assert seen, f"no address update for {name}"
    return seen[-1].addrs


@pytest.fixture
def start(netns: str) -> Iterator[StartFn]:
    monitors: list[InterfaceMonitor] = []

    def _start(exclude: tuple[str, ...] = ("kube-ipvs0",), refresh: float = 90.0) -> tuple[InterfaceMonitor, Recorder]:
        rec = Recorder()
        cfg = dataclasses.replace(Config(), InterfaceExclude=exclude, InterfaceRefreshInterval=refresh)
        mon = InterfaceMonitor(cfg, **rec.callbacks(), netns=netns)
        monitors.append(mon)
        mon.start()
        assert rec.wait(lambda: rec.in_sync == 1 or bool(rec.fatal)), "monitor never got in sync"
        assert rec.fatal == []
        return mon, rec

    yield _start
    for mon in monitors:
        mon.stop()


def test_initial_dump_reports_lo_and_existing_veths_then_in_sync(netns: str, start: StartFn) -> None:
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    ip(netns, "addr", "add", "10.1.0.1/24", "dev", "va")
    ip(netns, "addr", "add", "fd00:1::1/64", "dev", "va", "nodad")
    va, vb = ifindex(netns, "va"), ifindex(netns, "vb")
    mon, rec = start()
    before_sync = rec.updates[: rec.updates_at_sync]
    assert set(before_sync) == {
        state("lo", UP, 1), addrs("lo", "127.0.0.1", "::1"),
        state("va", DOWN, va), addrs("va", "10.1.0.1", "fd00:1::1"),
        state("vb", DOWN, vb), addrs("vb"),
    }
    assert len(before_sync) == 6
    assert rec.quiet_for(0.3) == before_sync  # nothing more, no duplicates
    assert rec.in_sync == 1 and mon.resyncs == 1


def test_veth_up_and_down(netns: str, start: StartFn) -> None:
    _, rec = start()
    rec.take()
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    va, vb = ifindex(netns, "va"), ifindex(netns, "vb")
    rec.wait_for_update(state("va", DOWN, va))
    rec.wait_for_update(state("vb", DOWN, vb))
    # Admin-up without carrier is not oper-up (IFF_RUNNING): still DOWN.
    ip(netns, "link", "set", "va", "up")
    time.sleep(0.3)
    assert state("va", UP, va) not in rec.updates
    ip(netns, "link", "set", "vb", "up")
    rec.wait_for_update(state("va", UP, va))
    rec.wait_for_update(state("vb", UP, vb))
    rec.take()
    ip(netns, "link", "set", "vb", "down")
    rec.wait_for_update(state("vb", DOWN, vb))
    rec.wait_for_update(state("va", DOWN, va))  # lost its carrier
    states = [u for u in rec.take() if isinstance(u, IfaceStateUpdate)]
    assert sorted(states, key=lambda u: u.name) == [state("va", DOWN, va), state("vb", DOWN, vb)]


def test_ipv4_and_ipv6_addresses(netns: str, start: StartFn) -> None:
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    _, rec = start()
    rec.take()
    ip(netns, "addr", "add", "10.1.0.1/24", "dev", "va")
    rec.wait_for_update(addrs("va", "10.1.0.1"))
    ip(netns, "addr", "add", "fd00:0:0:1:0::1/64", "dev", "va", "nodad")
    rec.wait_for_update(addrs("va", "10.1.0.1", "fd00:0:0:1::1"))  # canonical text
    ip(netns, "addr", "add", "10.1.0.2/32", "dev", "va")
    rec.wait_for_update(addrs("va", "10.1.0.1", "10.1.0.2", "fd00:0:0:1::1"))
    ip(netns, "addr", "del", "10.1.0.1/24", "dev", "va")
    rec.wait_for_update(addrs("va", "10.1.0.2", "fd00:0:0:1::1"))
    ip(netns, "addr", "del", "fd00:0:0:1::1/64", "dev", "va")
    rec.wait_for_update(addrs("va", "10.1.0.2"))
    ip(netns, "addr", "del", "10.1.0.2/32", "dev", "va")
    rec.wait_for_update(addrs("va"))
    assert rec.take() == [
        addrs("va", "10.1.0.1"),
        addrs("va", "10.1.0.1", "fd00:0:0:1::1"),
        addrs("va", "10.1.0.1", "10.1.0.2", "fd00:0:0:1::1"),
        addrs("va", "10.1.0.2", "fd00:0:0:1::1"),
        addrs("va", "10.1.0.2"),
        addrs("va"),
    ]


def test_tentative_ipv6_address_appears_when_dad_completes(netns: str, start: StartFn) -> None:
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    ip(netns, "link", "set", "va", "up")
    ip(netns, "link", "set", "vb", "up")
    _, rec = start()
    ip(netns, "addr", "add", "fd00:2::1/64", "dev", "va")  # DAD runs (about a second)
    time.sleep(0.3)
    shown = subprocess.run(["ip", "-n", netns, "-6", "addr", "show", "dev", "va"], capture_output=True,
                           text=True, check=True).stdout
    if "tentative" in shown:
        # No local route yet, so Felix would not list it either.
        assert "fd00:2::1" not in (last_addrs(rec, "va") or ())
    assert rec.wait(lambda: "fd00:2::1" in (last_addrs(rec, "va") or ()), timeout=10)


@pytest.mark.parametrize("cidr,add_opts", [("10.1.0.1/24", ""), ("fd00:3::1/64", "nodad")])
def test_delete_and_readd_within_100ms_is_damped(netns: str, start: StartFn, cidr: str, add_opts: str) -> None:
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    ip(netns, "addr", "add", cidr, "dev", "va", *add_opts.split())
    _, rec = start()
    rec.take()
    ip_batch(netns, [f"address del {cidr} dev va", f"address add {cidr} dev va {add_opts}"])
    assert rec.quiet_for(0.5) == []
    # The same flap spread over more than 100 ms is reported: gone, then back.
    addr = cidr.split("/")[0]
    ip(netns, "addr", "del", cidr, "dev", "va")
    time.sleep(0.3)
    ip(netns, "addr", "add", cidr, "dev", "va", *add_opts.split())
    rec.wait_for_update(addrs("va", addr))
    assert rec.take() == [addrs("va"), addrs("va", addr)]


def test_address_removal_is_reported_after_the_damping_delay(netns: str, start: StartFn) -> None:
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    ip(netns, "addr", "add", "10.1.0.1/24", "dev", "va")
    _, rec = start()
    rec.take()
    t0 = time.monotonic()
    ip(netns, "addr", "del", "10.1.0.1/24", "dev", "va")
    rec.wait_for_update(addrs("va"))
    assert time.monotonic() - t0 >= 0.1


def test_link_deletion_reports_down_index_zero_and_no_addresses(netns: str, start: StartFn) -> None:
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    ip(netns, "addr", "add", "10.1.0.1/24", "dev", "va")
    ip(netns, "link", "set", "va", "up")
    ip(netns, "link", "set", "vb", "up")
    _, rec = start()
    rec.take()
    ip(netns, "link", "del", "va")  # takes its peer with it
    for name in ("va", "vb"):
        rec.wait_for_update(state(name, DOWN, 0))
        rec.wait_for_update(IfaceAddrsUpdate(name, None))
    time.sleep(0.2)
    for name in ("va", "vb"):
        assert rec.for_iface(name)[-2:] == [state(name, DOWN, 0), IfaceAddrsUpdate(name, None)]


def test_link_moved_to_another_namespace_is_reported_gone(netns: str, start: StartFn) -> None:
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    _, rec = start()
    rec.take()
    with netnsmod.netns("fpyt") as other:
        ip(netns, "link", "set", "vb", "netns", other)
        rec.wait_for_update(state("vb", DOWN, 0))
        rec.wait_for_update(IfaceAddrsUpdate("vb", None))
        time.sleep(0.2)
        assert state("va", DOWN, 0) not in rec.updates  # the node-side end stays


def test_excluded_interface_gets_state_but_no_address_updates(netns: str, start: StartFn) -> None:
    _, rec = start(exclude=("kube-ipvs0", "/^ex/"))
    rec.take()
    ip(netns, "link", "add", "exa", "type", "veth", "peer", "name", "va")
    exa, va = ifindex(netns, "exa"), ifindex(netns, "va")
    ip(netns, "addr", "add", "10.9.0.1/24", "dev", "exa")
    ip(netns, "addr", "add", "10.1.0.1/24", "dev", "va")
    rec.wait_for_update(addrs("va", "10.1.0.1"))  # tracked peer: a barrier for the excluded one
    ip(netns, "link", "set", "exa", "up")
    ip(netns, "link", "set", "va", "up")
    rec.wait_for_update(state("exa", UP, exa))
    ip(netns, "link", "del", "exa")
    rec.wait_for_update(state("exa", DOWN, 0))
    rec.wait_for_update(state("va", DOWN, 0))
    exa_updates = rec.for_iface("exa")
    assert exa_updates and all(isinstance(u, IfaceStateUpdate) for u in exa_updates)
    assert state("va", UP, va) in rec.updates


def test_rename_is_delete_then_add(netns: str, start: StartFn) -> None:
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    ip(netns, "addr", "add", "10.1.0.1/24", "dev", "va")
    va = ifindex(netns, "va")
    _, rec = start()
    rec.take()
    ip(netns, "link", "set", "va", "name", "vc")
    rec.wait_for_update(addrs("vc", "10.1.0.1"))
    assert rec.take() == [
        state("va", DOWN, 0), IfaceAddrsUpdate("va", None),
        state("vc", DOWN, va), addrs("vc", "10.1.0.1"),
    ]


def test_periodic_rescan_in_the_kernel_is_silent_when_nothing_changed(netns: str, start: StartFn) -> None:
    ip(netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    ip(netns, "addr", "add", "10.1.0.1/24", "dev", "va")
    mon, rec = start(refresh=0.05)
    rec.take()
    assert rec.wait(lambda: mon.resyncs >= 5)
    assert rec.take() == []


def test_stop_is_prompt(netns: str, start: StartFn) -> None:
    mon, _ = start()
    t0 = time.monotonic()
    mon.stop()
    assert time.monotonic() - t0 < 0.5
    assert not mon.is_alive()


def test_missing_namespace_is_fatal_and_creates_nothing() -> None:
    rec = Recorder()
    name = "fpyt-does-not-exist"
    mon = InterfaceMonitor(Config(), **rec.callbacks(), netns=name)
    mon.start()
    assert rec.wait(lambda: bool(rec.fatal))
    mon.stop()
    assert rec.in_sync == 0
    listed = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout
    assert name not in listed


def test_no_netns_watches_the_callers_namespace(in_netns: str) -> None:
    """The daemon's case (it runs inside its namespace and passes None)."""
    ip(in_netns, "link", "add", "va", "type", "veth", "peer", "name", "vb")
    rec = Recorder()
    mon = InterfaceMonitor(Config(), **rec.callbacks())  # thread started from inside in_netns
    mon.start()
    try:
        assert rec.wait(lambda: rec.in_sync == 1)
        assert {u.name for u in rec.updates} == {"lo", "va", "vb"}
    finally:
        mon.stop()


def test_the_dump_decoder_reads_what_pyroute2_reads(netns: str) -> None:
    """The start-of-day and refresh dumps are decoded from their bytes (pyroute2 took ~1.1 ms a link):
    for links of several kinds and states and addresses of both families -- deprecated, tentative and
    with a peer -- the result is what pyroute2's decoding gave."""
    from pyroute2 import NetNS  # type: ignore[import-untyped]

    from felixpy.ifacemonitor import shim

    ip_batch(netns, ["link add caliA type veth peer name pA", "link add dum0 type vxlan id 42 dstport 4789",
                     "link set caliA up", "link set dum0 up",
                     "addr add 10.9.0.1/24 dev dum0", "addr add fd00:9::1/64 dev dum0 nodad",
                     "addr add fd00:9::2/64 dev dum0 preferred_lft 0 nodad",
                     "addr add fd00:9::3/64 dev caliA",  # tentative until DAD ends (caliA is up)
                     "addr add 10.9.1.1 peer 10.9.1.2 dev pA"])
    src = shim.RtnlSource(netns)
    ns = NetNS(netns)
    try:
        want_links = sorted(filter(None, map(shim._link_from_msg, ns.get_links())), key=lambda l: l.index)
        found: dict[int, set[str]] = {}
        for got in filter(None, map(shim._addr_from_msg, ns.get_addr())):
            if got[2]:
                found.setdefault(got[0], set()).add(got[1])
        links, addrs_ = src.list_links(), src.list_addrs()
    finally:
        ns.close()
        src.close()
    assert sorted(links, key=lambda l: l.index) == want_links
    assert {l.kind for l in links} >= {"veth", "vxlan", ""}
    assert addrs_ == {i: frozenset(a) for i, a in found.items()}
    assert "10.9.0.1" in addrs_[ifindex(netns, "dum0")] and "10.9.1.1" in addrs_[ifindex(netns, "pA")]
