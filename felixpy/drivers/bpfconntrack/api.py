"""What the BPF managers ask of the conntrack scanner, and the timeouts it applies.

:class:`ConntrackTimeouts` is Felix's ``BPFConntrackTimeouts`` (``felix/bpf/conntrack/timeouts``):
per protocol and TCP state, how long an entry may go unseen before the scanner deletes it.
:meth:`BPFConntrackAPI.forget_addresses` is how the manager says a workload's addresses went
away: the next scan deletes every entry with one of them at either end (a new workload that
reuses the address must not inherit its flows).  Nothing here touches the kernel.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Protocol

_S = 1_000_000_000

# Felix's linuxSysctls: the timeouts "Auto" reads from /proc/sys/net/netfilter/.
AUTO_SYSCTLS: Mapping[str, str] = {
    "TCPSynSent": "nf_conntrack_tcp_timeout_syn_sent",
    "TCPEstablished": "nf_conntrack_tcp_timeout_established",
    "TCPFinsSeen": "nf_conntrack_tcp_timeout_time_wait",
    "GenericTimeout": "nf_conntrack_generic_timeout",
    "ICMPTimeout": "nf_conntrack_icmp_timeout",
}


@dataclass(frozen=True, slots=True)
class ConntrackTimeouts:
    """Nanoseconds, Felix's defaults (``timeouts.DefaultTimeouts``)."""

    CreationGracePeriod: int = 10 * _S
    TCPSynSent: int = 20 * _S
    TCPEstablished: int = 3600 * _S
    TCPFinsSeen: int = 30 * _S
    TCPResetSeen: int = 40 * _S
    UDPTimeout: int = 60 * _S
    GenericTimeout: int = 600 * _S
    ICMPTimeout: int = 5 * _S


TIMEOUT_NAMES = tuple(f.name for f in fields(ConntrackTimeouts))
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": _S, "m": 60 * _S, "h": 3600 * _S}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_go_duration(raw: str) -> int:
    """A Go ``time.ParseDuration`` string (``1h``, ``1m30s``, ``500ms``, ``0``) in nanoseconds."""
    s = raw.strip()
    if s == "0":
        return 0
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DURATION.match(s, pos)
        if not m:
            raise ValueError(f"not a duration: {raw!r}")
        total += float(m.group(1)) * _UNIT_NS[m.group(2)]
        pos = m.end()
    if not s:
        raise ValueError("empty duration")
    return int(total)


def parse_timeouts_setting(raw: str) -> tuple[tuple[str, str], ...]:
    """``Name=value,...`` (Felix's ``BPFConntrackTimeouts`` syntax), validated: each name is one
    of :data:`TIMEOUT_NAMES`, each value a duration or ``Auto`` (only where Felix has a sysctl)."""
    out: list[tuple[str, str]] = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in TIMEOUT_NAMES:
            raise ValueError(f"bad entry {part!r}: expected one of {', '.join(TIMEOUT_NAMES)} = duration")
        if value != "Auto":
            parse_go_duration(value)
        out.append((name, value))
    return tuple(out)


def resolve_timeouts(setting: Iterable[tuple[str, str]],
                     read_sysctl: Callable[[str], str | None] | None = None) -> ConntrackTimeouts:
    """The effective timeouts: defaults, overridden by *setting*; ``Auto`` reads the Linux
    conntrack sysctl via *read_sysctl(name) -> str | None* and keeps the default when that fails."""
    values = {f: getattr(ConntrackTimeouts(), f) for f in TIMEOUT_NAMES}
    for name, value in setting:
        if value == "Auto":
            sysctl = AUTO_SYSCTLS.get(name)
            text = read_sysctl(sysctl) if (sysctl and read_sysctl is not None) else None
            try:
                values[name] = int(str(text).strip()) * _S
            except (TypeError, ValueError):
                pass  # Felix: "Not a valid BPF conntrack timeout value, using default"
            continue
        values[name] = parse_go_duration(value)
    return ConntrackTimeouts(**values)


class BPFConntrackAPI(Protocol):
    ip_version: int

    def forget_addresses(self, addrs: Iterable[str]) -> None:
        """Entries with any of *addrs* (this family) at either end go at the next scan."""
