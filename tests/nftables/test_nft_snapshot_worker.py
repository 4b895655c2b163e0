"""Listings parsed in a child process (``nftables/snapshotworker.py``): the daemon's tables read the
kernel back through ``NftChildProcess(parse_in_child=True).snapshot``, and what they get must be exactly
what listing and parsing in the daemon gives — chains (base specs, rule hashes in order), sets (kinds,
members), verdict maps, foreign objects — for the whole table and for its sets alone; a missing table
is None; nft's own failure arrives as the same ``NftError``."""

from __future__ import annotations

import base64
import copy
import json
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from felixpy.drivers import drift
from felixpy.drivers.cmdshim import CommandResult
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.nftables.packed import PackedMembers
from felixpy.drivers.nftables.readback import TableSnapshot, parse_table, snapshot_from_wire, snapshot_to_wire
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


def _with_a_range(make: Callable[..., Harness], fake: FakeNft) -> TableSnapshot:
    """The typical table, with a range (a shape we never write) added to an interval set behind our back."""
    h = make(fake)
    program_typical(h)
    h.root.apply()
    fake.run([{"add": {"element": {**hp.tbl(4), "name": "cali40s-web", "elem": [{"range": ["10.9.0.1", "10.9.0.9"]}]}}}])
    objs = fake.list_table("ip", "calico")
    assert objs is not None
    return parse_table(objs, 4)


def test_the_wire_carries_packed_members_as_one_string_and_other_members_as_strings(
        make: Callable[..., Harness], fake: FakeNft) -> None:
    snap = _with_a_range(make, fake)
    wire = json.loads(json.dumps(snapshot_to_wire(snap)))
    hosts, web = wire["sets"]["cali40s-hosts"][1], wire["sets"]["cali40s-web"][1]
    assert isinstance(hosts, str) and base64.b64decode(hosts) == socket.inet_aton("10.0.0.1") + socket.inet_aton("10.0.0.2")
    assert web == ["10.0.0.5", "10.1.0.0/16", "10.9.0.1-10.9.0.9"]
    back = snapshot_from_wire(wire)
    assert back == snap
    assert isinstance(back.sets["cali40s-hosts"].members, PackedMembers)
    assert isinstance(back.sets["cali40n-ports"].members, PackedMembers)
    assert back.sets["cali40s-web"].members == {"10.0.0.5", "10.1.0.0/16", "10.9.0.1-10.9.0.9"}


def _set_members(wire: dict[str, Any], name: str, members: Any) -> dict[str, Any]:
    out = copy.deepcopy(wire)
    out["sets"][name][1] = members
    return out


def test_an_old_or_torn_wire_form_is_refused_and_the_shim_says_so(make: Callable[..., Harness],
                                                                    fake: FakeNft) -> None:
    wire = snapshot_to_wire(_with_a_range(make, fake))
    old = {k: v for k, v in _set_members(wire, "cali40s-hosts", ["10.0.0.1", "10.0.0.2"]).items() if k != "form"}
    hosts = wire["sets"]["cali40s-hosts"][1]
    bad = [old, {**wire, "form": 3},
           _set_members(wire, "cali40s-hosts", hosts[:-3]),          # torn: not base64
           _set_members(wire, "cali40s-hosts", base64.b64encode(b"\x0a\x00\x00\x01\x0a").decode()),  # not whole keys
           _set_members(wire, "cali40s-hosts", 7)]
    s4 = copy.deepcopy(wire)
    s4["sets"]["x"] = [None, hosts, 0]                                 # packed members for a kind we never write
    for form in [*bad, s4]:
        with pytest.raises((ValueError, KeyError, TypeError)):
            snapshot_from_wire(json.loads(json.dumps(form)))
        printed = json.dumps(form)
        shim = NftChildProcess(_Printing(printed), parse_in_child=True)
        with pytest.raises(NftError, match="the listing worker printed what it should not"):
            shim.snapshot("table", "ip", "calico", 4)
    assert NftChildProcess(_Printing(json.dumps(wire)), parse_in_child=True).snapshot("table", "ip", "calico", 4)


class _Printing:
    """A runner whose every child prints *out*: the listing worker's report, as the daemon reads it."""

    def __init__(self, out: str) -> None:
        self.out = out

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        return CommandResult(0, self.out, "", tuple(argv))


class _CountingChild(NftChildProcess):
    """The daemon's shim (listings parsed in the snapshot worker), counting the transactions it runs."""

    runs = 0

    def run(self, commands: Sequence[dict[str, Any]]) -> None:
        self.runs += 1
        super().run(commands)

    def run_script(self, script: str) -> None:
        self.runs += 1
        super().run_script(script)


def _program(h: Harness) -> None:
    program_typical(h)
    covered = "10.8.1.1" if h.ip_version == 4 else "fd08::1"     # inside h.net(8)
    h.root.add_or_replace_ip_set(IPSetMetadata("s:nets", IPSetType.HASH_NET), [h.net(8), covered, h.net(9)])


@pytest.mark.parametrize("v", [4, 6])
def test_a_restart_read_through_the_worker_rewrites_nothing_and_finds_member_drift(
        in_netns: str, make: Callable[..., Harness], v: int) -> None:
    """Against a kernel holding exactly the desired sets (a covered net left out of an interval set, as
    written) a restart writes nothing, and its view of the sets is the desired members themselves, not
    the listing's copy; members changed behind its back are found, counted as drift and repaired, a
    foreign range among them."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    assert hp.inside_netns(in_netns), "refusing to touch nftables outside the throwaway namespace"
    first = make(NftChildProcess(), v)
    _program(first)
    first.root.apply()
    good = hp.sets(first.shim, v)
    assert len(good[f"cali{v}0s-nets"]) == 2

    shim = _CountingChild(parse_in_child=True)
    h = make(shim, v)
    _program(h)
    h.root.apply()
    assert shim.runs == 0
    dp = h.root._dp_sets
    assert dp and all(isinstance(s.members, PackedMembers) for s in dp.values())
    assert dp[f"cali{v}0s-hosts"].members is h.root.get_desired_members("s:hosts")

    far = ["10.7.0.1", "10.7.0.9"] if v == 4 else ["fd07::1", "fd07::9"]
    shim.run([{"delete": {"element": {**hp.tbl(v), "name": f"cali{v}0s-hosts", "elem": [h.addr(1)]}}},
              {"add": {"element": {**hp.tbl(v), "name": f"cali{v}0s-hosts", "elem": [h.addr(99)]}}},
              {"add": {"element": {**hp.tbl(v), "name": f"cali{v}0s-nets", "elem": [{"range": far}]}}}])
    before = drift.count("set_member")
    h.clock.advance(181)
    h.root.apply()
    assert drift.count("set_member") - before == 3
    assert hp.sets(shim, v) == good
    runs = shim.runs
    h.clock.advance(181)
    h.root.apply()
    assert shim.runs == runs
