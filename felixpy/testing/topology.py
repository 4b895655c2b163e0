"""FV topology: a node namespace with workload namespaces plugged in as Calico's CNI would.

Each workload is a namespace joined to the node by a veth pair: ``eth0`` in the
workload with a /32 (and /128) address, a default route via 169.254.1.1
(IPv4, answered by proxy ARP) and via fe80::ecee:eeff:feee:eeee (IPv6, the
node-side veth's link-local address from MAC ee:ee:ee:ee:ee:ee); on the node,
the veth is named ``cali…`` and /32 + /128 routes point down it.  Everything is
deleted by :meth:`Node.delete` (also when a test fails, via :func:`node`).
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

from felixpy.testing import netns as nsmod

HOST_MAC = "ee:ee:ee:ee:ee:ee"
HOST_LL6 = "fe80::ecee:eeff:feee:eeee"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)


def sysctl(ns: str, key: str, value: str) -> None:
    sh("ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={value}")


@dataclass
class Workload:
    name: str
    netns: str
    iface: str  # node-side interface (cali…)
    ipv4: str
    ipv6: str
    mac: str

    def ip(self, version: int) -> str:
        return self.ipv4 if version == 4 else self.ipv6


@dataclass
class Outside:
    """A namespace outside the cluster joined to the node by a veth (``iface`` on the node side,
    ``eth0`` inside) on ``net4``.0/24 and ``net6``::/64: the node is .1 / ::1, the outside .2 / ::2,
    with its default routes via the node."""

    netns: str
    iface: str
    node4: str
    node6: str
    peer4: str
    peer6: str

    def node_ip(self, version: int) -> str:
        return self.node4 if version == 4 else self.node6

    def ip(self, version: int) -> str:
        return self.peer4 if version == 4 else self.peer6


@dataclass
class Node:
    netns: str
    host_ipv4: str = "10.99.0.1"
    host_ipv6: str = "fd00:99::1"
    workloads: dict[str, Workload] = field(default_factory=dict)
    workload_prefix: str = "fpyw"
    _extra_netns: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, prefix: str = "fpyn", workload_prefix: str = "fpyw") -> Node:
        ns = nsmod.create(prefix)
        n = cls(ns, workload_prefix=workload_prefix)
        for key, val in (("net.ipv4.ip_forward", "1"), ("net.ipv6.conf.all.forwarding", "1"),
                         ("net.ipv6.conf.default.accept_dad", "0"), ("net.ipv6.conf.all.accept_dad", "0")):
            sysctl(ns, key, val)
        # A host address for workload→host tests, on lo.
        sh("ip", "-n", ns, "addr", "add", f"{n.host_ipv4}/32", "dev", "lo")
        sh("ip", "-n", ns, "-6", "addr", "add", f"{n.host_ipv6}/128", "dev", "lo", "nodad")
        # Proxy ARP only answers for a target routed out of *another* device; a real node's
        # default route provides that for 169.254.1.1, this stand-in does here.
        sh("ip", "-n", ns, "route", "add", "169.254.1.1/32", "dev", "lo")
        return n

    def add_workload(self, name: str, ipv4: str, ipv6: str, iface: str | None = None) -> Workload:
        iface = iface or f"cali{name}"[:15]
        wns = nsmod.create(self.workload_prefix)
        self._extra_netns.append(wns)
        tmp = f"fpyv{secrets.token_hex(3)}"
        sh("ip", "-n", self.netns, "link", "add", iface, "type", "veth", "peer", "name", tmp, "netns", wns)
        sh("ip", "-n", wns, "link", "set", tmp, "name", "eth0")
        for key, val in (("net.ipv6.conf.all.accept_dad", "0"), ("net.ipv6.conf.default.accept_dad", "0"),
                         ("net.ipv6.conf.eth0.accept_dad", "0")):
            sysctl(wns, key, val)
        sh("ip", "-n", self.netns, "link", "set", iface, "address", HOST_MAC)
        sysctl(self.netns, f"net.ipv6.conf.{iface}.accept_dad", "0")
        sysctl(self.netns, f"net.ipv4.conf.{iface}.proxy_arp", "1")  # the CNI plugin sets this too
        sh("ip", "-n", self.netns, "link", "set", iface, "up")
        sh("ip", "-n", wns, "addr", "add", f"{ipv4}/32", "dev", "eth0")
        sh("ip", "-n", wns, "-6", "addr", "add", f"{ipv6}/128", "dev", "eth0", "nodad")
        sh("ip", "-n", wns, "link", "set", "eth0", "up")
        sh("ip", "-n", wns, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
        sh("ip", "-n", wns, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
        sh("ip", "-n", wns, "-6", "route", "add", "default", "via", HOST_LL6, "dev", "eth0")
        sh("ip", "-n", self.netns, "route", "add", f"{ipv4}/32", "dev", iface)
        sh("ip", "-n", self.netns, "-6", "route", "add", f"{ipv6}/128", "dev", iface)
        mac = sh("ip", "-n", wns, "-br", "link", "show", "eth0").stdout.split()[2]
        wl = Workload(name, wns, iface, ipv4, ipv6, mac)
        self.workloads[name] = wl
        return wl

    def add_outside(self, iface: str, net4: str, net6: str) -> Outside:
        """A host interface ``iface`` (e.g. the node's ``eth0``) leading to a new outside namespace."""
        ns = nsmod.create(f"{self.workload_prefix}o")
        self._extra_netns.append(ns)
        out = Outside(ns, iface, f"{net4}.1", f"{net6}::1", f"{net4}.2", f"{net6}::2")
        tmp = f"fpyo{secrets.token_hex(3)}"
        sh("ip", "-n", self.netns, "link", "add", iface, "type", "veth", "peer", "name", tmp, "netns", ns)
        sh("ip", "-n", ns, "link", "set", tmp, "name", "eth0")
        for key in ("net.ipv6.conf.all.accept_dad", "net.ipv6.conf.default.accept_dad", "net.ipv6.conf.eth0.accept_dad"):
            sysctl(ns, key, "0")
        sysctl(self.netns, f"net.ipv6.conf.{iface}.accept_dad", "0")
        sh("ip", "-n", self.netns, "addr", "add", f"{out.node4}/24", "dev", iface)
        sh("ip", "-n", self.netns, "-6", "addr", "add", f"{out.node6}/64", "dev", iface, "nodad")
        sh("ip", "-n", ns, "addr", "add", f"{out.peer4}/24", "dev", "eth0")
        sh("ip", "-n", ns, "-6", "addr", "add", f"{out.peer6}/64", "dev", "eth0", "nodad")
        for n, dev in ((self.netns, iface), (ns, "eth0"), (ns, "lo")):
            sh("ip", "-n", n, "link", "set", dev, "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", out.node4)
        sh("ip", "-n", ns, "-6", "route", "add", "default", "via", out.node6)
        return out

    def remove_outside(self, out: Outside) -> None:
        sh("ip", "-n", self.netns, "link", "del", out.iface, check=False)
        nsmod.delete(out.netns)
        if out.netns in self._extra_netns:
            self._extra_netns.remove(out.netns)

    def remove_workload(self, name: str) -> None:
        wl = self.workloads.pop(name)
        # Deleting a namespace only schedules its cleanup (and a socket still open in it delays
        # that): delete the veth pair from the node side now, so the name is free at once.
        sh("ip", "-n", self.netns, "link", "del", wl.iface, check=False)
        nsmod.delete(wl.netns)
        self._extra_netns.remove(wl.netns)

    def delete(self) -> None:
        """Delete every namespace of the node; one that cannot go does not stop the others."""
        failed: list[str] = []
        for ns in [*self._extra_netns, self.netns]:
            try:
                nsmod.delete(ns)
            except RuntimeError as e:
                failed.append(str(e))
        self._extra_netns.clear()
        self.workloads.clear()
        if failed:
            raise RuntimeError("; ".join(failed))


@contextlib.contextmanager
def node(prefix: str = "fpyn") -> Iterator[Node]:
    n = Node.create(prefix)
    try:
        yield n
    finally:
        n.delete()
