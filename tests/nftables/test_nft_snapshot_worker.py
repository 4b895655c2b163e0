"""Listings parsed in a child process (``nftables/snapshotworker.py``): the daemon's tables read the
kernel back through ``NftChildProcess(parse_in_child=True).snapshot``, and what they get must be exactly
what listing and parsing in the daemon gives — chains (base specs, rule hashes in order), sets (kinds,
members), verdict maps, foreign objects — for the whole table and for its sets alone; a missing table
is None; nft's own failure arrives as the same ``NftError``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from felixpy.drivers.nftables.readback import parse_table, snapshot_from_wire, snapshot_to_wire
from felixpy.drivers.nftables.shim import NftChildProcess, NftError, read_snapshot
from felixpy.drivers.nftables.fake import FakeNft

import nft_helpers as hp
from nft_helpers import Harness, program_typical


@pytest.mark.parametrize("v", [4, 6])
def test_wire_form_round_trips_a_snapshot(make: Callable[..., Harness], fake: FakeNft, v: int) -> None:
    h = make(fake, ip_version=v)
    program_typical(h)
    h.root.apply()
    objs = fake.list_table(hp.family(h.ip_version), "calico")
    assert objs is not None
    snap = parse_table(objs, h.ip_version)
    assert snap.chains and snap.sets and snap.maps  # else the round trip proves little
    back = snapshot_from_wire(json.loads(json.dumps(snapshot_to_wire(snap))))
    assert back == snap


def test_read_snapshot_over_a_shim_without_snapshot_lists_and_parses(make: Callable[..., Harness],
                                                                     fake: FakeNft) -> None:
    h = make(fake)
    program_typical(h)
    h.root.apply()
    objs = fake.list_table("ip", "calico")
    assert objs is not None
    assert read_snapshot(fake, "table", "ip", "calico", 4) == parse_table(objs, 4)
    assert read_snapshot(fake, "table", "ip", "no-such-table", 4) is None


def test_the_child_parses_what_the_daemon_would(in_netns: str, make: Callable[..., Harness]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    assert hp.inside_netns(in_netns), "refusing to touch nftables outside the throwaway namespace"
    here, child = NftChildProcess(), NftChildProcess(parse_in_child=True)
    assert child.snapshot("table", "ip", "calico", 4) is None  # nothing programmed yet
    h = make(here)
    program_typical(h)
    h.root.apply()
    here.run([{"add": {"counter": {"family": "ip", "table": "calico", "name": "foreign"}}}])
    for kind in ("table", "sets"):
        want = here.snapshot(kind, "ip", "calico", 4)
        got = child.snapshot(kind, "ip", "calico", 4)
        assert want is not None and got == want, kind
    table = child.snapshot("table", "ip", "calico", 4)
    assert table is not None and ("counter", "foreign") in table.others and table.num_rules > 0
    with pytest.raises(NftError) as err:
        child.snapshot("table", "no-such-family", "calico", 4)
    assert err.value.returncode != 0 and err.value.stderr
