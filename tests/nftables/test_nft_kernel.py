"""Real-kernel tests: libnftables inside a throwaway network namespace (never the root one)."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from felixpy.drivers.generictables.model import Accept, Chain, Drop, Goto, Jump, Match, Rule
from felixpy.drivers.generictables.table import MapMetadata
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.nftables.names import BASE_CHAINS
from felixpy.drivers.nftables.shim import LibNftables, NftError, NftShim
from felixpy.errors import FatalDataplaneError

import nft_helpers as hp
from nft_helpers import Harness, program_typical

pytestmark = pytest.mark.kernel
V46 = pytest.mark.parametrize("v", [4, 6])
# Every transaction as an nft script (threshold 0) or as JSON (the default for small ones).
TRANSPORTS = pytest.mark.parametrize("text_threshold", [0, 10**9], ids=["script", "json"])


class CountingShim:
    """Delegates to a real shim and counts what went through it."""

    def __init__(self, inner: NftShim) -> None:
        self.inner = inner
        self.runs = 0
        self.lists = 0
        self.fail = False

    def run(self, commands: Sequence[dict[str, Any]]) -> None:
        self.runs += 1
        if self.fail:
            raise NftError(-1, "Error: stub refuses every transaction")
        self.inner.run(commands)

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        self.lists += 1
        return self.inner.list_table(family, name)


def nft_text(*args: str) -> str:
    """The nft CLI, forked from this thread, hence inside its namespace."""
    return subprocess.run(["nft", *args], check=True, capture_output=True, text=True).stdout


def _with_output_hook(h: Harness) -> None:
    h.filter.insert_or_append_rules("OUTPUT", [Rule(Match(), Jump("cali-OUTPUT"))])
    h.filter.update_chain(Chain("cali-OUTPUT", (Rule(Match().protocol("icmp" if h.ip_version == 4 else "ipv6-icmp"),
                                                     Accept()),)))


def _ping(v: int) -> None:
    subprocess.run(["ping", "-c", "3", "-i", "0.01", "-W", "1", "127.0.0.1" if v == 4 else "::1"],
                   check=False, capture_output=True)   # INPUT drops the replies: we only count


@V46
def test_program_then_restart_writes_nothing_and_keeps_counters(kernel_nft: NftShim, make: Callable[..., Harness],
                                                                v: int) -> None:
    shim = CountingShim(kernel_nft)
    h = make(shim, v)
    program_typical(h)
    _with_output_hook(h)
    h.root.apply()
    assert shim.runs == 1
    nft_text("list", "table", hp.family(v), "calico")             # the CLI can print what we wrote
    ch = hp.chains(kernel_nft, v)
    for name, spec in BASE_CHAINS.items():
        assert ch[name]["base"] == (spec.type, spec.hook, spec.prio)
    assert hp.sets(kernel_nft, v)[f"cali{v}0n-ports"] == {f"{h.addr(3)},tcp:80", f"{h.addr(3)},udp:53"}
    assert set(hp.maps(kernel_nft, v)["filter-cali-from-wl-dispatch"]) == {"cali1234", "cali5678"}
    _ping(v)
    before = hp.chains(kernel_nft, v)
    assert before["filter-cali-OUTPUT"]["rules"][0][2] >= 3              # packets counted

    restarted = CountingShim(kernel_nft)
    h2 = make(restarted, v)
    program_typical(h2)
    _with_output_hook(h2)
    h2.root.apply()
    assert (restarted.runs, restarted.lists) == (0, 1)
    assert hp.chains(kernel_nft, v) == before                           # handles and counters unchanged
    h2.root.apply()
    assert (restarted.runs, restarted.lists) == (0, 1)


@V46
def test_changed_rule_rewrites_only_its_chain(kernel_nft: NftShim, make: Callable[..., Harness], v: int) -> None:
    h = make(kernel_nft, v)
    program_typical(h)
    h.root.apply()
    before = hp.handles(kernel_nft, v)
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Accept()),)))
    h.root.apply()
    after = hp.handles(kernel_nft, v)
    assert after.pop("filter-cali-fw-cali5678") != before.pop("filter-cali-fw-cali5678")
    assert after == before


def _kernel_drift(v: int) -> dict[str, Callable[[], None]]:
    f = hp.family(v)
    return {
        "deleted rule": lambda: nft_text("delete", "rule", f, "calico", "filter-cali-INPUT", "handle",
                                         str(hp.rule_handle(LibNftables(), v, "filter-cali-INPUT", 2))),
        "flushed chain": lambda: nft_text("flush", "chain", f, "calico", "filter-cali-INPUT"),
        "foreign rule": lambda: nft_text("insert", "rule", f, "calico", "filter-cali-INPUT", "counter", "accept"),
        "foreign rule in base chain": lambda: nft_text("add", "rule", f, "calico", "filter-INPUT", "drop"),
        "foreign chain": lambda: nft_text("add", "chain", f, "calico", "intruder"),
        "set member removed": lambda: nft_text("delete", "element", f, "calico", f"cali{v}0s-hosts",
                                               "{ " + ("10.0.0.1" if v == 4 else "fd00::1") + " }"),
    }


@V46
@TRANSPORTS
@pytest.mark.parametrize("drift", ["deleted rule", "flushed chain", "foreign rule", "foreign rule in base chain",
                                   "foreign chain", "set member removed"])
def test_drift_repaired(kernel_nft: NftShim, make: Callable[..., Harness], v: int, drift: str,
                        text_threshold: int) -> None:
    h = make(kernel_nft, v, text_threshold=text_threshold)
    program_typical(h)
    h.root.apply()
    good = hp.chains(kernel_nft, v)
    good_sets = hp.sets(kernel_nft, v)
    _kernel_drift(v)[drift]()
    assert hp.chains(kernel_nft, v) != good or hp.sets(kernel_nft, v) != good_sets
    h.clock.advance(181)
    h.root.apply()
    after = hp.chains(kernel_nft, v)
    assert {n: [c for _, c, _ in x["rules"]] for n, x in after.items()} == \
        {n: [c for _, c, _ in x["rules"]] for n, x in good.items()}
    assert hp.sets(kernel_nft, v) == good_sets
    for name in ("filter-cali-FORWARD", "nat-cali-nat-outgoing", "filter-cali-fw-cali1234"):
        assert after[name] == good[name]                                 # untouched chains not rewritten
    assert h.sleeps == []                                                # no failed attempt on the way


@V46
@TRANSPORTS
def test_sets_lifecycle(kernel_nft: NftShim, make: Callable[..., Harness], v: int, text_threshold: int) -> None:
    h = make(kernel_nft, v, text_threshold=text_threshold)
    program_typical(h)
    h.root.apply()
    p = f"cali{v}0"
    # Update (replace), delta, bad members skipped.
    h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", IPSetType.HASH_IP), [h.addr(7), h.addr(8)])
    h.root.apply()
    assert hp.sets(kernel_nft, v)[f"{p}s-hosts"] == {h.addr(7), h.addr(8)}
    h.root.add_members("s:hosts", [h.addr(9), "garbage", "10.0.0.1" if v == 6 else "fd00::1"])
    h.root.remove_members("s:hosts", [h.addr(7)])
    h.root.add_members("s:web", [h.net(1).split("/")[0]])                 # inside an existing net
    h.root.apply()
    assert hp.sets(kernel_nft, v)[f"{p}s-hosts"] == {h.addr(8), h.addr(9)}
    # Type change of a set in use: one transaction, users rewritten, no error.
    h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", IPSetType.HASH_NET), [h.net(4)])
    h.root.apply()
    assert hp.set_types(kernel_nft, v)[f"{p}s-hosts"] == (f"ipv{v}_addr", ("interval",))
    assert hp.sets(kernel_nft, v)[f"{p}s-hosts"] == {h.net(4)}
    # Removal while a rule still uses it is deferred until the rule is gone.
    h.root.remove_ip_set("s:hosts")
    h.root.apply()
    assert f"{p}s-hosts" in hp.sets(kernel_nft, v) and h.root.apply_deletions()
    h.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Drop()),)))
    h.root.apply()
    assert f"{p}s-hosts" not in hp.sets(kernel_nft, v) and not h.root.apply_deletions()
    # Verdict map: an element retargeted, one removed, the map removed with its users.
    h.filter.add_or_replace_map(MapMetadata("cali-from-wl-dispatch"), {"cali1234": Goto("cali-fw-cali5678")})
    h.root.apply()
    assert hp.maps(kernel_nft, v)["filter-cali-from-wl-dispatch"] == {
        "cali1234": {"goto": {"target": "filter-cali-fw-cali5678"}}}
    assert "filter-cali-fw-cali1234" not in hp.chains(kernel_nft, v)
    assert h.sleeps == []
    # A restart with the same desired sets re-reads them and writes nothing.
    shim = CountingShim(kernel_nft)
    h2 = make(shim, v)
    program_typical(h2)
    h2.filter.add_or_replace_map(MapMetadata("cali-from-wl-dispatch"), {"cali1234": Goto("cali-fw-cali5678")})
    h2.root.remove_ip_set("s:hosts")
    h2.filter.update_chain(Chain("cali-INPUT", (Rule(Match(), Drop()),)))
    h2.root.add_members("s:web", [h.net(1).split("/")[0]])
    h2.root.apply()
    assert shim.runs == 0


def test_type_change_never_shows_a_missing_or_empty_set(kernel_nft: NftShim, make: Callable[..., Harness]) -> None:
    h = make(kernel_nft, 4)
    program_typical(h)
    h.root.apply()
    stop = threading.Event()
    seen: list[int] = []
    failures: list[str] = []

    def reader() -> None:     # a thread started here shares this thread's namespace
        shim = LibNftables()
        while not stop.is_set():
            objs = shim.list_table("ip", "calico") or []
            sets = {o["set"]["name"]: o["set"] for o in objs if "set" in o}
            s = sets.get("cali40s-hosts")
            if s is None or not s.get("elem"):
                failures.append(json.dumps(s))
            seen.append(1)

    t = threading.Thread(target=reader)
    t.start()
    try:
        i = 0
        while (i < 20 or len(seen) < 50) and i < 2000:
            i += 1
            typ = IPSetType.HASH_NET if i % 2 == 0 else IPSetType.HASH_IP
            h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", typ), [f"10.0.{i % 250}.1", f"10.0.{i % 250}.2"])
            h.root.apply()
    finally:
        stop.set()
        t.join()
    assert len(seen) >= 50 and failures == []


@V46
def test_refused_rebuild_leaves_base_chains_intact(kernel_nft: NftShim, make: Callable[..., Harness],
                                                   v: int) -> None:
    """Every attempt fails in the kernel (a rule names a set that does not exist), the rebuilds too."""
    shim = CountingShim(kernel_nft)
    h = make(shim, v)
    program_typical(h)
    h.root.apply()
    before = hp.chains(kernel_nft, v)
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match().source_ip_set(f"cali{v}0s:missing"), Drop()),)))
    with pytest.raises(FatalDataplaneError):
        h.root.apply()
    assert shim.runs == 1 + 11
    assert hp.chains(kernel_nft, v) == before


@V46
def test_write_that_always_fails_is_fatal(kernel_nft: NftShim, make: Callable[..., Harness], v: int) -> None:
    shim = CountingShim(kernel_nft)
    h = make(shim, v)
    program_typical(h)
    h.root.apply()
    before = hp.chains(kernel_nft, v)
    shim.fail = True
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Accept()),)))
    with pytest.raises(FatalDataplaneError):
        h.root.apply()
    assert shim.runs == 1 + 11 and len(h.sleeps) == 10
    assert hp.chains(kernel_nft, v) == before


@V46
def test_rebuild_after_repeated_failures_succeeds(kernel_nft: NftShim, make: Callable[..., Harness],
                                                  v: int) -> None:
    """Five injected failures, then the 6th attempt rebuilds the table in one transaction."""
    h = make(kernel_nft, v)
    program_typical(h)
    h.root.apply()
    nft_text("add", "chain", hp.family(v), "calico", "intruder")

    class FailFive(CountingShim):
        def run(self, commands: Sequence[dict[str, Any]]) -> None:
            self.runs += 1
            if self.runs <= 5:
                raise NftError(-1, "Error: injected")
            self.inner.run(commands)

    h2 = make(FailFive(kernel_nft), v)
    program_typical(h2)
    h2.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Accept()),)))
    h2.root.apply()
    ch = hp.chains(kernel_nft, v)
    assert "intruder" not in ch and len(ch["filter-cali-fw-cali5678"]["rules"]) == 1
    for name, spec in BASE_CHAINS.items():
        assert ch[name]["base"] == (spec.type, spec.hook, spec.prio)


def _strip_handles(objs: list[dict[str, Any]]) -> list[Any]:
    out = []
    for o in objs:
        (kind, body), = o.items()
        if kind == "metainfo":
            continue
        body = {k: v for k, v in body.items() if k != "handle"}
        if "elem" in body:
            body["elem"] = sorted(json.dumps(e, sort_keys=True) for e in body["elem"])
        out.append(json.dumps({kind: body}, sort_keys=True))
    return sorted(out)


def _take_table(shim: NftShim, v: int) -> list[Any]:
    """The table as listed (handles left out), then deleted for the next round."""
    listed = _strip_handles(hp.listing(shim, v))
    nft_text("delete", "table", hp.family(v), "calico")
    return listed


@V46
def test_script_and_json_paths_program_the_same_table(kernel_nft: NftShim, make: Callable[..., Harness],
                                                      v: int) -> None:
    listings = []
    for threshold in (0, 10**9):
        h = make(kernel_nft, v, text_threshold=threshold)
        program_typical(h)
        _with_output_hook(h)
        h.root.apply()
        assert h.sleeps == []
        listings.append(_take_table(kernel_nft, v))
    assert listings[0] == listings[1]


@V46
@pytest.mark.parametrize("drift", [None, "flushed chain", "foreign rule in base chain"])
def test_table_block_and_add_lines_program_the_same_table(kernel_nft: NftShim, make: Callable[..., Harness],
                                                          v: int, drift: str | None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A long run of additions goes as one ``table`` block (script.BLOCK_MIN_COMMANDS): the kernel ends up
    holding what the ``add`` lines give — for a cold start, and for a repair whose rules follow a flush
    of an existing base chain (a block chain without its hook spec) — and the table then reads back in
    sync (its hashes match: a second apply writes nothing)."""
    from felixpy.drivers.nftables import script
    listings = []
    for block_min in (1, 10**9):
        monkeypatch.setattr(script, "BLOCK_MIN_COMMANDS", block_min)
        shim = ScriptCountingShim(kernel_nft)
        h = make(shim, v, text_threshold=0)
        program_typical(h)
        _with_output_hook(h)
        h.root.apply()
        if drift is not None:
            _kernel_drift(v)[drift]()
            h.root.queue_resync()
            h.root.apply()
        blocks = sum(f"\ntable {hp.family(v)} calico {{\n" in f"\n{t}" for t in shim.texts)
        assert (blocks == (1 if drift is None else 2)) if block_min == 1 else blocks == 0
        sent = shim.runs + shim.scripts
        h.root.queue_resync()
        h.root.apply()
        assert shim.runs + shim.scripts == sent, "the read-back found something to fix"
        assert h.sleeps == []
        listings.append(_take_table(kernel_nft, v))
    assert listings[0] == listings[1]


@V46
def test_sets_written_ahead_program_the_same_table(kernel_nft: NftShim, make: Callable[..., Harness], v: int) -> None:
    """Sets that go ahead of the rules in a transaction of their own (``apply_updates`` at start of day, over
    the prefetched listing) leave the kernel as the one transaction does, and read back in sync."""
    listings = []
    for ahead in (1, 10**9):
        shim = ScriptCountingShim(kernel_nft)
        h = make(shim, v, text_threshold=0, sets_ahead_min=ahead, lister=kernel_nft,
                 start_background=lambda job: job())
        program_typical(h)
        _with_output_hook(h)
        h.root.prefetch()
        h.root.apply_updates()
        assert shim.scripts == (1 if ahead == 1 else 0)
        h.root.apply()
        sent = shim.runs + shim.scripts
        restarted = make(shim, v, text_threshold=0, sets_ahead_min=1)
        program_typical(restarted)
        _with_output_hook(restarted)
        restarted.root.apply_updates()
        restarted.root.apply()
        assert shim.runs + shim.scripts == sent, "the read-back found something to fix"
        assert h.sleeps == []
        listings.append(_take_table(kernel_nft, v))
    assert listings[0] == listings[1]


def test_refused_script_falls_back_to_json(kernel_nft: NftShim, make: Callable[..., Harness]) -> None:
    from felixpy.drivers.generictables.model import Log
    h = make(kernel_nft, 4, text_threshold=0)
    program_typical(h)
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Log('say "hi"')),)))   # no quotes in nft text
    h.root.apply()
    assert len(h.sleeps) == 1
    assert len(hp.chains(kernel_nft, 4)["filter-cali-fw-cali5678"]["rules"]) == 1


class ScriptCountingShim(CountingShim):
    """Also takes scripts (so the table may send them), counting those apart."""

    def __init__(self, inner: NftShim) -> None:
        super().__init__(inner)
        self.scripts = 0
        self.texts: list[str] = []

    def run_script(self, script: str) -> None:
        self.scripts += 1
        self.texts.append(script)
        self.inner.run_script(script)  # type: ignore[attr-defined]


def test_small_transactions_go_as_scripts_until_one_is_refused_then_as_json(
        kernel_nft: NftShim, make: Callable[..., Harness]) -> None:
    """Below the big-transaction threshold a transaction is sent as an nft script too (cheaper than
    JSON for nft to parse, and nothing to encode); once nft refuses one that its JSON retry gets through
    (a log prefix with a quote), the table sends small transactions as JSON without failing first."""
    from felixpy.drivers.generictables.model import Log
    shim = ScriptCountingShim(kernel_nft)
    h = make(shim, 4)  # the default threshold: every transaction here is small
    program_typical(h)
    h.root.apply()
    assert shim.scripts >= 1 and shim.runs == 0 and h.sleeps == []
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Log('say "hi"')),)))
    h.root.apply()
    assert len(h.sleeps) == 1 and shim.runs == 1  # refused as text, taken as JSON
    assert len(hp.chains(kernel_nft, 4)["filter-cali-fw-cali5678"]["rules"]) == 1
    scripts = shim.scripts
    h.filter.update_chain(Chain("cali-fw-cali5678", (Rule(Match(), Log('say "bye"')), Rule(Match(), Log("x")))))
    h.root.apply()
    assert len(h.sleeps) == 1 and shim.scripts == scripts and shim.runs == 2  # JSON at once
    assert len(hp.chains(kernel_nft, 4)["filter-cali-fw-cali5678"]["rules"]) == 2
