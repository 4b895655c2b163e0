"""Pure tests of the policy IR's per-family view and of the policy source document, both of which a
policy change now takes from fast paths (a memoised ``for_family``, a field-name walk)."""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
import zlib

import pytest

from felixpy.bpf import defs
from felixpy.bpf.policy_ir import Action, Policy, PolicySet, Profile, Rule, Tier, ports
from felixpy.bpf import policyload
from felixpy.bpf.polsource import input_text, parse_source, recorded_parts, source_doc

DUAL = Rule(Action.ALLOW, src_nets=("10.0.0.0/8", "fd00::/64"), not_dst_nets=("192.168.0.0/16",),
            dst_ports=ports(80, (8000, 8080)), src_ip_sets=("s:a",), rule_id="r1")


def test_for_family_filters_each_family_whichever_is_asked_first() -> None:
    for order in ((False, True), (True, False)):
        got = {v6: DUAL.for_family(v6) for v6 in order}
        assert got[False] == dataclasses.replace(DUAL, src_nets=("10.0.0.0/8",))
        assert got[True] == dataclasses.replace(DUAL, src_nets=("fd00::/64",), not_dst_nets=())
        assert DUAL.for_family(False) == got[False] and DUAL.for_family(True) == got[True]  # again (memo)


def test_for_family_drops_rules_that_cannot_match_in_a_family() -> None:
    only_v4 = Rule(Action.DENY, dst_nets=("10.1.0.0/16",))
    assert only_v4.for_family(True) is None and only_v4.for_family(False) == only_v4
    assert Rule(ip_version=6).for_family(False) is None
    assert Rule(not_src_nets=("::/0",)).for_family(True) is None
    assert Rule(not_src_nets=("::/0",)).for_family(False) == Rule()
    # Equal values, equal answers: a rule equal to a memoised one is not confused with another.
    assert Rule(Action.DENY, dst_nets=("10.1.0.0/16",)).for_family(True) is None
    assert Rule(Action.DENY, dst_nets=("fd00::/8",)).for_family(True) is not None


RICH = PolicySet(
    tiers=(Tier("default", (Policy("default/p", (DUAL, Rule(Action.PASS)), staged=False),
                            Policy("default/staged", (Rule(Action.LOG),), staged=True)), Action.PASS),),
    profiles=(Profile("kns.default", (Rule(),)),),
    host_normal_tiers=(Tier("t", (Policy("h", (Rule(Action.DENY, icmp_type=8, icmp_code=0),)),)),),
    for_host_interface=True, suppress_normal_host_policy=False)


def _reference_plain(ps: PolicySet) -> object:
    """The document's policy_set as the plain dataclass walk gives it (asdict, enums as values)."""
    def enc(o: object) -> object:
        assert isinstance(o, enum.Enum)
        return o.value
    caches = {f.name for f in dataclasses.fields(ps) if not f.init}
    plain = {k: v for k, v in dataclasses.asdict(ps).items() if k not in caches}
    return json.loads(json.dumps(plain, default=enc))


def test_policy_set_caches_are_not_part_of_the_value() -> None:
    def make() -> PolicySet:
        return PolicySet(profiles=(Profile("p", (Rule(Action.ALLOW, src_ip_sets=("s:a",), dst_ip_sets=("s:b",)),)),))
    a, b = make(), make()
    assert repr(a) == repr(b) and "_hash" not in repr(a)  # program names hash the repr
    fresh = hash(b)
    a.ip_sets()
    assert hash(a) == fresh and a == b  # a's caches filled, b's hash only: still equal
    assert a.ip_sets() == frozenset({"s:a", "s:b"}) and a.ip_sets() is a.ip_sets()
    c = dataclasses.replace(a, for_host_interface=True)  # a changed copy computes its own
    assert c != a and c.ip_sets() == a.ip_sets()
    assert {a: 1}[b] == 1 and len({a, b, c}) == 2


def test_source_document_holds_every_field_of_the_policy_set_and_parses_back() -> None:
    ps = RICH
    blob = source_doc(ps, name="p4i_0123abcd", hook=defs.HOOK_TC_INGRESS, v6=False, ipset_ids={"s:a": 7})
    doc = json.loads(zlib.decompress(blob))
    assert doc["policy_set"] == _reference_plain(ps)
    assert doc["ip_set_ids"] == {"s:a": 7} and doc["program"] == "p4i_0123abcd"
    assert parse_source(blob).policy_set == ps


def test_a_source_is_recognised_only_for_its_generator_and_its_exact_input() -> None:
    """What a restart trusts instead of generating (``PolicyPrograms.adopt``): the document's input
    must equal, after its JSON round trip, what this process would write, and name this generator."""
    name, hook, ids = "p4i_0123abcd", defs.HOOK_TC_INGRESS, {"s:a": 7}
    blob = source_doc(RICH, name=name, hook=hook, v6=False, ipset_ids=ids, generator="g1",
                      insn_counts=[4000, 12], tags=[b"\x01" * 8, b"\x02" * 8])
    want = input_text(RICH, name=name, hook=hook, v6=False, ipset_ids=ids)
    assert recorded_parts(blob, want, "g1") == ([4000, 12], [b"\x01" * 8, b"\x02" * 8])
    assert recorded_parts(blob, want, "g2") is None  # another version's code
    assert recorded_parts(blob, want, "") is None  # no fingerprint: trust nothing
    assert recorded_parts(None, want, "g1") is None and recorded_parts(b"junk", want, "g1") is None
    for other in (input_text(RICH, name=name, hook=hook, v6=False, ipset_ids={"s:a": 8}),
                  input_text(RICH, name=name, hook=defs.HOOK_TC_EGRESS, v6=False, ipset_ids=ids),
                  input_text(RICH, name=name, hook=hook, v6=True, ipset_ids=ids),
                  input_text(dataclasses.replace(RICH, suppress_normal_host_policy=True), name=name, hook=hook,
                       v6=False, ipset_ids=ids)):
        assert recorded_parts(blob, other, "g1") is None
    # A source without parts (an earlier format's) is not trusted either.
    bare = source_doc(RICH, name=name, hook=hook, v6=False, ipset_ids=ids, generator="g1")
    assert recorded_parts(bare, want, "g1") is None
    assert parse_source(blob).policy_set == RICH  # explain reads it as before


def test_the_generator_fingerprint_covers_the_generators_code(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: pathlib.Path) -> None:
    fp = policyload.generator_fingerprint()
    assert len(fp) == 32 and fp == policyload.generator_fingerprint()
    assert "felixpy.bpf.polprog" in policyload._GENERATOR_MODULES
    mod = tmp_path / "fpy_fake_generator.py"
    mod.write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(policyload, "_GENERATOR_MODULES", (*policyload._GENERATOR_MODULES, "fpy_fake_generator"))
    try:
        policyload.generator_fingerprint.cache_clear()
        one = policyload.generator_fingerprint()
        mod.write_text("X = 2\n")
        policyload.generator_fingerprint.cache_clear()
        two = policyload.generator_fingerprint()
        assert one and two and len({fp, one, two}) == 3
        mod.unlink()
        policyload.generator_fingerprint.cache_clear()
        assert policyload.generator_fingerprint() == ""  # unreadable: no source is trusted
    finally:
        policyload.generator_fingerprint.cache_clear()


def test_the_source_text_is_the_plain_walks_byte_for_byte() -> None:
    """The rules' fast path (no call per field, tuples left to JSON) writes exactly the text the
    generic dataclass walk did: program sources of earlier runs compare equal (a restart adopts)."""
    for ps in (RICH, PolicySet(), PolicySet(profiles=(Profile("p", (Rule(Action.DENY, protocol=6,
                                                                         not_src_ports=ports(1, (5, 9)),
                                                                         icmp_type=3),)),))):
        blob = source_doc(ps, name="p6e_00ff00ff", hook=defs.HOOK_TC_EGRESS, v6=True, ipset_ids={"s:a": 3},
                          generator="g", insn_counts=[7], tags=[b"\x09" * 8])
        want = {"format": 1, "program": "p6e_00ff00ff", "hook": defs.HOOK_TC_EGRESS, "ip_version": 6,
                "ip_set_ids": {"s:a": 3}, "policy_set": _reference_plain(ps), "generator": "g",
                "insn_counts": [7], "tags": ["09" * 8]}
        assert zlib.decompress(blob).decode() == json.dumps(want, separators=(",", ":"))
