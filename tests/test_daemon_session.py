"""The daemon's session logic in-process: feeds, config, build, status — without sockets or root.

A :class:`FakeFeed` plays the part httpx's ``MockTransport`` plays for a client: the test posts
the events a transport would post (``FeedOpened``, ``FeedMessages``, ``FeedClosed``) onto the
daemon's queue and reads back what the daemon sent on the feed.  The daemon is the real one with
the real :func:`~felixpy.dataplane.wiring.build_dataplane`, over stateful fake kernels (iptables
save/restore, ipset, netlink, sysctls) that outlive each dataplane the way the kernel outlives a
feed, and on the one :class:`~felixpy.testing.clock.FakeClock`.

The runner is stepped one batch at a time (``Daemon._iterate``: drain a batch, then tick), so
every assertion sees the state after the daemon has handled exactly what was posted.
"""

from __future__ import annotations

import itertools
import queue
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from felixpy import config as configmod
from felixpy.config import Config
from felixpy.daemon import EXIT_FATAL, EXIT_OK, EXIT_USAGE, Daemon, Stop
from felixpy.dataplane.core import InternalDataplane
from felixpy.dataplane.wiring import build_dataplane
from felixpy.messages import from_payload_of, to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock
from felixpy.testing.kernel import FakeKernel
from felixpy.transports.base import FeedClosed, FeedMessages, FeedOpened
from felixpy.transports.stream import UnixSocketServer

START = 1000.0


class FakeFeed:
    """One feed's far end: records what the daemon sends; closing is observable."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[pb.FromDataplane] = []
        self.closed = False
        self._seq = itertools.count()

    def send(self, msg: pb.FromDataplane) -> None:
        if not self.closed:  # as the real feeds: dropped once closed
            self.sent.append(msg)

    def close(self) -> None:
        self.closed = True

    def envelopes(self, payloads: Sequence[Any]) -> list[pb.ToDataplane]:
        return [to_dataplane(next(self._seq), p) for p in payloads]

    def received(self, kind: str) -> list[Any]:
        """Payloads of one FromDataplane field (e.g. "dataplane_in_sync"), in order."""
        return [p for name, p in map(from_payload_of, self.sent) if name == kind]


class Node:
    """A real :class:`Daemon` over a :class:`FakeKernel`, stepped by hand."""

    def __init__(self, *, iface_monitor: bool = True, **daemon_kw: Any) -> None:
        self.kernel = FakeKernel()
        self.clock = FakeClock(START)
        self.builds: list[InternalDataplane] = []
        # environ={}: the test process's FELIX_* variables must not leak into the config.
        self.daemon = Daemon(build=self._build, clock=self.clock, environ={}, **daemon_kw)
        self.monitor = self.daemon.iface_callbacks() if iface_monitor else None
        self._names = itertools.count(1)

    def _build(self, cfg: Config, **kw: Any) -> InternalDataplane:
        dp = build_dataplane(cfg, deps=self.kernel.deps(self.clock.monotonic), **kw)
        self.builds.append(dp)
        return dp

    def chains(self) -> set[str]:
        """Our chains in the IPv4 filter table."""
        return {c for c in self.kernel.chains(4, "filter") if c.startswith("cali")}

    @property
    def exit_code(self) -> int | None:
        return self.daemon.exit_code

    def pump(self) -> None:
        """Let the runner handle everything posted so far (batch by batch, each followed by a tick)."""
        while not self.daemon.events.empty() and self.daemon.exit_code is None:
            self.daemon._iterate()

    def open(self, *, takeover: bool = False) -> FakeFeed:
        feed = FakeFeed(f"fake-{next(self._names)}")
        self.daemon.events.put(FeedOpened(feed, takeover=takeover))
        self.pump()
        return feed

    def send(self, feed: FakeFeed, *payloads: Any) -> None:
        self.daemon.events.put(FeedMessages(feed, feed.envelopes(payloads)))
        self.pump()

    def close(self, feed: FakeFeed, error: str | None = None) -> None:
        self.daemon.events.put(FeedClosed(feed, error))
        self.pump()

    def iface_up(self, name: str) -> None:
        assert self.monitor is not None
        self.monitor["on_state"](self.kernel.workload_iface(name))
        self.pump()

    def iface_in_sync(self) -> None:
        assert self.monitor is not None
        self.monitor["on_in_sync"]()
        self.pump()

    def tick(self, seconds: float) -> None:
        """Let virtual time pass and wake the runner once (an event it ignores, then its tick)."""
        self.clock.advance(seconds)
        self.daemon.events.put(object())
        self.pump()

    def stop(self) -> int:
        self.daemon.events.put(Stop("test"))
        return self.daemon.run()


@pytest.fixture
def node() -> Iterator[Node]:
    n = Node()
    yield n
    if n.exit_code is None:
        n.stop()
    for dp in n.builds:
        dp.close()


def config(**params: str) -> pb.ConfigUpdate:
    return pb.ConfigUpdate(config={"ReportingIntervalSecs": "0", **params})


def wid(name: str) -> pb.WorkloadEndpointID:
    return pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id=f"default/{name}", endpoint_id="eth0")


def wep(name: str, ip: str) -> pb.WorkloadEndpointUpdate:
    return pb.WorkloadEndpointUpdate(id=wid(name), endpoint=pb.WorkloadEndpoint(
        state="active", name=f"cali{name}", ipv4_nets=[ip], profile_ids=["kns.default"]))


PROFILE = pb.ActiveProfileUpdate(id=pb.ProfileID(name="kns.default"), profile=pb.Profile(
    inbound_rules=[pb.Rule(action="allow")], outbound_rules=[pb.Rule(action="allow")]))
CLIENTS = pb.IPSetUpdate(id="s:clients", members=["10.65.0.2"], type=pb.IPSetUpdate.IP)


def start_of_day(node: Node, feed: FakeFeed) -> None:
    node.send(feed, config(), CLIENTS, PROFILE, wep("a", "10.65.0.1/32"), pb.InSync())


def programmed_feed(node: Node) -> FakeFeed:
    """A feed whose start of day has programmed workload "a" on an interface that is up."""
    node.iface_up("calia")
    node.iface_in_sync()
    feed = node.open()
    start_of_day(node, feed)
    return feed


# ------------------------------------------------------------------------------------ start of day
def test_nothing_reaches_the_kernel_before_in_sync(node: Node) -> None:
    node.iface_up("calia")
    node.iface_in_sync()
    before = node.kernel.snapshot()
    feed = node.open()
    node.send(feed, config(), CLIENTS, PROFILE, wep("a", "10.65.0.1/32"))
    assert len(node.builds) == 1  # the config arrived: the dataplane is built...
    assert node.kernel.snapshot() == before  # ...but nothing reaches the kernel
    assert feed.sent == []
    filter4 = next(t for t in node.builds[0].tables if t.name == "filter" and t.ip_version == 4)
    assert "cali-pri-kns.default" in filter4._chains  # the profile is rendered ahead, in memory only
    assert {"cali-tw-calia", "cali-fw-calia"} <= set(filter4._chains)  # and the endpoint's chains
    assert filter4._chains["cali-to-wl-dispatch"].rules[0].action.target == "cali-tw-calia"  # and the dispatch

    node.send(feed, pb.InSync())
    assert {"cali-FORWARD", "cali-tw-calia", "cali-fw-calia", "cali-pri-kns.default"} <= node.chains()
    assert node.kernel.ipset.members("cali40s:clients") == {"10.65.0.2"}
    assert "10.65.0.1/32" in node.kernel.netlink.routes_in()  # the workload's route
    assert node.kernel.sysctls.values["net/ipv4/conf/calia/proxy_arp"] == "1"
    assert len(feed.received("dataplane_in_sync")) == 1
    assert [u.id for u in feed.received("workload_endpoint_status_update")] == [wid("a")]
    assert feed.received("workload_endpoint_status_update")[0].status.status == "up"
    assert [m.sequence_number for m in feed.sent] == list(range(len(feed.sent)))  # numbered from 0


def test_the_interface_monitor_must_be_in_sync_too(node: Node) -> None:
    feed = node.open()
    start_of_day(node, feed)
    assert node.chains() == set() and feed.received("dataplane_in_sync") == []
    node.iface_up("calia")
    assert node.chains() == set()
    node.iface_in_sync()
    assert "cali-tw-calia" in node.chains()
    assert len(feed.received("dataplane_in_sync")) == 1


def test_without_an_interface_monitor_in_sync_alone_applies() -> None:
    n = Node(iface_monitor=False)
    try:
        feed = n.open()
        start_of_day(n, feed)
        assert "cali-tw-calia" in n.chains()
        assert feed.received("workload_endpoint_status_update")[0].status.status == "down"  # never seen up
    finally:
        n.stop()
        for dp in n.builds:
            dp.close()


def test_in_sync_without_a_config_builds_with_the_defaults(node: Node) -> None:
    node.iface_in_sync()
    feed = node.open()
    node.send(feed, CLIENTS)
    assert node.builds == []  # buffered until the config is known
    node.send(feed, pb.InSync())
    (dp,) = node.builds
    assert dp.config == configmod.load({}, environ={})[0]
    assert node.kernel.ipset.members("cali40s:clients") == {"10.65.0.2"}  # the buffer was replayed
    assert len(feed.received("dataplane_in_sync")) == 1


def test_endpoint_removal_is_reported(node: Node) -> None:
    feed = programmed_feed(node)
    node.send(feed, pb.WorkloadEndpointRemove(id=wid("a")))
    assert [r.id for r in feed.received("workload_endpoint_status_remove")] == [wid("a")]
    assert "cali-tw-calia" not in node.chains()


# ------------------------------------------------------------------------------------ status
def test_process_status_is_reported_on_the_injected_clock(node: Node) -> None:
    node.iface_in_sync()
    feed = node.open()
    node.send(feed, config(ReportingIntervalSecs="5"), pb.InSync())
    node.tick(4.9)
    assert feed.received("process_status_update") == []
    node.tick(0.1)
    (status,) = feed.received("process_status_update")
    assert status.uptime == pytest.approx(5.0)  # virtual seconds since the daemon started
    assert status.iso_timestamp.endswith("+00:00")
    node.tick(5.0)
    assert [s.uptime for s in feed.received("process_status_update")] == pytest.approx([5.0, 10.0])


def test_reporting_interval_zero_sends_no_process_status(node: Node) -> None:
    node.iface_in_sync()
    feed = node.open()
    node.send(feed, config(), pb.InSync())
    node.tick(3600)
    assert feed.received("process_status_update") == []


# ------------------------------------------------------------------------------------ config
def test_a_config_change_needing_a_restart_exits_129(node: Node) -> None:
    node.iface_in_sync()
    feed = node.open()
    start_of_day(node, feed)
    node.send(feed, config(MaxIpsetSize="1000"))
    assert node.exit_code == configmod.EXIT_CONFIG_CHANGED == 129


def test_an_informational_config_change_keeps_running(node: Node) -> None:
    node.iface_in_sync()
    feed = node.open()
    start_of_day(node, feed)
    node.send(feed, config(CalicoVersion="v9.9"))
    assert node.exit_code is None and len(node.builds) == 1


def test_health_settings_from_a_new_feed_rebind_the_server_without_a_restart(node: Node) -> None:
    node.iface_in_sync()
    first = node.open()
    start_of_day(node, first)
    node.close(first)
    second = node.open()
    node.send(second, config(HealthEnabled="true", HealthHost="127.0.0.1", HealthPort="0"), pb.InSync())
    assert node.exit_code is None and len(node.builds) == 2
    (server,) = node.daemon._servers
    address = server.server_address
    assert isinstance(address, tuple)
    host, port = address[0], address[1]
    assert host == "127.0.0.1"
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(b"GET /liveness HTTP/1.0\r\n\r\n")
        assert conn.recv(64).startswith(b"HTTP/1.0 200")


def test_a_config_the_dataplane_cannot_build_exits_2(node: Node) -> None:
    feed = node.open()
    # Valid parameters that contradict each other: one routing table cannot serve both WireGuard families.
    node.send(feed, config(WireguardEnabled="true", WireguardEnabledV6="true", RouteTableRanges="1-1"))
    assert node.exit_code == EXIT_USAGE and node.builds == []


# ------------------------------------------------------------------------------------ feeds
def test_a_dropped_feed_leaves_the_kernel_as_programmed(node: Node) -> None:
    feed = programmed_feed(node)
    programmed = node.kernel.snapshot()
    node.close(feed, error="peer went away")
    assert feed.closed and node.exit_code is None
    node.tick(60.0)
    assert node.kernel.snapshot() == programmed


def test_the_next_feed_is_a_new_start_of_day(node: Node) -> None:
    first = programmed_feed(node)
    node.close(first)
    node.iface_up("calib")  # a new workload interface appears between the feeds
    programmed = node.kernel.snapshot()

    second = node.open()
    node.send(second, config(), CLIENTS, PROFILE, wep("b", "10.65.0.3/32"))  # "a" is gone, "b" is new
    assert len(node.builds) == 2
    assert node.kernel.snapshot() == programmed  # nothing changes before this feed's InSync
    node.send(second, pb.InSync())
    assert "cali-tw-calia" not in node.chains()  # swept by the new start of day
    assert {"cali-tw-calib", "cali-pri-kns.default"} <= node.chains()
    assert node.kernel.ipset.members("cali40s:clients") == {"10.65.0.2"}
    assert len(second.received("dataplane_in_sync")) == 1
    assert [m.sequence_number for m in second.sent] == list(range(len(second.sent)))


def test_the_unix_transport_refuses_a_second_concurrent_feed(tmp_path: Path) -> None:
    """One feed at a time at the transport: a second connection is closed without reaching the runner."""
    events: queue.SimpleQueue[object] = queue.SimpleQueue()
    path = str(tmp_path / "feed.sock")
    server = UnixSocketServer(path, events)
    server.start()
    clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    try:
        clients[0].connect(path)
        first = events.get(timeout=5)
        assert isinstance(first, FeedOpened)
        clients[1].connect(path)
        clients[1].settimeout(5)
        assert clients[1].recv(1) == b""  # refused: closed by the server
        assert events.empty()
        first.feed.close()  # the runner ends the session
        clients[2].connect(path)
        seen = [events.get(timeout=5)]
        while not isinstance(seen[-1], FeedOpened):
            seen.append(events.get(timeout=5))
        assert seen[-1].feed is not first.feed  # the next connection is accepted
        assert all(isinstance(e, FeedClosed) and e.feed is first.feed for e in seen[:-1])
    finally:
        server.stop()
        for c in clients:
            c.close()


def test_a_second_feed_is_refused_unless_it_asks_to_take_over(node: Node) -> None:
    """One feed at a time: a mistaken second feed cannot wipe the node; an explicit takeover replaces."""
    first = programmed_feed(node)
    mistaken = node.open()
    assert mistaken.closed and not first.closed
    assert len(node.builds) == 1 and "cali-tw-calia" in node.chains()
    second = node.open(takeover=True)
    assert first.closed and not second.closed
    node.send(first, wep("late", "10.65.0.9/32"))  # a replaced feed's leftovers are dropped
    node.send(second, config(), CLIENTS, PROFILE, wep("a", "10.65.0.1/32"), pb.InSync())
    assert len(node.builds) == 2
    assert "cali-tw-calilate" not in node.chains() and "cali-tw-calia" in node.chains()
    assert len(second.received("dataplane_in_sync")) == 1


@pytest.mark.parametrize(("error", "code"), [(None, EXIT_OK), ("connection reset", EXIT_FATAL)])
def test_exit_when_the_feed_closes(error: str | None, code: int) -> None:
    n = Node(exit_when_feed_closes=True)
    try:
        feed = n.open()
        start_of_day(n, feed)
        n.close(feed, error)
        assert n.exit_code == code
    finally:
        for dp in n.builds:
            dp.close()


def test_stop_closes_the_feed_and_exits_0(node: Node) -> None:
    feed = node.open()
    start_of_day(node, feed)
    assert node.stop() == EXIT_OK
    assert feed.closed


# ------------------------------------------------------------------------------------ the collector
def test_the_start_of_day_heap_is_frozen_until_the_feed_closes(node: Node) -> None:
    import gc

    from felixpy.daemon import GC_THRESHOLD_0

    before = gc.get_threshold()
    gc.unfreeze()
    feed = programmed_feed(node)
    assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] == GC_THRESHOLD_0
    node.close(feed)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before  # the old day is collectable again
    second = node.open()
    start_of_day(node, second)
    assert gc.get_freeze_count() > 0
    assert node.stop() == EXIT_OK
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
