"""IptablesTable against the real kernel, inside throwaway network namespaces.

Every command runs inside a fresh namespace (the runner forks it there; never in
the root namespace) and always with ``--wait``.  Parametrised over legacy and nft-backed
iptables, IPv4 and IPv6.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from felixpy.drivers.cmdshim import CommandResult, SubprocessRunner, stdin_text
from felixpy.drivers.generictables.model import (
    ADDR_TYPE_LOCAL, DNAT, DSCP, SNAT, Accept, Chain, ClearMark, Drop, Goto, Jump, LimitNumConnections,
    LimitPacketRate, Log, Masquerade, Match, Nflog, NoTrack, PortRange, Reject, Return, Rule, SetConnMark, SetMark,
)
from felixpy.drivers.iptables import savefile
from felixpy.drivers.iptables.detect import FeatureDetector, detect_backend
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.errors import FatalDataplaneError
from felixpy.testing.netns import run_in

pytestmark = pytest.mark.kernel

if os.geteuid() != 0:  # pragma: no cover
    pytest.skip("kernel tests need root", allow_module_level=True)


class RecordingRunner(SubprocessRunner):
    """A real runner (inside the namespace) that remembers what it ran."""

    def __init__(self, netns: str, env: dict[str, str] | None = None) -> None:
        super().__init__(netns=netns, env=env)
        self.calls: list[tuple[tuple[str, ...], str | None]] = []

    def run(self, argv: Sequence[str], stdin: str | Sequence[str] | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        self.calls.append((tuple(argv), stdin_text(stdin)))
        return super().run(argv, stdin, while_running=while_running)

    def restores(self) -> list[str]:
        return [i or "" for a, i in self.calls if a[0].endswith("-restore")]


@pytest.fixture(params=[("legacy", 4), ("legacy", 6), ("nft", 4), ("nft", 6)], ids=lambda p: f"{p[0]}-v{p[1]}")
def flavour(request: pytest.FixtureRequest) -> tuple[str, int]:
    return request.param  # type: ignore[no-any-return]


def ipt(ns: str, backend: str, ipv: int, *args: str) -> str:
    six = "6" if ipv == 6 else ""
    return run_in(ns, f"ip{six}tables-{backend}", "-w", "5", *args).stdout


def save(ns: str, backend: str, ipv: int, table: str = "filter", counters: bool = True) -> str:
    six = "6" if ipv == 6 else ""
    args = [f"ip{six}tables-{backend}-save", "-t", table] + (["-c"] if counters else [])
    return "".join(ln + "\n" for ln in run_in(ns, *args).stdout.splitlines() if not ln.startswith("#"))


def ping(ns: str, ipv: int, count: int = 3) -> None:
    addr = "::1" if ipv == 6 else "127.0.0.1"
    run_in(ns, "ping", "-c", str(count), "-i", "0.01", "-W", "1", addr, check=False)


def owned_hashes(text: str) -> dict[str, list[str]]:
    st = savefile.parse_save(text, hash_re=savefile.hash_comment_regex(), owned_re=savefile.owned_chain_regex())
    return {c: h for c, h in st.hashes.items() if savefile.owned_chain_regex().match(c)}


def icmp(ipv: int) -> Match:
    return Match().protocol("ipv6-icmp" if ipv == 6 else "icmp")


def chains_for(ipv: int) -> list[Chain]:
    loop = "::1/128" if ipv == 6 else "127.0.0.1/32"
    return [
        Chain("cali-OUTPUT", (
            Rule(Match().out_interface("lo"), Jump("cali-lo")),
            Rule(Match().mark_single_bit_set(0x10000), Accept(), ("Policy explicitly accepted packet.",)),
            Rule(action=Jump("cali-other")),
        )),
        Chain("cali-lo", (
            Rule(action=ClearMark(0x1B0000)),
            Rule(icmp(ipv).dest_net(loop), SetMark(0x10000)),
            Rule(Match().protocol("tcp").dest_ports(80, PortRange(8000, 8080)), Return()),
            Rule(Match().mark_single_bit_set(0x10000), Return()),
        )),
        Chain("cali-other", (Rule(Match().conntrack_state("INVALID"), Drop()), Rule(action=Return()))),
    ]


def make_table(runner: SubprocessRunner, backend: str, ipv: int, table: str = "filter",
               **kw: object) -> IptablesTable:
    return IptablesTable(table, ipv, runner=runner, backend=backend, features=FeatureDetector(runner), **kw)  # type: ignore[arg-type]


def program(t: IptablesTable, ipv: int) -> None:
    t.insert_or_append_rules("OUTPUT", [Rule(action=Jump("cali-OUTPUT"))])
    t.update_chains(chains_for(ipv))


def programmed_beside_a_foreign_rule(netns: str, backend: str, ipv: int) -> tuple[RecordingRunner, IptablesTable]:
    ipt(netns, backend, ipv, "-A", "OUTPUT", "-p", "udp", "-j", "ACCEPT")
    runner = RecordingRunner(netns)
    t = make_table(runner, backend, ipv)
    program(t, ipv)
    t.apply()
    return runner, t


def test_program_restart_and_counters(netns: str, flavour: tuple[str, int]) -> None:
    backend, ipv = flavour
    r1, t1 = programmed_beside_a_foreign_rule(netns, backend, ipv)
    assert len(r1.restores()) == 1
    text = save(netns, backend, ipv)
    want = {c.name: t1.expected_hashes(c.name) for c in chains_for(ipv)}
    assert owned_hashes(text) == want
    assert "-p udp" in text  # foreign rule kept
    ping(netns, ipv)
    before = save(netns, backend, ipv)
    counted = savefile.parse_save_counters(before)
    assert any(r.packets > 0 for r in counted if r.chain == "cali-lo")
    # Restart: a second, fresh table finds everything right and writes nothing.
    r2 = RecordingRunner(netns)
    t2 = make_table(r2, backend, ipv)
    program(t2, ipv)
    t2.apply()
    assert r2.restores() == []
    assert save(netns, backend, ipv) == before


def test_drift_repaired_foreign_kept(netns: str, flavour: tuple[str, int]) -> None:
    backend, ipv = flavour
    r = RecordingRunner(netns)
    t = make_table(r, backend, ipv)
    program(t, ipv)
    t.apply()
    want = owned_hashes(save(netns, backend, ipv))
    # An externally deleted rule, a flushed chain, foreign rules inserted into OUTPUT and into our chain.
    ipt(netns, backend, ipv, "-D", "cali-lo", "2")
    ipt(netns, backend, ipv, "-F", "cali-other")
    ipt(netns, backend, ipv, "-I", "OUTPUT", "1", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
    ipt(netns, backend, ipv, "-I", "cali-OUTPUT", "2", "-j", "ACCEPT")
    t.invalidate_dataplane_cache("test")  # as the refresh / post-write timers do
    t.apply()
    text = save(netns, backend, ipv, counters=False)
    assert owned_hashes(text) == want
    output = [ln for ln in text.splitlines() if ln.startswith("-A OUTPUT ")]
    assert len(output) == 2 and "cali:" in output[0] and "--dport 22" in output[1]  # ours back on top
    # Nothing left to do.
    n = len(r.restores())
    t.invalidate_dataplane_cache("test")
    t.apply()
    assert len(r.restores()) == n


def test_changed_rule_rewrites_only_its_chain(netns: str, flavour: tuple[str, int]) -> None:
    backend, ipv = flavour
    r = RecordingRunner(netns)
    t = make_table(r, backend, ipv)
    program(t, ipv)
    t.apply()
    ping(netns, ipv)
    before = savefile.parse_save_counters(save(netns, backend, ipv))
    lo = chains_for(ipv)[1]
    changed = Chain("cali-lo", lo.rules[:3] + (Rule(Match().mark_single_bit_set(0x10000), Accept()),))
    t.update_chain(changed)
    t.apply()
    body = [ln for ln in r.restores()[-1].splitlines() if ln[:1] in "-:"]
    assert body and all(ln.split()[0 if ln.startswith(":") else 1].lstrip(":") == "cali-lo" for ln in body)
    if backend == "legacy":
        assert body == [ln for ln in body if ln.startswith("-R cali-lo 4 ")]
    after = savefile.parse_save_counters(save(netns, backend, ipv))
    untouched = lambda rules: [(x.chain, x.hash, x.packets) for x in rules if x.chain != "cali-lo"]  # noqa: E731
    assert untouched(after) == untouched(before)
    if backend == "legacy":  # per-position replace: the unchanged rules of cali-lo keep their counters
        assert [x.packets for x in after if x.chain == "cali-lo"][:3] == \
            [x.packets for x in before if x.chain == "cali-lo"][:3]
    assert owned_hashes(save(netns, backend, ipv))["cali-lo"] == t.expected_hashes("cali-lo")


def test_stale_state_from_previous_run_is_swept(netns: str, flavour: tuple[str, int]) -> None:
    backend, ipv = flavour
    t1 = make_table(SubprocessRunner(netns), backend, ipv)
    program(t1, ipv)
    t1.insert_or_append_rules("INPUT", [Rule(action=Jump("cali-other"))])
    t1.update_chain(Chain("cali-stale", (Rule(action=Drop()),)))
    t1.update_chain(Chain("cali-other", chains_for(ipv)[2].rules + (Rule(action=Goto("cali-stale")),)))
    t1.apply()
    assert "cali-stale" in save(netns, backend, ipv)
    ipt(netns, backend, ipv, "-A", "INPUT", "-p", "udp", "-j", "ACCEPT")
    t2 = make_table(SubprocessRunner(netns), backend, ipv)  # the new run wants less
    program(t2, ipv)
    t2.apply()
    text = save(netns, backend, ipv, counters=False)
    assert "cali-stale" not in text
    assert [ln for ln in text.splitlines() if ln.startswith("-A INPUT")] == ["-A INPUT -p udp -j ACCEPT"]
    assert owned_hashes(text) == {c.name: t2.expected_hashes(c.name) for c in chains_for(ipv)}


def every_fragment_chains(ipv: int) -> dict[str, list[Chain]]:
    """One of nearly every criterion and action, in the tables where the kernel accepts them."""
    net = "2001:db8::/64" if ipv == 6 else "10.65.0.0/16"
    addr = "2001:db8::1" if ipv == 6 else "10.65.0.1"
    setn = f"cali{ipv}0s:test"
    icmp_m = (Match().protocol("ipv6-icmp").icmpv6_type_and_code(1, 0).not_icmpv6_type(2) if ipv == 6
              else Match().protocol("icmp").icmp_type_and_code(3, 1).not_icmp_type(8))
    filt = Chain("cali-all", (
        Rule(Match().mark_clear(0x10000).mark_not_clear(0x20000).not_mark_matches_with_mask(0x40000, 0xc0000)),
        Rule(Match().conn_mark_matches_with_mask(0x1, 0x3), Return()),
        Rule(Match().in_interface("cali+").not_out_interface("eth0"), Drop()),
        Rule(Match().src_addr_type(ADDR_TYPE_LOCAL, True).not_dest_addr_type(ADDR_TYPE_LOCAL), Accept()),
        Rule(Match().not_conntrack_state("RELATED,ESTABLISHED"), Reject()),
        Rule(Match().protocol("tcp").not_source_ports(1, PortRange(2, 3)).not_dest_ports(4), Reject("tcp-reset")),
        Rule(Match().not_protocol("udp").source_net(net).not_dest_net(net), Log("calico-packet")),
        Rule(Match().source_ip_set(setn).not_dest_ip_set(setn), Nflog(1, "API0|default.p", 80)),
        Rule(Match().protocol_num(17).dest_port(4789), Drop()),
        Rule(icmp_m, Accept()),
        Rule(Match().limit("10/second", 5), action=LimitPacketRate(100, 5, 0x80000)),
        Rule(Match().protocol("tcp").tcp_flags_set("SYN").conn_limit_above(10, 32 if ipv == 4 else 128), Drop()),
        Rule(action=LimitNumConnections(10)),
        Rule(Match().not_protocol_num(4), action=SetConnMark(0x1, 0x1), comments=("weird/\"comment\"!",)),
    ))
    dnat = Chain("cali-dnat", (Rule(Match().protocol("tcp").dest_net(net), DNAT(addr, 8080)),
                               Rule(Match().dest_net(net), DNAT(addr))))
    nat = Chain("cali-nat", (
        Rule(Match().out_interface("vxlan.calico").not_src_addr_type(ADDR_TYPE_LOCAL, True), Masquerade()),
        Rule(Match().protocol("udp"), Masquerade("1024-65535")),
        Rule(Match().source_net(net), SNAT(addr)),
    ))
    raw = Chain("cali-raw", (Rule(Match().rpf_check_failed(), Drop()), Rule(Match().protocol("udp"), NoTrack())))
    mangle = Chain("cali-mangle", (Rule(Match().protocol("tcp"), DSCP(23)), Rule(action=SetMark(0x100000))))
    return {"filter": [("FORWARD", filt)], "nat": [("POSTROUTING", nat), ("PREROUTING", dnat)],
            "raw": [("PREROUTING", raw)], "mangle": [("POSTROUTING", mangle)]}


def test_every_fragment_is_accepted_and_reads_back(netns: str, flavour: tuple[str, int]) -> None:
    backend, ipv = flavour
    fam = "inet6" if ipv == 6 else "inet"
    run_in(netns, "ipset", "create", f"cali{ipv}0s:test", "hash:net", "family", fam)
    for table, hooked in every_fragment_chains(ipv).items():
        tables = []
        for r in (RecordingRunner(netns), RecordingRunner(netns)):  # program, then restart
            t = make_table(r, backend, ipv, table)
            for hook, chain in hooked:
                t.insert_or_append_rules(hook, [Rule(action=Jump(chain.name))])
                t.update_chain(chain)
            t.apply()
            tables.append((t, r))
        assert tables[1][1].restores() == [], table
        got = owned_hashes(save(netns, backend, ipv, table))
        assert got == {c.name: tables[1][0].expected_hashes(c.name) for _, c in hooked}


def test_backend_detection_in_namespace(netns: str) -> None:
    runner = SubprocessRunner(netns)
    assert detect_backend(runner, "auto") == "legacy"  # empty: tie goes to legacy
    run_in(netns, "iptables-nft", "-w", "5", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
    assert detect_backend(runner, "auto") == "nft"
    assert detect_backend(runner, "legacy") == "legacy"
    # Detection did not instantiate legacy tables next to the nft ones.
    assert run_in(netns, "cat", "/proc/net/ip_tables_names").stdout.strip() == ""


@pytest.fixture
def failing_restore(tmp_path: Path) -> Callable[[str], dict[str, str]]:
    def make(name: str) -> dict[str, str]:
        stub = tmp_path / name
        stub.write_text("#!/bin/sh\necho 'iptables-restore: line 1 failed (stub)' >&2\nexit 1\n")
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return {**os.environ, "PATH": f"{tmp_path}:{os.environ.get('PATH', '')}"}
    return make


def test_always_failing_restore_is_fatal(netns: str, flavour: tuple[str, int],
                                         failing_restore: Callable[[str], dict[str, str]]) -> None:
    backend, ipv = flavour
    six = "6" if ipv == 6 else ""
    env = failing_restore(f"ip{six}tables-{backend}-restore")  # a stub earlier on PATH
    r = RecordingRunner(netns, env=env)
    sleeps: list[float] = []
    t = make_table(r, backend, ipv, sleep=sleeps.append)
    program(t, ipv)
    before = save(netns, backend, ipv)
    with pytest.raises(FatalDataplaneError):
        t.apply()
    assert len(r.restores()) == 11  # 1 + 10 retries
    assert sleeps == [0.001 * 2 ** i for i in range(10)]
    assert save(netns, backend, ipv) == before  # nothing written


def test_append_mode_and_always_appended_rules(netns: str, flavour: tuple[str, int]) -> None:
    backend, ipv = flavour
    ipt(netns, backend, ipv, "-A", "FORWARD", "-p", "udp", "-j", "ACCEPT")
    ipt(netns, backend, ipv, "-I", "FORWARD", "1", "-p", "tcp", "-j", "ACCEPT")
    r = RecordingRunner(netns)
    t = make_table(r, backend, ipv, insert_mode="append")
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-other"))])
    t.append_rules("FORWARD", [Rule(Match().mark_single_bit_set(0x10000), Accept())])
    t.update_chain(chains_for(ipv)[2])
    t.apply()
    fwd = [ln for ln in save(netns, backend, ipv, counters=False).splitlines() if ln.startswith("-A FORWARD")]
    assert ["cali:" in ln for ln in fwd] == [False, False, True, True]
    assert "-j cali-other" in fwd[2] and "--mark 0x10000/0x10000" in fwd[3]
    t2 = make_table(RecordingRunner(netns), backend, ipv, insert_mode="append")
    t2.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-other"))])
    t2.append_rules("FORWARD", [Rule(Match().mark_single_bit_set(0x10000), Accept())])
    t2.update_chain(chains_for(ipv)[2])
    t2.apply()
    assert t2._runner.restores() == []  # type: ignore[attr-defined]


def test_an_unhooked_write_in_several_transactions_lands_whole_and_restarts_clean(
        netns: str, flavour: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The start of day's write cut into transactions (iptables-nft; legacy keeps one) ends as one
    transaction would: every chain and rule in place, the hook last, the foreign rule kept, and a
    restarted table finds nothing to write."""
    from felixpy.drivers.iptables import table as table_mod
    monkeypatch.setattr(table_mod, "UNHOOKED_TRANSACTION_LINES", 7)
    backend, ipv = flavour
    r1, t1 = programmed_beside_a_foreign_rule(netns, backend, ipv)
    (text_in,) = r1.restores()
    commits = text_in.count("\nCOMMIT\n")
    assert commits == 1 if backend == "legacy" else commits >= 3
    assert text_in.rstrip("\n").split("\n")[-2].startswith("-I OUTPUT")  # the hook: in the last transaction
    text = save(netns, backend, ipv)
    assert owned_hashes(text) == {c.name: t1.expected_hashes(c.name) for c in chains_for(ipv)}
    assert "-p udp" in text
    r2 = RecordingRunner(netns)
    t2 = make_table(r2, backend, ipv)
    program(t2, ipv)
    t2.apply()
    assert r2.restores() == []
