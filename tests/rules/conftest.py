"""Shared helpers for the rules tests: configs, renderers and proto builders."""

from __future__ import annotations

from typing import Any

import pytest

from felixpy.config import Config
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import RendererOptions, RuleRenderer

# Default-mask marks (Felix's documented allocation).
A, P, DROP, S0, S1 = 0x10000, 0x20000, 0x40000, 0x80000, 0x100000


def renderer(ip_version: int = 4, options: RendererOptions | None = None, **cfg: Any) -> RuleRenderer:
    return RuleRenderer(Config(**cfg), ip_version, options=options)


def rule(**kw: Any) -> pb.Rule:
    """A proto Rule; ``protocol="tcp"``/``protocol=6`` and port tuples are accepted for brevity."""
    for key in ("protocol", "not_protocol"):
        if key in kw and not isinstance(kw[key], pb.Protocol):
            v = kw[key]
            kw[key] = pb.Protocol(number=v) if isinstance(v, int) else pb.Protocol(name=v)
    for key in ("src_ports", "dst_ports", "not_src_ports", "not_dst_ports"):
        if key in kw:
            kw[key] = [p if isinstance(p, pb.PortRange) else
                       pb.PortRange(first=p[0], last=p[1]) if isinstance(p, tuple) else pb.PortRange(first=p, last=p)
                       for p in kw[key]]
    return pb.Rule(**kw)


@pytest.fixture
def r4() -> RuleRenderer:
    return renderer(4)


@pytest.fixture
def r6() -> RuleRenderer:
    return renderer(6)
