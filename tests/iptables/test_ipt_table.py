"""IptablesTable against the stateful fake: resulting state, parametrised over backends and failures."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry

from felixpy.drivers.generictables import Table
from felixpy.drivers.generictables.model import (
    Accept, Chain, Drop, Goto, Jump, Masquerade, Match, Return, Rule, SetMark,
)
from felixpy.drivers.iptables import render, savefile
from felixpy.drivers.iptables.detect import Features, StaticFeatures
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.iptables.metrics import get_metrics
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.drivers.readahead import ReadAhead
from felixpy.errors import FatalDataplaneError
from felixpy.testing.clock import FakeClock

FEATURES = Features(SNATFullyRandom=True, MASQFullyRandom=True, RestoreSupportsLock=True, NFLogSize=True)
HASH_RE = savefile.hash_comment_regex()
OWNED_RE = savefile.owned_chain_regex()


@pytest.fixture(params=["legacy", "nft"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake(backend: str) -> FakeIptables:
    return FakeIptables(default_backend=backend)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def make_table(fake: FakeIptables, clock: FakeClock, backend: str,
               registry: CollectorRegistry) -> Callable[..., IptablesTable]:
    def make(name: str = "filter", ip_version: int = 4, **kw: object) -> IptablesTable:
        kw.setdefault("features", StaticFeatures(FEATURES))
        return IptablesTable(name, ip_version, runner=fake, backend=backend, clock=clock.monotonic, sleep=clock.sleep,
                             metrics=get_metrics(registry), **kw)  # type: ignore[arg-type]
    return make


CHAINS = [
    Chain("cali-FORWARD", (
        Rule(Match().in_interface("cali+"), Goto("cali-from-wl")),
        Rule(Match().out_interface("cali+"), Goto("cali-to-wl")),
        Rule(Match().mark_single_bit_set(0x10000), Accept(), ("Policy explicitly accepted packet.",)),
    )),
    Chain("cali-from-wl", (
        Rule(Match().protocol("tcp").dest_ports(80, 443), Accept()),
        Rule(Match().source_net("10.0.0.0/8"), Return()),
        Rule(action=Drop(), comments=("Unknown interface",)),
    )),
    Chain("cali-to-wl", (Rule(Match().conntrack_state("RELATED,ESTABLISHED"), Accept()), Rule(action=Drop()))),
]
UNREFERENCED = Chain("cali-pi-unused", (Rule(action=Drop()),))


def program(t: Table) -> None:
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
    t.append_rules("FORWARD", [Rule(Match().mark_single_bit_set(0x10000), Accept()), Rule(action=SetMark(0x10000))])
    t.update_chains(CHAINS)
    t.update_chain(UNREFERENCED)


def hashes_in(fake: FakeIptables, table: str = "filter", ip_version: int = 4) -> dict[str, list[str]]:
    return savefile.parse_save(fake.save(table, ip_version), hash_re=HASH_RE, owned_re=OWNED_RE).hashes


def expected_owned(chains: list[Chain]) -> dict[str, list[str]]:
    return {c.name: render.rule_hashes(c.name, c.rules, FEATURES) for c in chains}


def owned_in(fake: FakeIptables, table: str = "filter", ip_version: int = 4) -> dict[str, list[str]]:
    return {c: h for c, h in hashes_in(fake, table, ip_version).items() if OWNED_RE.match(c)}


FWD_INSERT = render.rule_hashes("FORWARD", [Rule(action=Jump("cali-FORWARD"))], FEATURES)
FWD_APPENDS = render.rule_hashes(
    "FORWARD*appends*", [Rule(Match().mark_single_bit_set(0x10000), Accept()), Rule(action=SetMark(0x10000))],
    FEATURES)


def assert_converged(fake: FakeIptables, chains: list[Chain] = CHAINS, foreign_in_forward: int = 0,
                     insert_mode: str = "insert") -> None:
    assert owned_in(fake) == expected_owned(chains)
    fwd = hashes_in(fake)["FORWARD"]
    foreign = [""] * foreign_in_forward
    if insert_mode == "insert":
        assert fwd == FWD_INSERT + foreign + FWD_APPENDS
    else:
        assert fwd == foreign + FWD_INSERT + FWD_APPENDS
    assert hashes_in(fake)["INPUT"].count("") == len(hashes_in(fake)["INPUT"])  # nothing of ours in INPUT


# ----------------------------------------------------------------------------- basics
def test_table_satisfies_protocol(make_table: Callable[..., IptablesTable]) -> None:
    assert isinstance(make_table(), Table)


def test_cold_programming(make_table: Callable[..., IptablesTable], fake: FakeIptables) -> None:
    fake.external_restore("*filter\n-A FORWARD -j ACCEPT\n-A INPUT -p tcp -j ACCEPT\n:DOCKER - -\n"
                          "-A DOCKER -j RETURN\nCOMMIT\n")
    t = make_table()
    program(t)
    assert fake.restore_count() == 0  # recording only
    assert t.apply() == pytest.approx(5.0)
    assert fake.restore_count() == 1
    assert_converged(fake, foreign_in_forward=1)
    assert "cali-pi-unused" not in fake.chain_names("filter")  # never referenced ⇒ never written
    assert fake.chain_specs("filter", "DOCKER") == ["-j RETURN"]
    assert fake.chain_specs("filter", "INPUT") == ["-p tcp -j ACCEPT"]
    text = fake.restore_inputs[-1]
    assert text.startswith("*filter\n") and text.endswith("COMMIT\n")
    # Every rule we wrote has our hash comment first.
    for line in text.splitlines():
        if line.startswith(("-A", "-I")):
            assert line.split(" ", 2)[2].startswith('-m comment --comment "cali:')


def test_noop_apply_runs_no_command(make_table: Callable[..., IptablesTable], fake: FakeIptables,
                                    clock: FakeClock) -> None:
    t = make_table()
    program(t)
    t.apply()
    n = fake.command_count()
    clock.advance(1.0)
    assert t.apply() == pytest.approx(4.0)
    t.update_chains(CHAINS)  # identical chains: nothing recorded
    assert t.apply() == pytest.approx(4.0)
    assert fake.command_count() == n


def test_restart_finds_everything_right_and_writes_nothing(
        make_table: Callable[..., IptablesTable], fake: FakeIptables) -> None:
    t1 = make_table()
    program(t1)
    t1.apply()
    for i in range(3):
        fake.hit("filter", "cali-from-wl", i, packets=i + 5)
    fake.hit("filter", "FORWARD", 0, packets=7)
    before = fake.save("filter", counters=True)
    t2 = make_table()  # a fresh process: no memory of t1
    program(t2)
    n = fake.restore_count()
    t2.apply()
    assert fake.restore_count() == n
    assert fake.save("filter", counters=True) == before


def test_changed_rule_rewrites_only_its_chain(make_table: Callable[..., IptablesTable], fake: FakeIptables,
                                              backend: str) -> None:
    t = make_table()
    program(t)
    t.apply()
    for chain in ("cali-FORWARD", "cali-from-wl", "cali-to-wl"):
        fake.hit("filter", chain, 0, packets=3)
    new = Chain("cali-from-wl", (CHAINS[1].rules[0], Rule(Match().source_net("10.1.0.0/16"), Return()),
                                 CHAINS[1].rules[2]))
    t.update_chain(new)
    t.apply()
    text = fake.restore_inputs[-1]
    touched = {line.split()[1] for line in text.splitlines() if line[:2] in ("-A", "-R", "-D", "-I", ":c")}
    assert touched == {"cali-from-wl"} or touched == {"cali-from-wl", "-"}
    if backend == "legacy":
        # Hashes chain, so every rule from the changed one on is replaced in place; nothing else.
        assert [ln.split(" ", 3)[:3] for ln in text.splitlines() if ln.startswith("-")] == [
            ["-R", "cali-from-wl", "2"], ["-R", "cali-from-wl", "3"]]
    chains = [CHAINS[0], new, CHAINS[2]]
    assert owned_in(fake) == expected_owned(chains)
    saved = {(r.chain, r.hash): r.packets for r in savefile.parse_save_counters(fake.save("filter", counters=True))}
    assert saved[("cali-FORWARD", expected_owned(chains)["cali-FORWARD"][0])] == 3
    assert saved[("cali-to-wl", expected_owned(chains)["cali-to-wl"][0])] == 3
    # Legacy replaces only rule 2, so rule 1 keeps its counter; nft rewrites the chain.
    assert saved[("cali-from-wl", expected_owned(chains)["cali-from-wl"][0])] == (3 if backend == "legacy" else 0)


def test_shrinking_and_growing_chains(make_table: Callable[..., IptablesTable], fake: FakeIptables) -> None:
    t = make_table()
    program(t)
    t.apply()
    short = Chain("cali-from-wl", (CHAINS[1].rules[0],))
    t.update_chain(short)
    t.apply()
    assert owned_in(fake) == expected_owned([CHAINS[0], short, CHAINS[2]])
    long = Chain("cali-from-wl", CHAINS[1].rules + (Rule(Match().protocol("udp"), Drop()),) * 3)
    t.update_chain(long)
    t.apply()
    assert owned_in(fake) == expected_owned([CHAINS[0], long, CHAINS[2]])


def test_refcounting(make_table: Callable[..., IptablesTable], fake: FakeIptables) -> None:
    t = make_table()
    program(t)
    t.apply()
    # Reference the unused policy chain: now it is written.
    to_wl = Chain("cali-to-wl", (Rule(action=Jump("cali-pi-unused")),) + CHAINS[2].rules)
    t.update_chain(to_wl)
    t.apply()
    assert owned_in(fake) == expected_owned([CHAINS[0], CHAINS[1], to_wl, UNREFERENCED])
    # Drop the reference: removed from the kernel, still remembered.
    t.update_chain(CHAINS[2])
    t.apply()
    assert owned_in(fake) == expected_owned(CHAINS)
    # Unhook everything: the whole tree goes, the hooks go, foreign rules stay.
    t.insert_or_append_rules("FORWARD", [])
    t.append_rules("FORWARD", [])
    t.apply()
    assert owned_in(fake) == {}
    assert hashes_in(fake)["FORWARD"] == []
    # Hook again: the remembered chains come back.
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
    t.apply()
    assert owned_in(fake) == expected_owned(CHAINS)


def test_remove_chain(make_table: Callable[..., IptablesTable], fake: FakeIptables) -> None:
    t = make_table()
    program(t)
    t.apply()
    fwd = Chain("cali-FORWARD", CHAINS[0].rules[1:])
    t.update_chain(fwd)
    t.remove_chain_by_name("cali-from-wl")
    t.remove_chains([UNREFERENCED])
    t.apply()
    assert owned_in(fake) == expected_owned([fwd, CHAINS[2]])


@pytest.mark.parametrize("insert_mode", ["insert", "append"])
def test_insert_modes_keep_foreign_rules(make_table: Callable[..., IptablesTable], fake: FakeIptables,
                                         insert_mode: str) -> None:
    fake.external_restore("*filter\n-A FORWARD -s 1.2.3.4/32 -j ACCEPT\n-A FORWARD -j KUBE-FORWARD\nCOMMIT\n")
    t = make_table(insert_mode=insert_mode)
    program(t)
    t.apply()
    assert_converged(fake, foreign_in_forward=2, insert_mode=insert_mode)
    specs = fake.chain_specs("filter", "FORWARD")
    assert "-s 1.2.3.4/32 -j ACCEPT" in specs and "-j KUBE-FORWARD" in specs


def test_ipv6_and_other_tables_use_their_binaries(make_table: Callable[..., IptablesTable], fake: FakeIptables,
                                                  backend: str) -> None:
    t = make_table("nat", 6)
    assert t.restore_cmd == f"ip6tables-{backend}-restore" and t.save_cmd == f"ip6tables-{backend}-save"
    t.insert_or_append_rules("POSTROUTING", [Rule(action=Jump("cali-POSTROUTING"))])
    masq = Chain("cali-POSTROUTING", (Rule(Match().out_interface("vxlan-v6.calico"), Masquerade()),))
    t.update_chain(masq)
    t.apply()
    assert owned_in(fake, "nat", 6) == expected_owned([masq])
    assert hashes_in(fake, "nat", 6)["POSTROUTING"] == ["O3lYWMrLQYEMJtB5"]
    assert owned_in(fake, "nat", 4) == {}
    argv = [a for a, _ in fake.calls if a[0].endswith("restore")][-1]
    assert argv == (f"ip6tables-{backend}-restore", "--noflush", "--verbose", "--wait", "10",
                    "--wait-interval", "50000")


def test_features_change_rewrites(make_table: Callable[..., IptablesTable], fake: FakeIptables) -> None:
    feats = StaticFeatures(Features(MASQFullyRandom=False))
    t = make_table("nat", features=feats)
    t.insert_or_append_rules("POSTROUTING", [Rule(action=Jump("cali-nat-outgoing"))])
    t.update_chain(Chain("cali-nat-outgoing", (Rule(action=Masquerade()),)))
    t.apply()
    assert "--random-fully" not in fake.save("nat")
    feats.features = Features(MASQFullyRandom=True)
    t.invalidate_dataplane_cache("test")
    t.apply()
    assert "MASQUERADE --random-fully" in fake.save("nat")


# ----------------------------------------------------------------------------- drift and cleanup
def drift_deleted_rule(fake: FakeIptables) -> None:
    fake.external_restore("*filter\n-D cali-from-wl 2\nCOMMIT\n")


def drift_flushed_chain(fake: FakeIptables) -> None:
    fake.external_restore("*filter\n-F cali-FORWARD\nCOMMIT\n")


def drift_foreign_on_top(fake: FakeIptables) -> None:
    fake.external_restore("*filter\n-I FORWARD 1 -s 9.9.9.9/32 -j DROP\nCOMMIT\n")


def drift_foreign_in_our_chain(fake: FakeIptables) -> None:
    fake.external_restore("*filter\n-I cali-to-wl 1 -j ACCEPT\nCOMMIT\n")


def drift_our_insert_deleted(fake: FakeIptables) -> None:
    fake.external_restore("*filter\n-D FORWARD 1\nCOMMIT\n")


def drift_our_insert_moved(fake: FakeIptables) -> None:
    spec = fake.chain_specs("filter", "FORWARD")[0]
    fake.external_restore(f"*filter\n-D FORWARD 1\n-A FORWARD {spec}\nCOMMIT\n")


def drift_duplicate_insert(fake: FakeIptables) -> None:
    spec = fake.chain_specs("filter", "FORWARD")[0]
    fake.external_restore(f"*filter\n-A INPUT {spec}\n-I FORWARD 2 {spec}\nCOMMIT\n")


def drift_stale_chain(fake: FakeIptables) -> None:
    fake.external_restore('*filter\n:cali-stale - -\n-A cali-stale -m comment --comment "cali:qwebjbdfjadfndns" '
                          "-j ACCEPT\n:felix-old - -\n-A felix-old -j DROP\n-A INPUT -j felix-old\nCOMMIT\n")


DRIFTS = {
    "deleted-rule": (drift_deleted_rule, 0),
    "flushed-chain": (drift_flushed_chain, 0),
    "foreign-on-top": (drift_foreign_on_top, 1),
    "foreign-in-our-chain": (drift_foreign_in_our_chain, 0),
    "our-insert-deleted": (drift_our_insert_deleted, 0),
    "our-insert-moved": (drift_our_insert_moved, 0),
    "duplicate-insert": (drift_duplicate_insert, 0),
    "stale-chains": (drift_stale_chain, 0),
}


@pytest.mark.parametrize("how", ["refresh", "post-write", "restart"])
@pytest.mark.parametrize("drift", list(DRIFTS))
def test_drift_is_repaired(make_table: Callable[..., IptablesTable], fake: FakeIptables, clock: FakeClock,
                           drift: str, how: str) -> None:
    t = make_table(refresh_interval=90.0)
    program(t)
    t.apply()
    DRIFTS[drift][0](fake)
    if how == "refresh":
        clock.advance(91)
        t.apply()
    elif how == "post-write":
        clock.advance(5)
        t.apply()  # the first post-write check re-reads and repairs
    else:
        t = make_table(refresh_interval=90.0)
        program(t)
        t.apply()
    assert_converged(fake, foreign_in_forward=DRIFTS[drift][1])
    if drift == "foreign-on-top":
        assert fake.chain_specs("filter", "FORWARD")[1] == "-s 9.9.9.9/32 -j DROP"
    if drift == "stale-chains":
        assert "cali-stale" not in fake.chain_names("filter") and "felix-old" not in fake.chain_names("filter")


def test_drift_is_not_seen_before_a_check(make_table: Callable[..., IptablesTable], fake: FakeIptables,
                                          clock: FakeClock) -> None:
    t = make_table()
    program(t)
    t.apply()
    drift_deleted_rule(fake)
    n = fake.command_count()
    clock.advance(1)
    t.apply()
    assert fake.command_count() == n  # cached state trusted until a timer fires
    t.invalidate_dataplane_cache("test")
    t.apply()
    assert_converged(fake)


def test_old_felix_inserts_and_stray_hashes_cleaned(make_table: Callable[..., IptablesTable],
                                                    fake: FakeIptables) -> None:
    fake.external_restore(
        "*nat\n:cali-nat-outgoing - -\n"
        "-A POSTROUTING -s 10.0.0.0/8 -m set --match-set felix-masq-ipam-pools src -j MASQUERADE\n"
        "-A POSTROUTING -j KUBE-POSTROUTING\n"
        '-A OUTPUT -m comment --comment "cali:aaaaaaaaaaaaaaaa" -j ACCEPT\n'
        "-A OUTPUT -j DOCKER\nCOMMIT\n")
    t = make_table("nat", extra_cleanup_regex=savefile.HISTORIC_INSERTED_NAT_RULE_REGEX)
    t.apply()
    assert fake.chain_specs("nat", "POSTROUTING") == ["-j KUBE-POSTROUTING"]
    assert fake.chain_specs("nat", "OUTPUT") == ["-j DOCKER"]
    assert "cali-nat-outgoing" not in fake.chain_names("nat")


def test_foreign_chain_inserts(make_table: Callable[..., IptablesTable], fake: FakeIptables) -> None:
    fake.external_restore("*filter\n:DOCKER-USER - -\n-A DOCKER-USER -j RETURN\nCOMMIT\n")
    t = make_table()
    t.insert_or_append_rules("DOCKER-USER", [Rule(Match().in_interface("cali+"), Accept())])
    t.apply()
    assert hashes_in(fake)["DOCKER-USER"][1:] == [""] and hashes_in(fake)["DOCKER-USER"][0]
    t.insert_or_append_rules("DOCKER-USER", [])
    t.apply()
    assert fake.chain_specs("filter", "DOCKER-USER") == ["-j RETURN"]


# ----------------------------------------------------------------------------- failures
Scenario = Callable[[FakeIptables], None]
FAILURES: dict[str, tuple[Scenario, bool, int]] = {
    # name: (inject, expect_fatal, restores attempted)
    "restore-fails-once": (lambda f: setattr(f, "fail_next_restores", 1), False, 2),
    "restore-fails-10-times": (lambda f: setattr(f, "fail_next_restores", 10), False, 11),
    "restore-fails-11-times": (lambda f: setattr(f, "fail_next_restores", 11), True, 11),
    "restore-always-fails": (lambda f: setattr(f, "fail_all_restores", True), True, 11),
    "lock-timeout-twice": (lambda f: setattr(f, "lock_timeout_next_restores", 2), False, 3),
    "save-fails-3-times": (lambda f: setattr(f, "fail_next_saves", 3), False, 1),
    "save-fails-4-times": (lambda f: setattr(f, "fail_next_saves", 4), True, 0),
    "all-saves-fail": (lambda f: setattr(f, "fail_all_saves", True), True, 0),
    "nft-incompatible": (lambda f: setattr(f, "nft_incompatible", True), True, 0),
}


@pytest.mark.parametrize("scenario", list(FAILURES))
def test_failure_scenarios(make_table: Callable[..., IptablesTable], fake: FakeIptables, clock: FakeClock,
                           scenario: str, backend: str) -> None:
    inject, fatal, restores = FAILURES[scenario]
    fake.external_restore("*filter\n-A FORWARD -j ACCEPT\nCOMMIT\n")
    before = fake.save("filter")
    t = make_table()
    program(t)
    inject(fake)
    if scenario == "nft-incompatible" and backend == "legacy":
        fatal, restores = False, 1  # only iptables-nft prints the marker
    n = fake.restore_count()
    if fatal:
        with structlog.testing.capture_logs() as logs, pytest.raises(FatalDataplaneError):
            t.apply()
        assert fake.save("filter") == before  # atomic: nothing half-written
        errors = [e for e in logs if e["log_level"] == "error"]
        assert errors
        if restores:
            give_up = [e for e in errors if "save_dump" in e]
            assert give_up and len(give_up[0]["attempts"]) == 11
            assert "*filter" in give_up[0]["save_dump"] and "-A cali-FORWARD" in give_up[0]["last_input"]
            assert clock.sleeps == [0.001 * 2 ** i for i in range(10)]
        else:
            assert clock.sleeps == [0.1, 0.2, 0.4]
    else:
        t.apply()
        assert_converged(fake, foreign_in_forward=1)
    assert fake.restore_count() - n == restores


def test_stale_cache_write_failure_rereads_and_succeeds(make_table: Callable[..., IptablesTable],
                                                        fake: FakeIptables, backend: str) -> None:
    # Without the defensive re-read, a write planned on stale state fails; the retry re-reads.
    t = make_table(reread_before_write=False)
    program(t)
    t.apply()
    fake.external_restore("*filter\n-F cali-from-wl\nCOMMIT\n")
    changed = Chain("cali-from-wl", CHAINS[1].rules[:2] + (Rule(Match().protocol("udp"), Drop()),))
    t.update_chain(changed)
    n = fake.restore_count()
    t.apply()
    assert owned_in(fake) == expected_owned([CHAINS[0], changed, CHAINS[2]])
    assert fake.restore_count() - n == (2 if backend == "legacy" else 1)  # nft rewrites whole chains anyway


def test_reschedule_and_timers(make_table: Callable[..., IptablesTable], fake: FakeIptables,
                               clock: FakeClock) -> None:
    t = make_table(refresh_interval=30.0)
    program(t)
    assert t.apply() == pytest.approx(5.0)  # write at T0: first post-write check at T0+5

    def saves() -> int:
        return sum(1 for a, _ in fake.calls if a[0].endswith("-save"))

    s0 = saves()
    clock.advance(5)
    assert t.apply() == pytest.approx(5.0)  # re-read; next check at T0+10
    clock.advance(5)
    assert t.apply() == pytest.approx(10.0)  # next at T0+20
    clock.advance(10)
    assert t.apply() == pytest.approx(20.0)  # next post-write at T0+40; refresh at T0+50
    clock.advance(20)
    assert t.apply() == pytest.approx(30.0)  # post-write T0+80 vs refresh T0+70
    assert saves() == s0 + 4
    clock.advance(29)
    t.apply()
    assert saves() == s0 + 4  # nothing due yet: no command
    clock.advance(2)
    t.apply()
    assert saves() == s0 + 5  # refresh timer (strictly more than 30 s since the last read)
    # A write resets the post-write interval.
    t.update_chain(Chain("cali-to-wl", ()))
    assert t.apply() == pytest.approx(5.0)
    # Without a refresh interval, post-write checks stop once they reach an hour.
    t2 = make_table(refresh_interval=0, post_write_interval=0.01)
    assert t2.apply() is not None
    r: float | None = 0.0
    for _ in range(20):
        clock.advance(4000)
        r = t2.apply()
    assert r is None


def test_only_the_restore_text_is_held_while_the_restore_runs(make_table: Callable[..., IptablesTable],
                                                               fake: FakeIptables) -> None:
    """Issue #17 (memory): at a start of day the rendered bodies and the buffer's lines are each as big as
    the restore text; both are let go before the command runs (a retry renders again)."""
    t = make_table()
    seen: list[tuple[int, int]] = []
    run = fake.run

    def spy(argv: Sequence[str], stdin: str | None = None, **kw: Any) -> Any:
        if argv[0].endswith("-restore"):
            seen.append((len(t._hasher._fresh_bodies), len(stdin or "")))
        return run(argv, stdin, **kw)

    fake.run = spy  # type: ignore[method-assign]
    program(t)
    fake.fail_next_restores = 1
    t.apply()
    assert len(seen) == 2 and all(bodies == 0 and size > 0 for bodies, size in seen)
    assert seen[0][1] == seen[1][1]  # the retry rendered the same input again
    assert_converged(fake, foreign_in_forward=0)


def test_a_runner_that_takes_lines_gets_the_restore_input_as_lines(fake: FakeIptables) -> None:
    """Issue #17 (memory): the real runner is handed the lines, never one joined text; a runner that takes
    only text (the fakes, wrappers) gets the same input joined."""
    got: list[object] = []

    class Lines:
        takes_stdin_lines = True

        def run(self, argv: Sequence[str], stdin: Any = None, **kw: Any) -> Any:
            if argv[0].endswith("-restore"):
                got.append(stdin)
            return fake.run(argv, None if stdin is None else "".join(ln + "\n" for ln in stdin), **kw)

    t = IptablesTable("filter", 4, runner=Lines(), backend=fake.default_backend,  # type: ignore[arg-type]
                      features=StaticFeatures(FEATURES))
    program(t)
    t.apply()
    assert len(got) == 1 and not isinstance(got[0], str)
    lines = list(got[0])  # type: ignore[call-overload]
    assert lines[0] == "*filter" and lines[-1] == "COMMIT" and len(got[0]) == len(lines)  # type: ignore[arg-type]
    assert list(got[0]) == lines  # type: ignore[call-overload]  # re-iterable: the failure log reads it again
    # A new chain's lines are a recipe until the input is written: never all formatted at once.
    assert any(not isinstance(seg, str) for seg in got[0]._segments)  # type: ignore[attr-defined]
    assert t.last_restore_input == ""
    assert_converged(fake, foreign_in_forward=0)


def test_metrics(make_table: Callable[..., IptablesTable], fake: FakeIptables,
                 registry: CollectorRegistry) -> None:
    t = make_table()
    program(t)
    t.apply()
    fake.fail_next_restores = 1
    t.update_chain(Chain("cali-to-wl", ()))
    t.apply()
    labels = {"ip_version": "4", "table": "filter"}
    assert registry.get_sample_value("felix_iptables_restore_calls_total") == 3
    assert registry.get_sample_value("felix_iptables_restore_errors_total") == 1
    assert registry.get_sample_value("felix_iptables_save_calls_total") >= 2
    assert registry.get_sample_value("felix_iptables_chains", labels) == 6  # 3 kernel + 3 ours
    assert registry.get_sample_value("felix_iptables_rules", labels) == 3 + 3 + 0 + 1 + 2
    assert registry.get_sample_value("felix_iptables_lines_executed_total", labels) > 10


def test_deep_and_shared_chain_references(make_table: Callable[..., IptablesTable], fake: FakeIptables) -> None:
    # A 2,000-deep chain of jumps (no recursion limits), plus one chain shared by two parents.
    t = make_table()
    n = 2000
    chains = [Chain(f"cali-d{i}", (Rule(action=Jump(f"cali-d{i + 1}")),)) for i in range(n)]
    chains.append(Chain(f"cali-d{n}", (Rule(action=Jump("cali-shared")),)))
    shared = Chain("cali-shared", (Rule(action=Drop()),))
    other = Chain("cali-other", (Rule(action=Jump("cali-shared")),))
    t.update_chains(chains + [shared, other])
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-d0")), Rule(action=Jump("cali-other"))])
    t.apply()
    assert len(owned_in(fake)) == n + 3
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-other"))])
    t.apply()
    assert set(owned_in(fake)) == {"cali-other", "cali-shared"}
    t.insert_or_append_rules("FORWARD", [])
    t.apply()
    assert owned_in(fake) == {}


def test_from_config(fake: FakeIptables) -> None:
    from felixpy.config import Config

    cfg = Config().replace(IptablesBackend="nft", ChainInsertMode="append", IptablesRefreshInterval=60.0,
                           IptablesLockProbeIntervalMillis=20.0, FeatureDetectOverride="MASQFullyRandom=false")
    t = IptablesTable.from_config("nat", 6, cfg, runner=fake, metrics=get_metrics(CollectorRegistry()))
    assert t.backend == "nft" and t.restore_cmd == "ip6tables-nft-restore"
    t.insert_or_append_rules("POSTROUTING", [Rule(action=Jump("cali-POSTROUTING"))])
    t.update_chain(Chain("cali-POSTROUTING", (Rule(action=Masquerade()),)))
    t.apply()
    argv = [a for a, _ in fake.calls if a[0].endswith("-restore")][-1]
    assert argv[-2:] == ("--wait-interval", "20000")
    assert "--random-fully" not in fake.save("nat", 6, backend="nft")


RENDER_BODY = render.render_body  # the real one, for expectations in tests that count renders


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Rule, str]]:
    """Every ``render_body`` call from now on: the rule, and the name of the thread it ran on."""
    seen: list[tuple[Rule, str]] = []

    def counting(rule: Rule, features: Features) -> str:
        seen.append((rule, threading.current_thread().name))
        return RENDER_BODY(rule, features)

    monkeypatch.setattr(render, "render_body", counting)
    return seen


def test_each_rule_is_rendered_once_per_cold_apply(make_table: Callable[..., IptablesTable], fake: FakeIptables,
                                                  renders: list[tuple[Rule, str]]) -> None:
    # Hashed while the save runs, then the same rendering is written: no second rendering.
    t = make_table()
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-FORWARD"))])
    t.update_chains(CHAINS)
    t.apply()
    during_apply = [r for r, _ in renders]
    programmed = [c for c in CHAINS if c.name in fake.chain_names("filter")]
    assert programmed
    chain_rules = [r for c in programmed for r in c.rules]
    assert sorted(map(id, [r for r in during_apply if any(r is x for x in chain_rules)])) == sorted(
        map(id, chain_rules))
    assert t.dataplane_hashes() == {**t.dataplane_hashes(), **{
        c.name: render.rule_hashes(c.name, c.rules, FEATURES) for c in programmed}}


@pytest.mark.parametrize("ip_version", [4, 6])
def test_chains_sharing_one_rule_tuple_render_it_once_and_keep_their_own_hashes(
        ip_version: int,
        make_table: Callable[..., IptablesTable], fake: FakeIptables, renders: list[tuple[Rule, str]]) -> None:
    """Endpoint chains of endpoints with the same policies share one rule tuple (rules/endpoints.py): the
    table renders it once for all of them, each chain still hashes from its own name, the kernel gets each
    chain's own lines, and nothing of the shared rendering is held after the apply.  A tuple that is only
    equal (not the same object) renders on its own; a restart of the same tables writes nothing."""
    shared = (Rule(Match().conntrack_state("RELATED,ESTABLISHED"), Accept()), Rule(action=Drop(), comments=("x",)))
    equal = tuple(Rule(r.match, r.action, r.comments) for r in shared)
    names = [f"cali-tw-cali{i}" for i in range(4)]
    chains = [Chain(n, shared) for n in names] + [Chain("cali-tw-other", equal)]

    def program_all(t: IptablesTable) -> None:
        t.insert_or_append_rules("FORWARD", [Rule(action=Jump(c.name)) for c in chains])
        t.update_chains(chains)

    def chain_renders() -> int:  # the renders of the chains' rules (not the FORWARD jumps)
        return sum(1 for r, _ in renders if any(r is x for x in shared + equal))

    t = make_table(ip_version=ip_version)
    program_all(t)
    t.apply()
    assert chain_renders() == 2 * len(shared)  # the shared tuple once, the equal one once
    for c in chains:
        hashes = render.rule_hashes(c.name, c.rules, FEATURES)
        assert fake.chain_specs("filter", c.name, ip_version) == [
            f'-m comment --comment "cali:{h}" {RENDER_BODY(r, FEATURES).replace("--jump", "-j")}'  # as -save prints
            for h, r in zip(hashes, c.rules)]
        assert t.dataplane_hashes()[c.name] == hashes
    assert len({tuple(t.dataplane_hashes()[n]) for n in names}) == len(names)  # each chain's own
    assert t._hasher._bodies_by_rules == {} and t._hasher._fresh_bodies == {}

    restarted = make_table(ip_version=ip_version)
    program_all(restarted)
    calls = len(fake.calls)
    renders.clear()
    restarted.apply()
    assert not [a for a, _ in fake.calls[calls:] if a[0].endswith("-restore")]
    assert chain_renders() == 2 * len(shared)


@pytest.mark.parametrize("ip_version", [4, 6])
def test_hashing_ahead_renders_on_its_thread_and_the_table_waits_for_it(
        ip_version: int,
        make_table: Callable[..., IptablesTable], fake: FakeIptables, renders: list[tuple[Rule, str]]) -> None:
    """``hash_ahead`` renders and hashes the dirty chains on a thread of its own (the loop starts it once
    the managers are done, while the IP sets are written); the apply then renders nothing again and
    writes the same; an update arriving while it runs waits for it, so no hash computed for the old
    chain survives the update."""
    threads: list[threading.Thread] = []
    gate = threading.Event()

    def start(fn: Callable[[], None]) -> None:
        def run() -> None:
            gate.wait(10)
            fn()
        threads.append(threading.Thread(target=run, name="hash-ahead-test"))
        threads[-1].start()

    t = make_table(ip_version=ip_version)
    t._hasher._hashing = ReadAhead("rule hashing", structlog.get_logger(), start)
    program(t)
    t.hash_ahead()
    assert threads and not renders  # started, held at the gate
    changed = Chain("cali-to-wl", (Rule(action=Drop(), comments=("changed",)),))
    done = threading.Event()
    updater = threading.Thread(target=lambda: (t.update_chain(changed), done.set()))
    updater.start()
    assert not done.wait(0.2)  # the update waits for the hashing
    gate.set()
    assert done.wait(10)
    updater.join()
    assert renders and {thread for _, thread in renders} == {"hash-ahead-test"}
    renders.clear()
    t.apply()
    # Only the changed chain (and the kernel chains' rules) render on the apply path.
    assert len(renders) == len(changed.rules) + 3
    want = {c.name: render.rule_hashes(c.name, c.rules, FEATURES) for c in (*CHAINS[:2], changed)}
    got = t.dataplane_hashes()
    assert {name: got[name] for name in want} == want

    t.hash_ahead()  # nothing dirty, nothing to hash: no thread
    assert len(threads) == 1


def test_unrenderable_rule_still_raises_from_apply(make_table: Callable[..., IptablesTable],
                                                   fake: FakeIptables) -> None:
    # Hashing during the save must not change where a bad rule is reported.
    t = make_table()
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-bad"))])
    t.update_chain(Chain("cali-bad", (Rule(action=Drop()), Rule(Match().mark_clear(0), Accept()))))
    with pytest.raises(ValueError, match="zero mark"):
        t.apply()
    assert "cali-bad" not in fake.chain_names("filter")
    t.update_chain(Chain("cali-bad", (Rule(action=Drop()),)))
    t.apply()
    assert fake.chain_specs("filter", "cali-bad") == [
        f'-m comment --comment "cali:{render.rule_hashes("cali-bad", [Rule(action=Drop())], FEATURES)[0]}" -j DROP']


def test_restore_input_is_not_kept_after_a_successful_write(make_table: Callable[..., IptablesTable],
                                                          fake: FakeIptables) -> None:
    """Issue #17 (memory): the input is kept for the failure path only (a start of day's is MiBs); the
    give-up log still carries it (test_failure_scenarios)."""
    t = make_table()
    program(t)
    t.apply()
    assert fake.restore_count() >= 1 and t.last_restore_input == ""
    assert_converged(fake, foreign_in_forward=0)


def _many_chains(n: int) -> list[Chain]:
    """A dispatch chain jumping to *n* endpoint chains, each with a few rules (an unhooked start of day)."""
    eps = [Chain(f"cali-tw-ep{i}", (Rule(Match().source_net(f"10.0.{i}.0/24"), Accept()), Rule(action=Drop())))
           for i in range(n)]
    dispatch = Chain("cali-to-wl", tuple(Rule(Match().out_interface(f"cali{i}"), Goto(f"cali-tw-ep{i}"))
                                         for i in range(n)))
    return [*eps, dispatch]


def _transactions(text: str) -> list[list[str]]:
    out: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("*"):
            out.append([])
        elif line != "COMMIT":
            out[-1].append(line)
    return out


def test_unhooked_iptables_nft_write_is_split_with_the_hooks_last(
        make_table: Callable[..., IptablesTable], fake: FakeIptables, backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing of ours in the kernel's own chains no packet reaches our chains, so iptables-nft takes
    the write in transactions of about UNHOOKED_TRANSACTION_LINES (one big --noflush transaction is
    quadratic); the jump into our chains comes in the last one, once every chain is complete.  Legacy
    rewrites the whole table per transaction: never split.  The result is the same kernel state."""
    from felixpy.drivers.iptables import table as table_mod
    monkeypatch.setattr(table_mod, "UNHOOKED_TRANSACTION_LINES", 20)
    chains = _many_chains(30)
    t = make_table()
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-to-wl"))])
    t.update_chains(chains)
    t.apply()
    txs = _transactions(fake.restore_inputs[-1])
    if backend == "legacy":
        assert len(txs) == 1
    else:
        assert len(txs) >= 4 and all(len(tx) <= 20 + 31 for tx in txs)   # a chain (up to 31 lines) stays whole
        hook = [i for i, tx in enumerate(txs) if any(line.startswith("-I FORWARD") for line in tx)]
        assert hook == [len(txs) - 1]
        lines = [line for tx in txs for line in tx]
        declared = [i for i, line in enumerate(lines) if line.startswith(":cali-")]
        filled = [i for i, line in enumerate(lines) if line.startswith("-A cali-")]
        assert max(declared) < min(filled)   # every jump target exists before a rule names it
    assert owned_in(fake) == expected_owned(chains)
    assert hashes_in(fake)["FORWARD"] == render.rule_hashes("FORWARD", [Rule(action=Jump("cali-to-wl"))], FEATURES)
    # Hooked now: a later big write is one transaction again (plus nft's chain-deletion one, if any).
    t.update_chains(_many_chains(40))
    t.apply()
    assert len(_transactions(fake.restore_inputs[-1])) == 1
    assert owned_in(fake) == expected_owned(_many_chains(40))


def test_a_hook_someone_else_left_keeps_the_write_whole(
        make_table: Callable[..., IptablesTable], fake: FakeIptables, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule of ours in a foreign chain found at the read (a previous run's hook) makes our chains
    reachable: the write is not split, even before this process wrote anything."""
    from felixpy.drivers.iptables import table as table_mod
    monkeypatch.setattr(table_mod, "UNHOOKED_TRANSACTION_LINES", 20)
    old = make_table()
    old.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-to-wl"))])
    old.update_chains(_many_chains(2))
    old.apply()
    new = make_table()
    new.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-to-wl"))])
    new.update_chains(_many_chains(30))
    new.apply()
    assert len(_transactions(fake.restore_inputs[-1])) == 1
    assert owned_in(fake) == expected_owned(_many_chains(30))
