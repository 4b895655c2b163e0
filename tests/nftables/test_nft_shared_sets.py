"""A written set's dataplane view shares the desired member set (issue #17, memory): pinned that the shared object
is never mutated in place, so a later member change is still seen as a delta against what the kernel holds."""

from __future__ import annotations

from collections.abc import Callable

import nft_helpers as hp
from nft_helpers import Harness, program_typical

from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.nftables.fake import FakeNft


def test_written_set_shares_members_and_changes_replace_them(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = make(fake)
    program_typical(h)
    h.root.apply()
    name = "cali40s-hosts"
    shared = h.root._dp_sets[name].members
    assert shared is h.root.get_desired_members("s:hosts")          # one object, not a copy
    before = frozenset(shared)
    h.root.add_members("s:hosts", [h.addr(9)])
    h.root.remove_members("s:hosts", [h.addr(1)])
    assert shared == before                                         # never mutated in place ...
    assert h.root._dp_sets[name].members is shared                  # ... the kernel view is still the old one
    runs = fake.run_calls
    h.root.apply()
    assert fake.run_calls == runs + 1
    assert hp.sets(fake, 4)[name] == {h.addr(2), h.addr(9)}         # the delta went out
    assert h.root._dp_sets[name].members is h.root.get_desired_members("s:hosts")
    h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", IPSetType.HASH_IP), [h.addr(3)])
    h.root.apply()
    assert hp.sets(fake, 4)[name] == {h.addr(3)}
    h.root.apply()
    assert fake.run_calls == runs + 2                               # and then nothing more to write
