"""A connectivity checker: real TCP, UDP and ICMP probes between namespaces, in parallel.

Servers are sockets *created inside* each workload's namespace (a socket keeps
the namespace it was born in) and served from threads of this process; probes
likewise create their socket inside the source namespace.  ICMP uses ``ping``.
``matrix()`` runs every probe concurrently with short timeouts and returns
``{(src, dst): bool}``; :func:`matrices` does the same for several probes
(protocol + port) at once, keyed ``(probe, src, dst)``; :func:`diff` renders
expected-vs-actual for assertions.  :class:`Connection` holds one TCP
connection open (the echo servers serve a connection until the peer closes it),
for checks that an *established* flow survives something.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from felixpy.testing import netns as nsmod

K = TypeVar("K")

DEFAULT_TCP_PORTS = (8080, 8081, 9090)
DEFAULT_UDP_PORTS = (5353,)
ESTABLISHED_IDLE = 60.0  # how long a server keeps an idle connection open


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

    def _serve(self, s: socket.socket, loop: Callable[[socket.socket], None]) -> None:
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
        # Echo until the peer closes: probes close after one exchange, a held
        # :class:`Connection` keeps using the same flow.
        with conn:
            conn.settimeout(ESTABLISHED_IDLE)
            with contextlib.suppress(OSError):
                while data := conn.recv(256):
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
        # iputils ping takes a fractional -W.
        cmd = ["ip", "netns", "exec", src_netns, "ping", "-c1", "-q", "-W", f"{timeout:g}", dst_ip]
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


_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="probe")


@dataclass(frozen=True, order=True)
class Probe:
    """What to send: ``tcp``/``udp`` to a port, or an ICMP echo (``port`` 0)."""

    proto: str
    port: int = 0

    def __str__(self) -> str:
        return f"{self.proto}:{self.port}" if self.port else self.proto


def probe_all(jobs: Mapping[K, tuple[str, str, Probe]], timeout: float = 0.5) -> dict[K, bool]:
    """Run ``{key: (src_netns, dst_ip, probe)}`` all at once; ``{key: got through}``."""
    futs = {k: _pool.submit(probe, ns, ip, p.proto, p.port, timeout) for k, (ns, ip, p) in jobs.items()}
    return {k: f.result() for k, f in futs.items()}


def matrices(endpoints: Sequence[Endpoint], probes: Iterable[Probe], version: int = 4,
             timeout: float = 0.5) -> dict[tuple[Probe, str, str], bool]:
    """Every probe between every ordered pair of distinct endpoints, all at once."""
    return probe_all({(p, s.name, t.name): (s.netns, t.ip(version), p)
                      for p in probes for s in endpoints for t in endpoints if s.name != t.name}, timeout)


class Connection:
    """One TCP connection from a namespace to an echo server, kept open across checks."""

    def __init__(self, src_netns: str, dst_ip: str, port: int, timeout: float = 2.0) -> None:
        family = socket.AF_INET6 if ":" in dst_ip else socket.AF_INET
        with nsmod.entered(src_netns):
            self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect((dst_ip, port))
        except OSError:
            self.sock.close()
            raise
        self.local = self.sock.getsockname()
        self._n = 0

    def exchange(self) -> bool:
        """Send a fresh payload and read its echo; False if the flow no longer works."""
        self._n += 1
        payload = f"felixpy-{self._n}".encode()
        try:
            self.sock.sendall(payload)
            got = b""
            while len(got) < len(payload):
                chunk = self.sock.recv(len(payload) - len(got))
                if not chunk:
                    return False
                got += chunk
            return got == payload
        except OSError:
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


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
