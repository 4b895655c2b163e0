from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from felixpy.testing import netns as _netns

# The suite asserts behaviour, never timing: hypothesis' per-example deadline (200 ms) is a timed
# assertion, and on a loaded 2-core CI machine it failed a correct property (286 ms for one example).
settings.register_profile("felixpy", deadline=None)
settings.load_profile("felixpy")

# No test writes the machine's BPF compile cache (/var/lib/felixpy/bpf); the cache's own tests
# pass a temporary directory.
os.environ.setdefault("FELIXPY_BPF_CACHE_DIR", "")


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh network namespace, deleted after the test (also on failure)."""
    with _netns.netns("fpyt") as name:
        yield name


@pytest.fixture
def in_netns(netns: str) -> Iterator[str]:
    """As ``netns``, with the test's thread moved inside it for the test body."""
    with _netns.entered(netns):
        yield netns
