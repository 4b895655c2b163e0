"""Set members written from their packed keys (issue #17): a start of day's 200,000 members become nft text
a set at a time as the script is consumed, never one JSON element each, and the script says exactly what
the JSON elements said (same text, so the kernel gets the same transaction)."""

from __future__ import annotations

import tracemalloc

import pytest

from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.nftables.members import codec_for, element_json
from felixpy.drivers.nftables.packed import pack_members
from felixpy.drivers.nftables.script import (ElementsCmd, _elem_text, command_text, script_lines, to_json,
                                             to_script)
from felixpy.drivers.nftables.sets import NftSets

MEMBERS = {
    (IPSetType.HASH_IP, 4): ["10.0.0.1", "10.0.0.2/32", "192.168.1.255"],
    (IPSetType.HASH_IP, 6): ["fd00::1", "fd00::2/128", "2001:db8::ff"],
    (IPSetType.HASH_NET, 4): ["10.0.0.0/8", "10.1.2.3/32", "172.16.0.0/12", "192.168.5.7"],
    (IPSetType.HASH_NET, 6): ["fd00::/64", "fe80::1/128", "2001:db8::/32"],
    (IPSetType.HASH_IP_PORT, 4): ["10.0.0.1,tcp:80", "10.0.0.2,udp:53", "10.0.0.3,sctp:9", "10.0.0.4,47:0",
                                  "10.0.0.5,icmp:1", "10.0.0.6,udplite:65535"],
    (IPSetType.HASH_IP_PORT, 6): ["fd00::1,tcp:443", "fd00::2,58:7", "fd00::3,ipv6-icmp:2"],
}


@pytest.mark.parametrize("set_type,v", list(MEMBERS))
def test_packed_members_as_text_say_what_their_json_elements_say(set_type: IPSetType, v: int) -> None:
    codec = codec_for(set_type, v)
    packed, bad = pack_members(codec, MEMBERS[set_type, v])
    assert not bad and len(packed) == len(MEMBERS[set_type, v])
    fam = "ip" if v == 4 else "ip6"
    for verb in ("add", "delete"):
        cmd = ElementsCmd(verb, fam, "calico", "s", packed)
        as_json = cmd.to_json()
        assert as_json == {verb: {"element": {"family": fam, "table": "calico", "name": "s",
                                              "elem": [element_json(m) for m in packed]}}}
        # The line form is what command_text writes for the JSON command; the block form's elements are the
        # same texts.
        assert cmd.to_text() == command_text(as_json)
        assert list(cmd.texts()) == [_elem_text(e) for e in as_json[verb]["element"]["elem"]]
        # Members that are not packed (a listing's strings) are written the same way.
        plain = ElementsCmd(verb, fam, "calico", "s", frozenset(packed))
        assert sorted(plain.texts()) == sorted(cmd.texts())
        assert to_json([plain], v, False) == [{verb: {"element": {**as_json[verb]["element"],
                                                                  "elem": [element_json(m) for m in plain.members]}}}]


def _start_of_day(v: int, sets: int, per_set: int) -> NftSets:
    s = NftSets(v)
    k = 0
    for j in range(sets):
        if v == 4:
            members = [f"10.{128 + (i >> 16) % 128}.{(i >> 8) & 255}.{i & 255}/32" for i in range(k, k + per_set)]
        else:
            members = [f"fd00::{i:x}/128" for i in range(k, k + per_set)]
        s.add_or_replace(IPSetMetadata(f"s:set-{j}", IPSetType.HASH_NET), members)
        k += per_set
    return s


def _as_json_elements(cmds: list[object]) -> list[object]:
    """The plan as it was written before ElementsCmd: each element command a JSON dict."""
    return [c.to_json() if isinstance(c, ElementsCmd) else c for c in cmds]


@pytest.mark.parametrize("v", [4, 6])
@pytest.mark.parametrize("blocks", [True, False])
def test_a_start_of_day_script_is_the_one_its_json_elements_made(v: int, blocks: bool) -> None:
    sets = _start_of_day(v, 1200, 3)
    plan = sets.plan({}, False, lambda _n: True)
    # Every set's members travel as its desired packed members, shared, never copied into elements.
    elements = [c for c in plan.create if isinstance(c, ElementsCmd)]
    assert len(elements) == 1200
    assert all(c.members is plan.written[c.name].members for c in elements)
    cmds = [{"add": {"table": {"family": "ip" if v == 4 else "ip6", "name": "calico"}}}, *plan.create]
    script = to_script(cmds, v, False, blocks=blocks)
    assert script == to_script(_as_json_elements(cmds), v, False, blocks=blocks)  # type: ignore[arg-type]
    assert "\n".join(script_lines(cmds, v, False, blocks=blocks)) + "\n" == script


def test_member_deltas_are_written_as_their_json_elements_said() -> None:
    sets = _start_of_day(4, 3, 50)
    plan = sets.plan({}, False, lambda _n: True)
    sets.commit(plan, False)
    view = dict(plan.written)
    sets.add_members("s:set-1", ["10.250.0.1", "10.250.0.2"])
    sets.remove_members("s:set-1", ["10.128.0.60", "10.128.0.61"])
    delta = sets.plan(view, False, lambda _n: True)
    assert [(c.verb, c.name, sorted(c.members)) for c in delta.create if isinstance(c, ElementsCmd)] == [
        ("delete", "cali40s-set-1", ["10.128.0.60", "10.128.0.61"]),
        ("add", "cali40s-set-1", ["10.250.0.1", "10.250.0.2"])]
    assert to_script(delta.create, 4, False) == \
        to_script(_as_json_elements(delta.create), 4, False)  # type: ignore[arg-type]


def test_a_start_of_days_members_are_never_all_held_as_text() -> None:
    """200,000 members (the large node's): planning them and writing the script line by line holds a set's
    text at a time.  As JSON elements they held ~15 MiB, and the joined script ~6 MiB more."""
    sets = _start_of_day(4, 1000, 200)
    tracemalloc.start()
    try:
        plan = sets.plan({}, False, lambda _n: True)
        cmds = [{"add": {"table": {"family": "ip", "name": "calico"}}}, *plan.create]
        written = sum(len(line) + 1 for line in script_lines(cmds, 4, False))
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert written > 2_500_000             # 200,000 addresses were written
    assert peak < 2 << 20, f"{peak / 2**20:.1f} MiB"   # the plan itself: ~0.75 MiB for 1,000 sets
