"""The IP-set refresh re-reads the sets only (issue #17): a rule change that meets the 90 s IP-set timer must
not wait for a listing of every chain.  Pinned on the stateful fake and on the kernel (both shims)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import nft_helpers as hp
from nft_helpers import Harness, program_typical

from felixpy.drivers.generictables.model import Accept, Chain, Match, Rule
from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.nftables.shim import NftSetsShim, NftShim

T = {"family": "ip", "table": "calico"}


def _prog(make: Callable[..., Harness], shim: NftShim, v: int = 4) -> Harness:
    h = make(shim, v)
    program_typical(h)
    h.root.apply()
    return h


def test_set_resync_lists_sets_not_chains_and_repairs_set_drift(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake)
    good = hp.sets(fake, 4)
    fake.run([{"delete": {"element": {**T, "name": "cali40s-hosts", "elem": ["10.0.0.1"]}}},
              {"flush": {"chain": {**T, "name": "filter-cali-INPUT"}}}])      # set drift + chain drift
    full_lists, set_lists = fake.list_calls, fake.set_list_calls
    h.root.queue_resync()
    h.filter.update_chain(Chain("cali-new", (Rule(Match(), Accept()),)))
    h.root.apply()
    assert fake.list_calls == full_lists and fake.set_list_calls == set_lists + 1
    assert hp.sets(fake, 4) == good                              # the set is repaired …
    assert hp.chains(fake, 4)["filter-cali-INPUT"]["rules"] == []   # … the chain waits for the table's refresh
    h.clock.advance(181)
    full_lists = fake.list_calls
    h.root.apply()
    assert fake.list_calls == full_lists + 1 and len(hp.chains(fake, 4)["filter-cali-INPUT"]["rules"]) == 4


def test_set_resync_with_the_table_gone_rereads_everything(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake)
    good_chains, good_sets = hp.chains(fake, 4), hp.sets(fake, 4)
    fake.run([{"delete": {"table": {"family": "ip", "name": "calico"}}}])
    lists = fake.list_calls
    h.root.queue_resync()
    h.root.apply()
    assert fake.list_calls == lists + 1
    assert set(hp.chains(fake, 4)) == set(good_chains) and hp.sets(fake, 4) == good_sets


def test_set_resync_in_sync_writes_nothing(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake)
    runs = fake.run_calls
    h.root.queue_resync()
    h.root.apply()
    assert fake.run_calls == runs


class _NoSetsShim:
    """A shim without ``list_sets``: the IP-set refresh falls back to a full re-read."""

    def __init__(self, inner: FakeNft) -> None:
        self.inner = inner

    def run(self, commands: Any) -> None:
        self.inner.run(commands)

    def list_table(self, family: str, name: str) -> Any:
        return self.inner.list_table(family, name)


def test_shim_without_list_sets_falls_back_to_full_reread(make: Callable[..., Harness], fake: FakeNft) -> None:
    shim = _NoSetsShim(fake)
    assert not isinstance(shim, NftSetsShim)
    h = _prog(make, shim)  # type: ignore[arg-type]
    lists = fake.list_calls
    h.root.queue_resync()
    h.root.apply()
    assert fake.list_calls == lists + 1 and fake.set_list_calls == 0


@pytest.mark.parametrize("v", [4, 6])
def test_kernel_set_resync_repairs_members(kernel_nft: NftShim, make: Callable[..., Harness], v: int) -> None:
    assert isinstance(kernel_nft, NftSetsShim)
    h = _prog(make, kernel_nft, v)
    good = hp.sets(kernel_nft, v)
    name = f"cali{v}0s-hosts"
    kernel_nft.run([{"delete": {"element": {**hp.tbl(v), "name": name, "elem": [h.addr(1)]}}}])
    assert hp.sets(kernel_nft, v) != good
    listed = kernel_nft.list_sets(hp.family(v), "calico")
    assert listed is not None and {o["set"]["name"] for o in listed} == set(good)
    assert kernel_nft.list_sets(hp.family(v), "no-such-table") is None
    h.root.queue_resync()
    h.root.apply()
    assert hp.sets(kernel_nft, v) == good
