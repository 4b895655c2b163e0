"""The deployment tests' lab: a node namespace, two CNI-style workloads, a small policy scenario.

Workload ``b`` sits behind a policy that admits only TCP 8080; ``a`` has the
allow-all profile only.  So once programmed: a → b:8080 passes, a → b:8081 is
dropped (end of tier), b → a:8081 passes — and before anything is programmed,
all three pass (the topology routes on its own, so "dropped" proves felixpy).

:class:`PipeFeed` is Felix's side of the external-driver protocol: the driver gets
the read end of one pipe as fd 3 and the write end of another as fd 4, and no
arguments; frames are 8-byte little-endian length + protobuf both ways.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from felixpy.feed.client import FeedClient
from felixpy.feed.framing import FrameDecoder, encode_frame
from felixpy.feed.scenario import Scenario, scenario_from_dict
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import conncheck as cc
from felixpy.testing.topology import Node

WORKLOADS = {"a": ("10.66.0.2", "fd00:66::2"), "b": ("10.66.0.3", "fd00:66::3")}
FAMILIES = (4, 6)
# (source, destination, port) → passes once the policy is programmed
PROGRAMMED = {("a", "b", 8080): True, ("a", "b", 8081): False, ("b", "a", 8081): True}
UNPROGRAMMED = {k: True for k in PROGRAMMED}
CONVERGE_TIMEOUT = 15.0


def iface(name: str) -> str:
    return f"calidp{name}"


def scenario(macs: Mapping[str, str]) -> Scenario:
    def workload(name: str, **extra: Any) -> dict[str, Any]:
        v4, v6 = WORKLOADS[name]
        return {"name": iface(name), "id": {"workload": f"default/wl-{name}"}, "mac": macs[name],
                "ipv4_nets": [f"{v4}/32"], "ipv6_nets": [f"{v6}/128"], "profile_ids": ["kns.default"], **extra}

    return scenario_from_dict({
        "description": "deploy lab: b admits TCP 8080 only",
        "config": {"InterfacePrefix": "cali", "Ipv6Support": "true", "ReportingIntervalSecs": "1"},
        "policies": [{"name": "allow-8080", "tier": "default",
                      "inbound": [{"action": "allow", "protocol": "tcp", "dst_ports": [8080]}]}],
        "profiles": [{"name": "kns.default", "inbound": [{"action": "allow"}], "outbound": [{"action": "allow"}]}],
        "workloads": [workload("a"), workload("b", tiers=[{"name": "default", "ingress": ["allow-8080"]}])],
    })


class Lab:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.servers = cc.Servers()
        self.endpoints: dict[str, cc.Endpoint] = {}
        self.macs: dict[str, str] = {}

    @property
    def netns(self) -> str:
        return self.node.netns

    def matrix(self) -> dict[tuple[int, str, str, int], bool]:
        jobs = {(v, s, d, port): (self.endpoints[s].netns, self.endpoints[d].ip(v), cc.Probe("tcp", port))
                for v in FAMILIES for (s, d, port) in PROGRAMMED}
        return cc.probe_all(jobs, timeout=0.5)

    def wait_matrix(self, want: Mapping[tuple[str, str, int], bool], timeout: float = CONVERGE_TIMEOUT) -> None:
        expected = {(v, s, d, p): ok for v in FAMILIES for (s, d, p), ok in want.items()}
        deadline = time.monotonic() + timeout
        while (got := self.matrix()) != expected:
            if time.monotonic() > deadline:
                wrong = sorted(f"IPv{v} {s}->{d}:{p} {'passes' if got[k] else 'blocked'}"
                               for k in expected if got[k] != expected[k] for (v, s, d, p) in [k])
                raise AssertionError(f"connectivity not as expected after {timeout}s: {wrong}")
            time.sleep(0.2)

    def assert_matrix(self, want: Mapping[tuple[str, str, int], bool]) -> None:
        """Probe once (no waiting): for checks that something *stays* as it was."""
        expected = {(v, s, d, p): ok for v in FAMILIES for (s, d, p), ok in want.items()}
        got = self.matrix()
        assert got == expected, {k: got[k] for k in expected if got[k] != expected[k]}

    def scenario(self) -> Scenario:
        return scenario(self.macs)


@contextlib.contextmanager
def lab(prefix: str = "fpydp") -> Iterator[Lab]:
    node = Node.create(prefix, workload_prefix=f"{prefix}w")
    the_lab = Lab(node)
    try:
        for name, (v4, v6) in WORKLOADS.items():
            wl = node.add_workload(name, v4, v6, iface=iface(name))
            the_lab.servers.start(wl.netns)
            the_lab.endpoints[name] = cc.Endpoint(name, wl.netns, v4, v6)
            the_lab.macs[name] = wl.mac
        the_lab.wait_matrix(UNPROGRAMMED)  # the topology routes before anything is programmed
        yield the_lab
    finally:
        the_lab.servers.stop()
        node.delete()


class PipeFeed(FeedClient):
    """Felix's end of the driver pipes: spawns ``argv`` with fd 3 (read) and fd 4 (write), no arguments."""

    def __init__(self, argv: list[str], env: Mapping[str, str]) -> None:
        super().__init__()
        to_driver_r, self._to_driver = os.pipe()
        self._from_driver, from_driver_w = os.pipe()
        # A bash trampoline (dash takes single-digit fds only) puts the pipe ends on exactly fds 3 and 4, as Go's ExtraFiles does for Felix.
        trampoline = f'exec "$@" 3<&{to_driver_r} 4>&{from_driver_w} {to_driver_r}<&- {from_driver_w}>&-'
        self.proc = subprocess.Popen(["bash", "-c", trampoline, "bash", *argv], env=dict(env),
                                     pass_fds=(to_driver_r, from_driver_w), stderr=subprocess.PIPE)
        os.close(to_driver_r)
        os.close(from_driver_w)
        self._wlock = threading.Lock()
        threading.Thread(target=self._reader, daemon=True, name="pipe-feed").start()

    def _reader(self) -> None:
        dec = FrameDecoder()
        with contextlib.suppress(OSError):
            while chunk := os.read(self._from_driver, 1 << 16):
                for raw in dec.feed(chunk):
                    m = pb.FromDataplane()
                    m.ParseFromString(raw)
                    self._got(m)
        self._ended(None)

    def send(self, msgs: Iterable[pb.ToDataplane]) -> None:
        data = memoryview(b"".join(encode_frame(m.SerializeToString()) for m in msgs))
        with self._wlock:
            while data:
                data = data[os.write(self._to_driver, data):]

    def close(self) -> None:
        """Close fd 3's other end, as Felix does when it stops."""
        with contextlib.suppress(OSError):
            os.close(self._to_driver)

    def wait_exit(self, timeout: float = 10.0) -> tuple[int, str]:
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise AssertionError(f"driver did not exit within {timeout}s") from None
        with contextlib.suppress(OSError):
            os.close(self._from_driver)
        return self.proc.returncode, err.decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.close()
        self.proc.communicate()


def got(feed: FeedClient, name: str) -> list[pb.FromDataplane]:
    return [m for m in list(feed.received) if m.WhichOneof("payload") == name]
