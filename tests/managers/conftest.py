from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    yield
    structlog.reset_defaults()
