from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from felixpy.config import Config

from .harness import Node


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    yield
    structlog.reset_defaults()


@pytest.fixture(params=[4, 6], ids=["v4", "v6"])
def v(request: pytest.FixtureRequest) -> int:
    """The IP family a test looks at."""
    return int(request.param)


@pytest.fixture
def node() -> Node:
    """A dual-stack node."""
    return Node(families=(4, 6), config=Config(Ipv6Support=True))
