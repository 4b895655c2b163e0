"""The root table and its layers against the stateful fake nft; assertions are on the resulting state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from felixpy.drivers.generictables.model import Accept, Chain, Drop, Goto, Jump, Match, Return, Rule
from felixpy.drivers.generictables.table import MapMetadata, MapsDataplane, Table
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.nftables.names import BASE_CHAINS
from felixpy.errors import FatalDataplaneError

import nft_helpers as hp
from nft_helpers import Harness, program_typical

V46 = pytest.mark.parametrize("v", [4, 6])


def _prog(make: Callable[..., Harness], fake: FakeNft, v: int) -> Harness:
    h = make(fake, v)
    program_typical(h)
    h.root.apply()
    return h


# ------------------------------------------------------------------------------ basics
@V46
def test_cold_apply_programs_everything_in_one_transaction(make: Callable[..., Harness], fake: FakeNft,
                                                           v: int) -> None:
    h = make(fake, v)
    program_typical(h)
    assert h.root.apply() == pytest.approx(180.0)
    assert fake.run_calls == 1 and fake.list_calls == 1
    ch = hp.chains(fake, v)
    for name, spec in BASE_CHAINS.items():
        assert ch[name]["base"] == (spec.type, spec.hook, spec.prio)
    assert [c for _, c, _ in ch["filter-FORWARD"]["rules"]][0].startswith("cali:")
    assert len(ch["filter-FORWARD"]["rules"]) == 2                     # insert + append
    assert len(ch["filter-cali-INPUT"]["rules"]) == 4
    assert ch["filter-cali-INPUT"]["rules"][1][1].endswith(" host traffic")
    for name in ("filter-cali-FORWARD", "filter-cali-fw-cali1234", "filter-cali-fw-cali5678",
                 "nat-cali-nat-outgoing"):
        assert name in ch
    assert "filter-cali-unused" not in ch                                # never referenced
    p = f"cali{v}0"
    assert hp.sets(fake, v) == {
        f"{p}s-web": {h.net(1), h.addr(5)},
        f"{p}s-hosts": {h.addr(1), h.addr(2)},
        f"{p}n-ports": {f"{h.addr(3)},tcp:80", f"{h.addr(3)},udp:53"},
    }
    assert hp.set_types(fake, v)[f"{p}s-web"] == (f"ipv{v}_addr", ("interval",))
    assert hp.maps(fake, v) == {"filter-cali-from-wl-dispatch": {
        "cali1234": {"goto": {"target": "filter-cali-fw-cali1234"}},
        "cali5678": {"goto": {"target": "filter-cali-fw-cali5678"}}}}


def test_protocols_are_implemented(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = make(fake)
    assert isinstance(h.root, IPSetsDataplane) and isinstance(h.root, MapsDataplane)
    assert isinstance(h.root, Table) and isinstance(h.filter, Table) and isinstance(h.filter, MapsDataplane)


def test_noop_apply_runs_nothing(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    runs, lists = fake.run_calls, fake.list_calls
    h.root.apply()
    program_typical(h)        # the same desired state again
    h.root.apply()
    for layer in h.layers.values():
        layer.apply()
    assert (fake.run_calls, fake.list_calls) == (runs, lists)


@V46
def test_restart_finds_everything_right_and_writes_nothing(make: Callable[..., Harness], fake: FakeNft,
                                                           v: int) -> None:
    _prog(make, fake, v)
    before, runs = hp.handles(fake, v), fake.run_calls
    h2 = make(fake, v)
    program_typical(h2)
    h2.root.apply()
    assert fake.run_calls == runs
    assert hp.handles(fake, v) == before
    for set_id, name in [("s:hosts", f"cali{v}0s-hosts"), ("s:web", f"cali{v}0s-web"), ("n:ports", f"cali{v}0n-ports")]:
        assert h2.root._dp_sets[name].members is h2.root.get_desired_members(set_id)   # not the listing's copy


def test_restart_with_different_desired_state_sweeps_the_rest(make: Callable[..., Harness],
                                                              fake: FakeNft) -> None:
    _prog(make, fake, 4)
    h2 = make(fake)
    h2.filter.insert_or_append_rules("INPUT", [Rule(Match(), Jump("cali-new"))])
    h2.filter.update_chain(Chain("cali-new", (Rule(Match(), Accept()),)))
    h2.root.apply()
    ch = hp.chains(fake, 4)
    assert set(ch) == set(BASE_CHAINS) | {"filter-cali-new"}
    assert hp.sets(fake, 4) == {} and hp.maps(fake, 4) == {}
    assert all(not c["rules"] for n, c in ch.items() if n not in ("filter-INPUT", "filter-cali-new"))


def test_changed_rule_rewrites_only_its_chain(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    before = hp.handles(fake, 4)
    lists = fake.list_calls
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match().source_ip_set("cali40s:web"), Accept()),)))
    h.root.apply()
    assert fake.list_calls == lists                # committed state kept in memory
    after = hp.handles(fake, 4)
    assert after["filter-cali-fw-cali5678"] != before["filter-cali-fw-cali5678"]
    del after["filter-cali-fw-cali5678"], before["filter-cali-fw-cali5678"]
    assert after == before


def test_the_transaction_with_the_sets_runs_at_the_tables_step(make: Callable[..., Harness], fake: FakeNft) -> None:
    """For a small set write the loop's IP-set step writes nothing (the sets go in the table's transaction,
    which its tables step runs, overlapping the route tables; big ones go ahead: test_nft_sets_ahead.py);
    one transaction then holds sets and rules, sets first."""
    h = make(fake)
    program_typical(h)
    h.root.apply_updates()
    assert fake.run_calls == 0 and fake.table("ip") is None
    assert h.root.apply() is not None and fake.run_calls == 1
    assert hp.sets(fake, 4)["cali40s-hosts"] == {h.addr(1), h.addr(2)}
    assert h.root.apply_deletions() is False


# ---------------------------------------------------------------------------- references
def test_chain_programmed_only_while_referenced(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    h.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Jump("cali-unused")),)))
    h.root.apply()
    assert "filter-cali-unused" in hp.chains(fake, 4)
    h.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Drop()),)))
    h.root.apply()
    assert "filter-cali-unused" not in hp.chains(fake, 4)
    h.filter.remove_chain_by_name("cali-unused")
    h.root.apply()


def test_removing_a_map_and_its_chains(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    h.filter.add_or_replace_map(MapMetadata("cali-from-wl-dispatch"), {"cali1234": Goto("cali-fw-cali1234")})
    h.root.apply()
    assert "filter-cali-fw-cali5678" not in hp.chains(fake, 4)
    assert set(hp.maps(fake, 4)["filter-cali-from-wl-dispatch"]) == {"cali1234"}
    h.filter.update_chain(Chain("cali-FORWARD", (Rule(Match(), Return()),)))
    h.filter.remove_map("cali-from-wl-dispatch")
    h.root.apply()
    assert hp.maps(fake, 4) == {}
    assert "filter-cali-fw-cali1234" not in hp.chains(fake, 4)


def test_map_element_retargeted(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    h.filter.update_chain(Chain("cali-fw-other", (Rule(Match(), Drop()),)))
    h.filter.add_or_replace_map(MapMetadata("cali-from-wl-dispatch"),
                                {"cali1234": Goto("cali-fw-other"), "cali5678": Return()})
    h.root.apply()
    assert hp.maps(fake, 4)["filter-cali-from-wl-dispatch"] == {
        "cali1234": {"goto": {"target": "filter-cali-fw-other"}}, "cali5678": {"return": None}}
    ch = hp.chains(fake, 4)
    assert "filter-cali-fw-other" in ch and "filter-cali-fw-cali1234" not in ch


def test_layer_rejects_chains_that_are_not_base_chains(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = make(fake)
    with pytest.raises(ValueError):
        h.nat.insert_or_append_rules("FORWARD", [])
    with pytest.raises(ValueError):
        h.filter.update_chain(Chain("INPUT", ()))


# ------------------------------------------------------------------------------------ drift
def _ext(fake: FakeNft, *cmds: dict[str, Any]) -> None:
    fake.run(list(cmds))


T = hp.tbl(4)
DRIFT: dict[str, Callable[[FakeNft], None]] = {
    "deleted rule": lambda f: _ext(f, {"delete": {"rule": {**T, "chain": "filter-cali-INPUT",
                                                          "handle": hp.rule_handle(f, 4, "filter-cali-INPUT", 1)}}}),
    "flushed chain": lambda f: _ext(f, {"flush": {"chain": {**T, "name": "filter-cali-INPUT"}}}),
    "flushed base chain": lambda f: _ext(f, {"flush": {"chain": {**T, "name": "filter-FORWARD"}}}),
    "foreign rule in our chain": lambda f: _ext(f, {"add": {"rule": {**T, "chain": "filter-cali-INPUT",
                                                                    "expr": [{"accept": None}]}}}),
    "foreign chain": lambda f: _ext(f, {"add": {"chain": {**T, "name": "someone-else"}}},
                                    {"add": {"rule": {**T, "chain": "someone-else", "expr": [{"drop": None}]}}}),
    "foreign set": lambda f: _ext(f, {"add": {"set": {**T, "name": "x", "type": "ipv4_addr"}}}),
    "foreign counter": lambda f: _ext(f, {"add": {"counter": {**T, "name": "x"}}}),
    "set member removed": lambda f: _ext(f, {"delete": {"element": {**T, "name": "cali40s-hosts",
                                                                   "elem": ["10.0.0.1"]}}}),
    "set member added": lambda f: _ext(f, {"add": {"element": {**T, "name": "cali40s-hosts",
                                                              "elem": ["10.9.9.9"]}}}),
    "map element removed": lambda f: _ext(f, {"delete": {"element": {**T, "name": "filter-cali-from-wl-dispatch",
                                                                    "elem": ["cali1234"]}}}),
    "base chain deleted": lambda f: _ext(f, {"delete": {"chain": {**T, "name": "raw-OUTPUT"}}}),
    "base chain reprioritised": lambda f: _ext(
        f, {"flush": {"chain": {**T, "name": "raw-PREROUTING"}}}, {"delete": {"chain": {**T, "name": "raw-PREROUTING"}}},
        {"add": {"chain": {**T, "name": "raw-PREROUTING", "type": "filter", "hook": "prerouting", "prio": 0,
                           "policy": "accept"}}}),
    "table deleted": lambda f: _ext(f, {"delete": {"table": {"family": "ip", "name": "calico"}}}),
}


@pytest.mark.parametrize("drift", sorted(DRIFT))
def test_drift_is_repaired_by_the_refresh(make: Callable[..., Harness], fake: FakeNft, drift: str) -> None:
    h = _prog(make, fake, 4)
    good_chains, good_sets, good_maps = hp.chains(fake, 4), hp.sets(fake, 4), hp.maps(fake, 4)
    DRIFT[drift](fake)
    runs = fake.run_calls
    h.root.apply()                                   # memory is trusted until the refresh
    assert fake.run_calls == runs
    h.clock.advance(181)
    h.root.apply()
    after = hp.chains(fake, 4)
    assert {n: [c for _, c, _ in x["rules"]] for n, x in after.items()} == \
        {n: [c for _, c, _ in x["rules"]] for n, x in good_chains.items()}
    assert {n: x["base"] for n, x in after.items()} == {n: x["base"] for n, x in good_chains.items()}
    assert hp.sets(fake, 4) == good_sets and hp.maps(fake, 4) == good_maps
    assert [k for k, _ in fake.table("ip").others] == []   # type: ignore[union-attr]
    if drift not in ("table deleted", "foreign chain", "foreign set", "foreign counter"):
        untouched = {n for n in good_chains if n not in ("filter-cali-INPUT", "filter-FORWARD", "raw-PREROUTING")}
        assert {n: [x[0] for x in after[n]["rules"]] for n in untouched} == \
            {n: [x[0] for x in good_chains[n]["rules"]] for n in untouched}


def test_invalidate_triggers_a_reload(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    DRIFT["flushed chain"](fake)
    h.filter.invalidate_dataplane_cache("test")
    h.root.apply()
    assert fake.list_calls == 2 and len(hp.chains(fake, 4)["filter-cali-INPUT"]["rules"]) == 4


# -------------------------------------------------------------------------------------- sets
def test_set_deltas(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    h.root.add_members("s:hosts", ["10.0.0.7", "10.0.0.8/32", "fd00::1", "junk"])
    h.root.remove_members("s:hosts", ["10.0.0.1"])
    h.root.apply()
    assert hp.sets(fake, 4)["cali40s-hosts"] == {"10.0.0.2", "10.0.0.7", "10.0.0.8"}
    assert h.root.get_desired_members("s:hosts") == {"10.0.0.2", "10.0.0.7", "10.0.0.8"}
    assert h.root.get_type_of("s:hosts") is IPSetType.HASH_IP
    assert h.root.get_type_of("s:nope") is None and h.root.get_desired_members("s:nope") is None
    h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", IPSetType.HASH_IP), ["10.0.0.9"])
    h.root.apply()
    assert hp.sets(fake, 4)["cali40s-hosts"] == {"10.0.0.9"}
    h.root.add_members("s:unknown", ["10.0.0.1"])          # logged and ignored
    h.root.apply()


def test_overlapping_nets_are_written_without_overlap(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    h.root.add_members("s:web", ["10.1.2.3", "10.1.0.0/24", "10.2.0.1"])
    h.root.apply()
    assert hp.sets(fake, 4)["cali40s-web"] == {"10.1.0.0/16", "10.0.0.5", "10.2.0.1"}
    h.root.remove_members("s:web", ["10.1.0.0/16"])
    h.root.apply()
    assert hp.sets(fake, 4)["cali40s-web"] == {"10.1.0.0/24", "10.1.2.3", "10.0.0.5", "10.2.0.1"}
    assert h.root.get_desired_members("s:web") == {"10.0.0.5", "10.1.2.3", "10.1.0.0/24", "10.2.0.1"}


def test_set_type_change_while_in_use_swaps_atomically(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    before = hp.handles(fake, 4)
    runs = fake.run_calls
    h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", IPSetType.HASH_NET), ["10.0.0.0/24"])
    h.root.apply()
    assert fake.run_calls == runs + 1
    assert hp.set_types(fake, 4)["cali40s-hosts"] == ("ipv4_addr", ("interval",))
    assert hp.sets(fake, 4)["cali40s-hosts"] == {"10.0.0.0/24"}
    after = hp.handles(fake, 4)
    assert after["filter-cali-INPUT"] != before["filter-cali-INPUT"]          # users rewritten
    assert after["filter-cali-fw-cali5678"] == before["filter-cali-fw-cali5678"]
    kinds = [next(iter(next(iter(c.values())))) + " " + next(iter(c)) for c in fake.last_commands]
    assert kinds.index("chain flush") < kinds.index("set delete") < kinds.index("set add") < kinds.index("rule add")


def test_set_deleted_only_after_its_last_user(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    h.root.remove_ip_set("s:hosts")                       # still used by filter-cali-INPUT
    h.root.apply()
    assert "cali40s-hosts" in hp.sets(fake, 4)
    assert h.root.apply_deletions() is True
    h.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Drop()),)))
    h.root.apply()
    assert "cali40s-hosts" not in hp.sets(fake, 4)
    assert h.root.apply_deletions() is False


def test_set_removed_with_its_users_in_one_apply(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    h.nat.insert_or_append_rules("POSTROUTING", [])
    h.nat.remove_chain_by_name("cali-nat-outgoing")
    h.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Drop()),)))
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Drop()),)))
    h.root.remove_ip_set("s:web")
    h.root.apply()
    assert "cali40s-web" not in hp.sets(fake, 4) and "nat-cali-nat-outgoing" not in hp.chains(fake, 4)


def test_bad_sets_do_not_fail_the_table(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    h.root.add_or_replace_ip_set(IPSetMetadata("s:big", IPSetType.HASH_IP, max_size=2),
                                 ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", IPSetType.HASH_IP, max_size=2),
                                 ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    h.root.add_members("s:web", ["not-an-ip", "10.3.0.0/16"])
    h.root.apply()
    s = hp.sets(fake, 4)
    assert s["cali40s-big"] == set()                         # created empty: rules may refer to it
    assert s["cali40s-hosts"] == {"10.0.0.1", "10.0.0.2"}    # kept its previous contents
    assert "10.3.0.0/16" in s["cali40s-web"]


# ---------------------------------------------------------------------------------- failures
def _first_three(cmds: Sequence[dict[str, Any]]) -> list[str]:
    return [next(iter(c)) + " " + next(iter(next(iter(c.values())))) for c in cmds[:3]]


RECREATE = ["add table", "delete table", "add table"]


@pytest.mark.parametrize("failures", [1, 2, 5, 6, 10])
def test_transient_write_failures(make: Callable[..., Harness], fake: FakeNft, failures: int) -> None:
    h = _prog(make, fake, 4)
    DRIFT["foreign chain"](fake)
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Accept()),)))
    fake.fail_next_runs(failures)
    h.root.apply()
    assert h.sleeps == [0.001 * 2 ** i for i in range(failures)]
    assert (_first_three(fake.last_commands) == RECREATE) == (failures >= 5)
    assert fake.list_calls == 1 + failures                        # reloaded after each failure
    ch = hp.chains(fake, 4)
    assert "someone-else" not in ch and len(ch["filter-cali-fw-cali5678"]["rules"]) == 1
    assert hp.sets(fake, 4)["cali40s-hosts"] == {"10.0.0.1", "10.0.0.2"}


def test_only_a_table_rebuild_helps(make: Callable[..., Harness], fake: FakeNft) -> None:
    """An incompatible table: only the add;delete;add rebuild gets through, on the 6th attempt."""
    h = _prog(make, fake, 4)
    fake.fail_when = lambda cmds: None if _first_three(cmds) == RECREATE else "Error: incompatible"
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Accept()),)))
    h.root.apply()
    assert len(h.sleeps) == 5
    assert len(hp.chains(fake, 4)["filter-cali-fw-cali5678"]["rules"]) == 1
    fake.fail_when = None
    runs = fake.run_calls
    h.root.apply()
    assert fake.run_calls == runs


def test_persistent_failure_is_fatal_and_leaves_the_table_alone(make: Callable[..., Harness],
                                                                fake: FakeNft) -> None:
    h = _prog(make, fake, 4)
    before = hp.chains(fake, 4)
    fake.fail_all_runs = True
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Accept()),)))
    with pytest.raises(FatalDataplaneError):
        h.root.apply()
    assert fake.run_calls == 1 + 11 and len(h.sleeps) == 10
    fake.fail_all_runs = False
    assert hp.chains(fake, 4) == before                    # base chains and rules untouched


def test_kernel_refusal_of_recreate_keeps_base_chains(make: Callable[..., Harness], fake: FakeNft) -> None:
    """A desired rule the kernel refuses (its set does not exist): every attempt fails, rebuilds included."""
    h = _prog(make, fake, 4)
    before = hp.chains(fake, 4)
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match().source_ip_set("cali40s:missing"), Drop()),)))
    with pytest.raises(FatalDataplaneError):
        h.root.apply()
    assert _first_three(fake.last_commands) == RECREATE
    assert hp.chains(fake, 4) == before


@pytest.mark.parametrize("failures,fatal", [(1, False), (3, False), (4, True)])
def test_list_failures(make: Callable[..., Harness], fake: FakeNft, failures: int, fatal: bool) -> None:
    h = make(fake)
    program_typical(h)
    fake.fail_next_lists(failures)
    if fatal:
        with pytest.raises(FatalDataplaneError):
            h.root.apply()
        assert fake.run_calls == 0
    else:
        h.root.apply()
        assert h.sleeps == [0.1 * 2 ** i for i in range(failures)]
        assert "filter-cali-INPUT" in hp.chains(fake, 4)


# ------------------------------------------------------------------------------ odds and ends
def test_layer_namespacing(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = make(fake)
    h.layers["mangle"].insert_or_append_rules("PREROUTING", [Rule(Match().in_interface_vmap("cali:m"), None),
                                                             Rule(Match(), Goto("cali-x"))])
    h.layers["mangle"].update_chain(Chain("cali-x", (Rule(Match(), Jump("mangle-cali-y")),)))
    h.layers["mangle"].update_chain(Chain("cali-y", (Rule(Match(), Return()),)))
    h.layers["mangle"].add_or_replace_map(MapMetadata("cali:m"), {"eth0": Goto("cali-y")})
    h.root.apply()
    ch = hp.chains(fake, 4)
    assert {"mangle-cali-x", "mangle-cali-y"} <= set(ch)
    assert hp.maps(fake, 4) == {"mangle-cali-m": {"eth0": {"goto": {"target": "mangle-cali-y"}}}}
    exprs = [o["rule"]["expr"] for o in hp.listing(fake, 4) if "rule" in o and o["rule"]["chain"] == "mangle-PREROUTING"]
    assert exprs[0] == [{"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@mangle-cali-m"}}]
    assert exprs[1][-1] == {"goto": {"target": "mangle-cali-x"}}


def test_bad_rule_is_refused_at_the_call_and_records_nothing(make: Callable[..., Harness], fake: FakeNft) -> None:
    from felixpy.drivers.nftables.render import RuleRenderError
    h = _prog(make, fake, 4)
    with pytest.raises(RuleRenderError):
        h.filter.update_chain(Chain("cali-INPUT", (Rule(Match().dest_ports(80), Accept()),)))
    with pytest.raises(RuleRenderError):
        h.filter.insert_or_append_rules("INPUT", [Rule(Match().ipvs_connection(), Accept())])
    runs = fake.run_calls
    h.root.apply()
    assert fake.run_calls == runs


def test_base_chain_hashes_use_felix_ipv4_rendering(make: Callable[..., Harness], fake: FakeNft) -> None:
    """Felix hashes inserted/appended rules with its IPv4 renderer in both families: so do we."""
    from felixpy.drivers.nftables.render import chain_rule_hashes
    h = make(fake, 6)
    rules = [Rule(Match().source_net("fd00::/64"), Drop())]
    h.filter.insert_or_append_rules("INPUT", rules)
    h.root.apply()
    comment = hp.chains(fake, 6)["filter-INPUT"]["rules"][0][1]
    assert comment == f"cali:{chain_rule_hashes('filter-INPUT', rules, 4)[0]};"
    assert chain_rule_hashes("filter-INPUT", rules, 4) != chain_rule_hashes("filter-INPUT", rules, 6)


def test_set_deletions_are_capped_per_transaction(make: Callable[..., Harness], fake: FakeNft,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from felixpy.drivers.nftables import sets as sets_mod
    monkeypatch.setattr(sets_mod, "MAX_SET_DELETIONS_PER_APPLY", 2)
    h = make(fake)
    for i in range(5):
        h.root.add_or_replace_ip_set(IPSetMetadata(f"s:{i}", IPSetType.HASH_IP), [f"10.0.0.{i}"])
    h.root.apply()
    for i in range(5):
        h.root.remove_ip_set(f"s:{i}")
    assert h.root.apply() == pytest.approx(0.1)
    assert len(hp.sets(fake, 4)) == 3 and h.root.apply_deletions()
    h.root.apply()
    h.root.apply()
    assert hp.sets(fake, 4) == {} and not h.root.apply_deletions()
    assert h.root.apply() == pytest.approx(180.0)


def test_refresh_delay_and_disabled_refresh(make: Callable[..., Harness], fake: FakeNft) -> None:
    h = make(fake)
    h.root.apply()
    h.clock.advance(100)
    assert h.root.apply() == pytest.approx(80.0)
    h2 = make(FakeNft(), refresh_interval=0)
    assert h2.root.apply() is None
    h2.clock.advance(10**6)
    h2.root.apply()
    assert h2.shim.list_calls == 1    # type: ignore[attr-defined]


def test_metrics_module_reimports_cleanly() -> None:
    import importlib

    from felixpy.drivers.nftables import metrics
    first = metrics.NFT_CALLS
    importlib.reload(metrics)
    assert metrics.NFT_CALLS is first
