"""A connectivity checker: real TCP, UDP and ICMP probes between namespaces, in parallel.

Servers are sockets *created inside* each workload's namespace (a socket keeps
the namespace it was born in) and served from threads of this process; probes
likewise create their socket inside the source namespace.  ICMP uses ``ping``.
``matrix()`` runs every probe concurrently with short timeouts and returns
``{(src, dst): bool}``; :func:`diff` renders expected-vs-actual for assertions.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from felixpy.testing import netns as nsmod

DEFAULT_TCP_PORTS = (8080, 8081, 9090)
DEFAULT_UDP_PORTS = (5353,)


@dataclass(frozen=True)
class Endpoint:
    """Something that can send or receive probes: a namespace and its addresses."""

    name: str
    netns: str
    ipv4: str
    ipv6: str

    def ip(self, version: int) -> str:
        return self.ipv4 if version == 4 else self.ipv6


class Servers:
    """TCP/UDP echo servers inside a set of namespaces."""

    def __init__(self) -> None:
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()

    def start(self, netns: str, tcp_ports: Iterable[int] = DEFAULT_TCP_PORTS,
              udp_ports: Iterable[int] = DEFAULT_UDP_PORTS) -> None:
        with nsmod.entered(netns):
            for family in (socket.AF_INET, socket.AF_INET6):
                any_addr = "0.0.0.0" if family == socket.AF_INET else "::"
                for port in tcp_ports:
                    s = socket.socket(family, socket.SOCK_STREAM)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    if family == socket.AF_INET6:
                        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    s.bind((any_addr, port))
                    s.listen(64)
                    self._serve(s, self._tcp_loop)
                for port in udp_ports:
                    s = socket.socket(family, socket.SOCK_DGRAM)
                    if family == socket.AF_INET6:
                        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    s.bind((any_addr, port))
                    self._serve(s, self._udp_loop)

    def _serve(self, s: socket.socket, loop: object) -> None:
        s.settimeout(0.2)
        self._socks.append(s)
        threading.Thread(target=loop, args=(s,), daemon=True).start()

    def _tcp_loop(self, s: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = s.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                data = conn.recv(64)
                conn.sendall(data)

    def _udp_loop(self, s: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data, addr = s.recvfrom(64)
            except TimeoutError:
                continue
            except OSError:
                return
            with contextlib.suppress(OSError):
                s.sendto(data, addr)

    def stop(self) -> None:
        self._stop.set()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()


def probe(src_netns: str, dst_ip: str, proto: str, port: int = 0, timeout: float = 0.6) -> bool:
    """One probe; True if the echo (or ping reply) came back."""
    family = socket.AF_INET6 if ":" in dst_ip else socket.AF_INET
    if proto == "icmp":
        cmd = ["ip", "netns", "exec", src_netns, "ping", "-c1", "-q", "-W", str(max(1, round(timeout))), dst_ip]
        return subprocess.run(cmd, capture_output=True, timeout=timeout + 5).returncode == 0
    with nsmod.entered(src_netns):
        s = socket.socket(family, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    try:
        s.settimeout(timeout)
        if proto == "tcp":
            s.connect((dst_ip, port))
            s.sendall(b"felixpy")
            return s.recv(64) == b"felixpy"
        s.sendto(b"felixpy", (dst_ip, port))
        return s.recvfrom(64)[0] == b"felixpy"
    except OSError:
        return False
    finally:
        s.close()


_pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="probe")


def matrix(sources: Iterable[Endpoint], targets: Iterable[Endpoint], proto: str, port: int = 0,
           version: int = 4, timeout: float = 0.6) -> dict[tuple[str, str], bool]:
    """Probe every (src, dst) pair with src ≠ dst, all in parallel."""
    targets = list(targets)
    futs = {}
    for s in sources:
        for t in targets:
            if s.name == t.name:
                continue
            futs[(s.name, t.name)] = _pool.submit(probe, s.netns, t.ip(version), proto, port, timeout)
    return {k: f.result() for k, f in futs.items()}


def diff(expected: Mapping[tuple[str, str], bool], actual: Mapping[tuple[str, str], bool]) -> str:
    """A readable table of mismatches ('' if none)."""
    lines = [f"  {s} -> {d}: expected {'pass' if e else 'blocked'}, got {'pass' if actual.get((s, d)) else 'blocked'}"
             for (s, d), e in sorted(expected.items()) if actual.get((s, d)) != e]
    return "\n".join(lines)


def render(m: Mapping[tuple[str, str], bool]) -> str:
    """The matrix as a small table, for demos and failure messages."""
    srcs = sorted({s for s, _ in m})
    dsts = sorted({d for _, d in m})
    width = max([len(x) for x in srcs + dsts] + [4])
    out = [" " * (width + 2) + " ".join(d.rjust(width) for d in dsts)]
    for s in srcs:
        cells = [("-" if s == d else ("pass" if m.get((s, d)) else "drop")).rjust(width) for d in dsts]
        out.append(s.rjust(width) + "  " + " ".join(cells))
    return "\n".join(out)
