"""Attach smoke test: real packets through attached programs, in throwaway namespaces.

Three namespaces: ``host`` with two workload veths (``wepA``, ``wepB``) whose peers are ``eth0``
in ``podA`` / ``podB``.  The preamble is attached to both kernel hooks of both host-side
interfaces (clsact filters, or TCX links), and pod A pings pod B: the ping passes or fails as
the policy programs in the jump maps say.  Nothing is attached in the root namespace.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from felixpy.bpf import attach, defs
from felixpy.bpf.attachpoint import AttachPoint, configure, unconfigure
from felixpy.bpf.build import EpType
from felixpy.bpf.errors import UnsupportedAttachType
from felixpy.bpf.policy_ir import ALLOW_ALL, DENY_ALL, PolicySet
from felixpy.testing import netns as nsutil

from .conftest import BPFTestEnv

pytestmark = [pytest.mark.bpf, pytest.mark.kernel]

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
POD_IP = {"A": "10.65.0.2", "B": "10.65.0.3"}
ENTRY = {"A": 100, "B": 101}


@dataclass
class Topo:
    host: str
    pods: dict[str, str]
    ifindex: dict[str, int]


@pytest.fixture
def topo() -> Iterator[Topo]:
    with nsutil.netns("fpyh") as host, nsutil.netns("fpya") as pa, nsutil.netns("fpyb") as pb:
        pods = {"A": pa, "B": pb}
        h = lambda *a: nsutil.run_in(host, *a)  # noqa: E731
        h("sysctl", "-qw", "net.ipv4.ip_forward=1")
        for name, ns in pods.items():
            wep = f"wep{name}"
            h("ip", "link", "add", wep, "type", "veth", "peer", "name", "eth0", "netns", ns)
            h("ip", "addr", "add", "169.254.1.1/32", "dev", wep)
            h("ip", "link", "set", wep, "up")
            h("ip", "route", "add", POD_IP[name] + "/32", "dev", wep)
            p = lambda *a, ns=ns: nsutil.run_in(ns, *a)  # noqa: E731
            p("ip", "addr", "add", POD_IP[name] + "/32", "dev", "eth0")
            p("ip", "link", "set", "eth0", "up")
            p("ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
            p("ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
        with nsutil.entered(host):
            idx = {n: socket.if_nametoindex(f"wep{n}") for n in pods}
            yield Topo(host, pods, idx)


def ping(topo: Topo, src: str, dst: str) -> bool:
    r = nsutil.run_in(topo.pods[src], "ping", "-c", "2", "-i", "0.2", "-W", "1", POD_IP[dst],
                      check=False)
    return r.returncode == 0


class Dataplane:
    """Just enough of an endpoint manager for the smoke test."""

    def __init__(self, env: BPFTestEnv, topo: Topo, mode: attach.AttachMode) -> None:
        self.env, self.topo, self.mode = env, topo, mode
        self.links: list[int] = []
        self.aps: list[AttachPoint] = []

    def add_workload(self, name: str, *, ready: bool = True) -> None:
        ifindex = self.topo.ifindex[name]
        self.env.add_workload(POD_IP[name], ifindex)
        for hook in (ING, EGR):
            ap = AttachPoint(f"wep{name}", ifindex, hook, EpType.WEP,
                             policy_idx_v4=ENTRY[name], flags=defs.GLOBALS_REDIRECT_PEER)
            configure(ap, self.env.programs, self.env.maps)
            self.set_policy(name, hook, ALLOW_ALL)
            link = attach.attach(self.mode, ifindex, hook, self.env.programs.preamble_fd(hook))
            if link is not None:
                self.links.append(link)
            self.aps.append(ap)
        self.set_ready(name, ready)

    def set_ready(self, name: str, ready: bool) -> None:
        flags = defs.IFACE_STATE_WEP | (defs.IFACE_STATE_V4_READY if ready else 0)
        self.env.set_ifstate(self.topo.ifindex[name], flags, f"wep{name}")

    def set_policy(self, name: str, hook: int, ps: PolicySet) -> None:
        self.env.policies.set_policy(ps, hook=hook, entry=ENTRY[name], v6=False)

    def egress(self, name: str, ps: PolicySet) -> None:
        """Workload egress policy runs at the kernel's TC ingress of its host-side veth."""
        self.set_policy(name, ING, ps)

    def ingress(self, name: str, ps: PolicySet) -> None:
        self.set_policy(name, EGR, ps)

    def forget_flows(self) -> None:
        self.env.maps.ct(False).clear()

    def close(self) -> None:
        for link in self.links:
            attach.detach_tcx(link)
            os.close(link)
        for ap in self.aps:
            if self.mode is attach.AttachMode.TC:
                attach.detach_tc(ap.ifindex)
            unconfigure(ap, self.env.maps)
        for name in ENTRY:
            for hook in (ING, EGR):
                self.env.policies.uninstall(hook, ENTRY[name])


@pytest.mark.parametrize("mode", [attach.AttachMode.TC, attach.AttachMode.TCX], ids=["clsact", "tcx"])
def test_ping_follows_policy(env: BPFTestEnv, topo: Topo, mode: attach.AttachMode) -> None:
    if mode is attach.AttachMode.TCX and not attach.tcx_supported():
        pytest.skip("kernel without TCX")
    dp = Dataplane(env, topo, mode)
    try:
        dp.add_workload("A")
        dp.add_workload("B")
        if mode is attach.AttachMode.TC:
            assert attach.tc_filters(topo.ifindex["A"], ING) == [attach.PREAMBLE_NAME]
        else:
            assert len(attach.tcx_programs(topo.ifindex["A"], ING)) == 1

        assert ping(topo, "A", "B")
        # The reply took the established-bypass fast path into A's namespace.
        peer = env.maps.counters
        from felixpy.bpf.maps import counters_total

        assert counters_total(peer, topo.ifindex["B"], ING)[defs.Reason.REDIRECT_PEER] >= 1
        assert counters_total(peer, topo.ifindex["A"], ING)[defs.Reason.REDIRECT_NEIGH] >= 1

        dp.egress("A", DENY_ALL)
        dp.forget_flows()
        assert not ping(topo, "A", "B")

        dp.egress("A", ALLOW_ALL)
        dp.ingress("B", DENY_ALL)
        dp.forget_flows()
        assert not ping(topo, "A", "B")
        assert counters_total(peer, topo.ifindex["B"], EGR)[defs.Reason.DROPPED_BY_POLICY] >= 1

        dp.ingress("B", ALLOW_ALL)
        dp.forget_flows()
        assert ping(topo, "A", "B")

        # fib_approve: B's programs "not yet attached" -> no direct forward for new flows.
        dp.set_ready("B", False)
        dp.forget_flows()
        assert not ping(topo, "A", "B")
        dp.set_ready("B", True)
        assert ping(topo, "A", "B")
    finally:
        dp.close()
    if mode is attach.AttachMode.TC:
        assert attach.tc_filters(topo.ifindex["A"], ING) == []
    else:
        assert attach.tcx_programs(topo.ifindex["A"], ING) == []


def test_attach_mode_resolution() -> None:
    with pytest.raises(UnsupportedAttachType):
        attach.resolve_attach_mode("Netkit", "netkit")
    with pytest.raises(UnsupportedAttachType):
        attach.resolve_attach_mode("TCX", "netkit")
    assert attach.resolve_attach_mode("TC", "veth") is attach.AttachMode.TC
    want = attach.AttachMode.TCX if attach.tcx_supported() else attach.AttachMode.TC
    assert attach.resolve_attach_mode("Netkit", "veth") is want
    assert attach.resolve_attach_mode("tcx", None) is want
    with pytest.raises(ValueError):
        attach.resolve_attach_mode("bogus", None)
    with pytest.raises(UnsupportedAttachType):
        attach.attach(attach.AttachMode.NETKIT, 1, ING, -1)
