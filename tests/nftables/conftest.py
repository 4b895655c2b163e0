from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nft_helpers import Harness, inside_netns

from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.nftables.shim import NftShim
from felixpy.testing.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake() -> FakeNft:
    return FakeNft()


@pytest.fixture
def make(clock: FakeClock) -> Callable[..., Harness]:
    def _make(shim: NftShim, ip_version: int = 4, **kw: Any) -> Harness:
        return Harness(ip_version, shim, clock, **kw)
    return _make


@pytest.fixture(params=["libnftables", "nft-child", "nft-worker"])
def kernel_nft(request: pytest.FixtureRequest, in_netns: str) -> Iterator[NftShim]:
    """A real shim — libnftables in this process, the ``nft`` binary as a child per call, or (the daemon's)
    small transactions through the long-lived worker and big ones per call — with this thread inside a
    throwaway network namespace (the children are forked from it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    assert inside_netns(in_netns), "refusing to touch nftables outside the throwaway namespace"
    from felixpy.drivers.nftables.shim import WORKER_BELOW_BYTES, LibNftables, NftChildProcess
    if request.param == "libnftables":
        yield LibNftables()
    elif request.param == "nft-child":
        yield NftChildProcess()
    else:
        shim = NftChildProcess(worker_below=WORKER_BELOW_BYTES)
        try:
            yield shim
            assert shim.worker is not None and shim.worker.transactions > 0, "the worker took no transaction"
        finally:
            shim.close()
