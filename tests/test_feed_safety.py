"""Feed safety with the real daemon in a throwaway namespace (iptables-nft; kernel state read back).

* Only root (or the daemon's uid) reaches the feed sockets: both are ``0600`` even under umask 0, and the
  framed socket refuses a peer of another uid whatever the file mode.
* One feed at a time: a second feed without ``--replace`` is refused and changes nothing — one mistaken
  ``felixpy feed`` cannot wipe a live node's policy — while the live feed keeps working; with
  ``--replace`` it takes over (so the refusal is what protected the node).
* A feed that never sends ``InSync`` leaves the kernel untouched: on a fresh node, after an earlier feed,
  and as a takeover.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from felixpy.feed.client import FeedClient, connect
from felixpy.proto import felixbackend_pb2 as pb
from daemon_feeds import datastore as _datastore
from daemon_feeds import feed_until_in_sync, kernel
from felixpy.testing.daemon import DaemonProcess, start_daemon

pytestmark = pytest.mark.kernel

if os.geteuid() != 0:  # pragma: no cover
    pytest.skip("needs root", allow_module_level=True)

ENV = {"FELIX_IPTABLESBACKEND": "nft"}


def datastore(members: list[str], *, policy: bool = True, in_sync: bool = True,
              barrier: str = "") -> list[pb.ToDataplane]:
    msgs = _datastore(members, policy=policy, in_sync=in_sync)
    if barrier:
        msgs.insert(len(msgs) - 1 if in_sync else len(msgs), barrier_msg(barrier))
    return msgs


def _wep(name: str) -> pb.WorkloadEndpointID:
    return pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id=name, endpoint_id="eth0")


def barrier_msg(name: str) -> pb.ToDataplane:
    """A dummy endpoint whose status comes back after the apply that processed what was sent before it."""
    return pb.ToDataplane(workload_endpoint_update=pb.WorkloadEndpointUpdate(
        id=_wep(name), endpoint=pb.WorkloadEndpoint(state="active", name=f"calibar{name}")))


def wait_barrier(c: FeedClient, name: str) -> None:
    c.wait_for(lambda m: m.HasField("workload_endpoint_status_update")
               and m.workload_endpoint_status_update.id.workload_id == name, 20)


@pytest.fixture(params=["unix", "grpc"])
def daemon(request: pytest.FixtureRequest, netns: str) -> Iterator[DaemonProcess]:
    old = os.umask(0)  # the daemon inherits it: its sockets must still be born 0600
    try:
        d = start_daemon(netns, transport=request.param, iface_monitor=False, env=ENV)
    finally:
        os.umask(old)
    yield d
    d.stop()


def test_sockets_are_owner_only_even_under_umask_0(daemon: DaemonProcess) -> None:
    mode = stat.S_IMODE(os.stat(daemon.socket_path).st_mode)
    assert mode == 0o600, f"{daemon.transport} socket is {oct(mode)}"


def test_framed_socket_refuses_another_uid_whatever_the_mode(netns: str) -> None:
    d = start_daemon(netns, transport="unix", iface_monitor=False, env=ENV)
    try:
        os.chmod(os.path.dirname(d.socket_path), 0o755)
        os.chmod(d.socket_path, 0o666)  # a careless admin: the peer check still holds
        code = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(5); "
                "print('EOF' if s.recv(1)==b'' else 'DATA')")
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                              code, d.socket_path], capture_output=True, text=True, timeout=20)
        assert out.stdout.strip() == "EOF", out
        assert "Refusing a feed connection from another user" in d.logs()
        feed_until_in_sync(d, datastore(["10.65.0.9/32"]))  # root still gets in
    finally:
        d.stop()


def test_a_mistaken_feed_cannot_wipe_a_live_nodes_policy(daemon: DaemonProcess) -> None:
    ns = daemon.netns
    live = connect(daemon.target)
    live.send(datastore(["10.65.0.9/32"], barrier="b1"))
    live.wait_in_sync(20)
    wait_barrier(live, "b1")
    before = kernel(ns)
    assert "cali-pi-" in before and "10.65.0.9" in before

    mistaken = connect(daemon.target)  # an operator's `felixpy feed empty.yaml`, no --replace
    with pytest.raises(TimeoutError):
        mistaken.send(datastore([], policy=False))
        mistaken.wait_in_sync(5)
    mistaken.wait_closed(5)
    assert not mistaken.received, "the refused feed got replies"
    time.sleep(0.5)
    assert kernel(ns) == before, "a refused feed changed the kernel"
    assert "Rejecting a second concurrent" in daemon.logs()

    # The live feed is still the node's feed: its next update is programmed.
    live.send([pb.ToDataplane(ipset_delta_update=pb.IPSetDeltaUpdate(id="s:clients",
                                                                     added_members=["10.65.0.10/32"])),
               barrier_msg("b2")])
    wait_barrier(live, "b2")
    assert "10.65.0.10" in kernel(ns)

    # An explicit takeover does replace it (so the refusal above is what kept the policy).
    taker = connect(daemon.target, replace=True)
    taker.send(datastore([], policy=False))
    taker.wait_in_sync(20)
    live.wait_closed(10)
    after = kernel(ns)
    assert "cali-pi-" not in after and "10.65.0.9" not in after
    assert "Feed takeover" in daemon.logs()
    taker.close()
    assert daemon.alive()


def test_a_feed_that_never_sends_insync_leaves_the_kernel_untouched(daemon: DaemonProcess) -> None:
    ns = daemon.netns
    pristine = kernel(ns)
    # A fresh node: nothing is written at all.
    c = connect(daemon.target)
    c.send(datastore(["10.65.0.9/32"], in_sync=False))
    time.sleep(2)
    assert kernel(ns) == pristine and "cali" not in pristine
    c.close()
    c.wait_closed(5)
    time.sleep(0.3)
    assert kernel(ns) == pristine

    # A programmed node: a later feed without InSync changes nothing, open or closed.
    good = connect(daemon.target)
    good.send(datastore(["10.65.0.9/32"], barrier="b1"))
    good.wait_in_sync(20)
    wait_barrier(good, "b1")
    programmed = kernel(ns)
    good.close()
    good.wait_closed(5)
    time.sleep(0.3)
    partial = connect(daemon.target)
    partial.send(datastore([], policy=False, in_sync=False))
    time.sleep(2)
    assert kernel(ns) == programmed
    partial.close()
    partial.wait_closed(5)

    # ... and so does a takeover that never sends InSync.
    time.sleep(0.3)
    live = connect(daemon.target)
    live.send(datastore(["10.65.0.9/32"], barrier="b2"))
    wait_barrier(live, "b2")
    programmed = kernel(ns)
    taker = connect(daemon.target, replace=True)
    taker.send(datastore([], policy=False, in_sync=False))
    live.wait_closed(10)
    time.sleep(2)
    assert kernel(ns) == programmed
    taker.close()
    assert daemon.alive()
