"""The restart's split read-back (``nftables/ruletext.py`` + ``snapshotworker.read_table``): chains and rule
hashes from nft's terse text, sets and maps from their JSON listings.  Whatever the table holds, the
snapshot must be exactly :func:`parse_table` of ``nft -j list table``; text the reader cannot classify
must send it back to that JSON listing, never produce a different snapshot."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from felixpy.drivers.nftables import snapshotworker
from felixpy.drivers.nftables.names import BaseChainSpec
from felixpy.drivers.nftables.readback import ChainSnapshot, parse_table
from felixpy.drivers.nftables.ruletext import Unreadable, parse_terse_text, rule_hash
from felixpy.drivers.nftables.shim import NftChildProcess

import nft_helpers as hp
from nft_helpers import Harness, program_typical

# Captured from nft 1.0.6 (``nft -t -y list table ip calico``), trimmed.
LISTING = """table ip calico {
\tcounter cnt {
\t\tpackets 0 bytes 0
\t}

\tset cali40s-web {
\t\ttype ipv4_addr
\t\tflags interval
\t}

\tmap filter-cali-from-wl-dispatch {
\t\ttype ifname : verdict
\t}

\tchain filter-FORWARD {
\t\ttype filter hook forward priority 0; policy accept;
\t\tcounter packets 0 bytes 0 jump filter-cali-FORWARD comment "cali:dpfqBgJrpRwlrqw1;"
\t\tmeta mark & 0x00010000 == 0x00010000 accept comment "cali:yp7iNUYNEhDmKF6E; Policy explicitly accepted packet."
\t}

\tchain nat-POSTROUTING {
\t\ttype nat hook postrouting priority 110; policy accept;
\t}

\tchain filter-cali-FORWARD {
\t\tiifname vmap @filter-cali-from-wl-dispatch comment "cali:Lui9n9_J-BlSLUtk;"
\t\tiifname "cali*" counter packets 0 bytes 0 drop comment "cali:KMISEjprqaGFiicp; Unknown interface"
\t\tip saddr 10.0.0.1 accept
\t\t
\t\t comment "only a comment"
\t\tlog prefix "calico-packet: " level info
\t}

\tchain filter-cali-empty {
\t}
}
"""


def test_the_text_gives_chains_base_shapes_hashes_and_foreign_objects() -> None:
    chains, others = parse_terse_text(LISTING, "ip", "calico")
    assert chains == {
        "filter-FORWARD": ChainSnapshot(BaseChainSpec("filter", "forward", 0, "accept"),
                                        ["dpfqBgJrpRwlrqw1", "yp7iNUYNEhDmKF6E"]),
        "nat-POSTROUTING": ChainSnapshot(BaseChainSpec("nat", "postrouting", 110, "accept"), []),
        "filter-cali-FORWARD": ChainSnapshot(None, ["Lui9n9_J-BlSLUtk", "KMISEjprqaGFiicp", "", "", "", ""]),
        "filter-cali-empty": ChainSnapshot(None, []),
    }
    assert others == [("counter", "cnt")]


@pytest.mark.parametrize("body, want", [
    ("accept", ""),
    ('accept comment "cali:abc;"', "abc"),
    ('accept comment "cali:abc"', "abc"),
    ('accept comment "not ours"', ""),
    ('iifname "cali*" oifname != "eth0" drop comment "cali:x; Unknown"', "x"),
    ('log prefix "p: " level info accept comment "cali:y;"', "y"),
    (' comment "cali:z;"', "z"),
    ('iifname { "a", "b" } accept', ""),
    ('accept comment "a"b"', None),                                     # a quote inside: odd count
    ('accept comment "ta\tb\\c', None),                                 # a comment spanning lines
    ('ip saddr { 1.2.3.4 comment "cali:e;" } accept', None),           # an element's comment, not the rule's
    ('ip saddr { 1.2.3.4 comment "x" } accept comment "cali:r;"', None),
    ('log prefix "a" comment "cali:h;" comment "cali:i;"', None),
])
def test_a_rule_line_is_read_only_where_its_comment_is_unambiguous(body: str, want: str | None) -> None:
    assert rule_hash(body) == want


def _replace(old: str, new: str) -> str:
    assert old in LISTING
    return LISTING.replace(old, new, 1)


@pytest.mark.parametrize("text", [
    "",
    LISTING.replace("table ip calico {", "table ip6 calico {"),
    LISTING.replace("table ip calico {", "table ip other {"),
    LISTING[:LISTING.rindex("}")],                                                          # cut short
    LISTING[:LISTING.index("\tchain filter-cali-empty")],                                   # cut inside
    _replace("\tset cali40s-web {", "\t# Warning: table ip calico is managed by iptables-nft\n\tset cali40s-web {"),
    _replace("\tset cali40s-web {", "\tsomething new {"),
    _replace("type filter hook forward priority 0; policy accept;",
             'type filter hook ingress devices = { "eth0" } priority 0; policy accept;'),
    _replace("\t\tip saddr 10.0.0.1 accept", "\t\tflags offload;"),
    _replace("\t\tip saddr 10.0.0.1 accept", '\t\tcomment "a chain comment"'),
    _replace("\t\tip saddr 10.0.0.1 accept", '\t\taccept comment "a\n\t\tdrop comment "cali:fake;"'),
    _replace("\t\tip saddr 10.0.0.1 accept", '\t\taccept comment "a\nb"'),
    _replace("\t\tip saddr 10.0.0.1 accept", "\t\tip saddr 10.0.0.1 accept \ufffd"),
    _replace("\tchain filter-cali-empty {", "\tchain filter-FORWARD {"),                     # listed twice
])
def test_anything_else_is_unreadable(text: str) -> None:
    with pytest.raises(Unreadable):
        parse_terse_text(text, "ip", "calico")


# ------------------------------------------------------------------------------- against the kernel
def _foreign(v: int) -> list[dict[str, Any]]:
    """What a table as felixpy writes it can also hold: rules without comments, rules with anonymous sets,
    log prefixes, a rule of only a comment, a foreign base chain, an empty chain, objects we never write,
    a set of a kind we never write."""
    t = hp.tbl(v)
    fam = hp.family(v)
    addr = "10.9.0.1" if v == 4 else "fd09::1"
    addrs = ["10.9.0.2", "10.9.0.3"] if v == 4 else ["fd09::2", "fd09::3"]
    ip = {"payload": {"protocol": fam, "field": "saddr"}}
    return [
        {"add": {"rule": {**t, "chain": "filter-cali-INPUT", "expr": [
            {"match": {"op": "==", "left": ip, "right": addr}}, {"accept": None}]}}},
        {"add": {"rule": {**t, "chain": "filter-cali-INPUT", "comment": "cali:notreallyours;", "expr": [
            {"match": {"op": "==", "left": ip, "right": {"set": addrs}}}, {"drop": None}]}}},
        {"add": {"rule": {**t, "chain": "filter-cali-INPUT", "expr": [
            {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": {"set": ["a", "b"]}}},
            {"log": {"prefix": "calico-drop: "}}, {"drop": None}]}}},
        {"add": {"rule": {**t, "chain": "filter-cali-INPUT", "comment": "just words", "expr": []}}},
        {"add": {"chain": {**t, "name": "foreign-base", "type": "filter", "hook": "input", "prio": -5,
                           "policy": "drop"}}},
        {"add": {"rule": {**t, "chain": "foreign-base", "expr": [{"accept": None}]}}},
        {"add": {"chain": {**t, "name": "foreign-empty"}}},
        {"add": {"counter": {**t, "name": "a-counter"}}},
        {"add": {"quota": {**t, "name": "a-quota", "bytes": 1000}}},
        {"add": {"set": {**t, "name": "foreign-set", "type": f"ipv{v}_addr", "flags": ["interval"],
                         "elem": [{"range": addrs}]}}},
        {"add": {"map": {**t, "name": "foreign-map", "type": "ifname", "map": "verdict",
                         "elem": [["x0", {"accept": None}]]}}},
    ]


def _kernel(in_netns: str) -> NftChildProcess:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    assert hp.inside_netns(in_netns), "refusing to touch nftables outside the throwaway namespace"
    return NftChildProcess()


def _json_snapshot(shim: NftChildProcess, v: int) -> Any:
    objs = shim.list_table(hp.family(v), "calico")
    return None if objs is None else parse_table(objs, v)


@pytest.mark.kernel
@pytest.mark.parametrize("v", [4, 6])
def test_the_split_read_is_the_json_snapshot(in_netns: str, make: Callable[..., Harness], v: int) -> None:
    shim = _kernel(in_netns)
    assert snapshotworker.read_table(shim, hp.family(v), "calico", v) == (None, "split")
    h = make(shim, v)
    program_typical(h)
    h.root.apply()
    shim.run(_foreign(v))
    want = _json_snapshot(shim, v)
    got, via = snapshotworker.read_table(shim, hp.family(v), "calico", v)
    assert via == "split"
    assert got == want
    # The test proves little unless the table holds what it is about.
    assert got is not None and got.maps["filter-cali-from-wl-dispatch"].elements
    assert {s.kind.type for s in got.sets.values() if s.kind} >= {
        (f"ipv{v}_addr",), (f"ipv{v}_addr", "inet_proto", "inet_service")}
    assert got.chains["foreign-base"].base == BaseChainSpec("filter", "input", -5, "drop")
    assert got.chains["filter-INPUT"].base is not None
    assert ("counter", "a-counter") in got.others and ("quota", "a-quota") in got.others
    assert got.sets["foreign-set"].unparsed == 0 and got.maps["foreign-map"].elements == {"x0": ("accept",)}
    assert got.chains["filter-cali-INPUT"].hashes.count("") == 3
    # And through the worker process, as the daemon reads it.
    assert NftChildProcess(parse_in_child=True).snapshot("table", hp.family(v), "calico", v) == want


@pytest.mark.kernel
def test_an_unreadable_rule_sends_the_read_to_the_json_listing(in_netns: str, make: Callable[..., Harness]) -> None:
    shim = _kernel(in_netns)
    h = make(shim, 4)
    program_typical(h)
    h.root.apply()
    # A comment whose newline makes its second half look like a rule of ours.
    shim.run([{"add": {"rule": {**hp.tbl(4), "chain": "filter-cali-INPUT", "expr": [{"accept": None}],
                                "comment": 'x\n\t\tdrop comment "cali:forged;'}}}])
    want = _json_snapshot(shim, 4)
    got, via = snapshotworker.read_table(shim, "ip", "calico", 4)
    assert via.startswith("json: ") and "line" in via
    assert got == want and "forged" not in got.chains["filter-cali-INPUT"].hashes
    assert NftChildProcess(parse_in_child=True).snapshot("table", "ip", "calico", 4) == want


@pytest.mark.kernel
def test_an_nft_that_refuses_the_text_listing_is_read_through_json(in_netns: str, make: Callable[..., Harness],
                                                                   tmp_path: Any) -> None:
    shim = _kernel(in_netns)
    h = make(shim, 4)
    program_typical(h)
    h.root.apply()
    old_nft = tmp_path / "nft"      # an nft that knows neither -t nor -y
    old_nft.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in -t|-y) echo "nft: invalid option -- \'${a#-}\'" >&2; '
                       'exit 1;; esac; done\nexec nft "$@"\n')
    old_nft.chmod(0o755)
    got, via = snapshotworker.read_table(NftChildProcess(nft=str(old_nft)), "ip", "calico", 4)
    assert via.startswith("json: the text listing failed") and got == _json_snapshot(shim, 4)
