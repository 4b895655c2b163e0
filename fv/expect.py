"""Expected connectivity, and the probes FV tests send (all served by conncheck's echo servers)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from felixpy.testing import conncheck as cc

TCP = cc.Probe("tcp", 8080)
TCP_8081 = cc.Probe("tcp", 8081)
TCP_9090 = cc.Probe("tcp", 9090)
UDP = cc.Probe("udp", 5353)
ICMP = cc.Probe("icmp")

Selector = str | Iterable[str] | Iterable[cc.Probe] | cc.Probe | None


def _matches(sel: Any, value: Any) -> bool:
    if sel is None:
        return True
    if isinstance(sel, (str, cc.Probe)):
        return bool(sel == value)
    return value in set(sel)


@dataclass
class Expect:
    """Expected connectivity: a default verdict and overrides, the last matching one wins.

    ``Expect(True).block(dst="b").allow(src="a", dst="b")`` — everything passes
    except traffic to b, which passes only from a.  ``None`` matches anything.
    """

    default: bool = True
    rules: list[tuple[Any, Any, Any, bool]] = field(default_factory=list)

    def allow(self, src: Selector = None, dst: Selector = None, probe: Selector = None) -> Expect:
        self.rules.append((src, dst, probe, True))
        return self

    def block(self, src: Selector = None, dst: Selector = None, probe: Selector = None) -> Expect:
        self.rules.append((src, dst, probe, False))
        return self

    def __call__(self, probe: cc.Probe, src: str, dst: str) -> bool:
        verdict = self.default
        for s, d, p, v in self.rules:
            if _matches(s, src) and _matches(d, dst) and _matches(p, probe):
                verdict = v
        return verdict
