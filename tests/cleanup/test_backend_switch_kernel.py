"""Backend switches against the real kernel: each a restart with a new mode over the same namespace.

legacy → iptables-nft → nftables → legacy, IPv4 and IPv6 at once (``Ipv6Support``).  Each step builds a
fresh dataplane with the daemon's own wiring and real kernel access (this thread inside a throwaway
namespace), feeds it the same datastore and applies once.  After each switch:

* zero objects of the previous backend remain (no ``cali`` line in either iptables backend that is not
  active, no ``calico`` nft table in iptables modes, no Calico ipset in nftables mode);
* the new backend is complete: its normalised dump equals that of a clean start of the same mode in a
  fresh namespace;
* foreign rules, chains, tables and sets — in every backend — survive.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator

import pytest

from felixpy.config import Config
from felixpy.testing.clock import FakeClock
from felixpy.dataplane.wiring import BuiltDataplane, KernelDeps, build
from felixpy.drivers.procsys import FakeSysctls
from felixpy.drivers.routetable import DummyTable
from felixpy.feed.scenario import scenario_from_dict
from felixpy.messages import payload_of
from felixpy.testing import netns as nsmod

pytestmark = pytest.mark.kernel

if os.geteuid() != 0:  # pragma: no cover
    pytest.skip("kernel tests need root", allow_module_level=True)

MODES = {
    "iptables-legacy": {"IptablesBackend": "legacy"},
    "iptables-nft": {"IptablesBackend": "nft"},
    "nftables": {"NFTablesMode": "Enabled"},
}

DATASTORE = {
    "ipsets": [{"id": "s:clients", "members": ["10.65.0.2/32", "fd00:65::2/128"]}],
    "policies": [{"name": "allow-clients", "inbound": [{"action": "allow", "src_ip_set_ids": ["s:clients"]}],
                  "outbound": [{"action": "allow"}]}],
    "profiles": [{"name": "kns.fv", "inbound": [{"action": "allow"}], "outbound": [{"action": "allow"}]}],
    "workloads": [{"name": f"cali{n}", "state": "active", "ipv4_nets": [f"10.65.0.{i}/32"],
                   "ipv6_nets": [f"fd00:65::{i}/128"], "profile_ids": ["kns.fv"],
                   "tiers": [{"name": "default", "ingress": ["allow-clients"]}]}
                  for i, n in ((2, "a"), (3, "b"))],
}


def config(mode: str) -> Config:
    return Config(FelixHostname="node1", Ipv6Support=True, **MODES[mode])  # type: ignore[arg-type]


def start(mode: str) -> BuiltDataplane:
    """A restart in *mode*: a fresh dataplane over this thread's namespace, fed and applied once."""
    deps = KernelDeps(sysctls=FakeSysctls(), main_route_table=lambda c, v: DummyTable(v))
    built = build(config(mode), clock=FakeClock(), deps=deps)
    dp = built.dataplane
    for env in scenario_from_dict({"config": {}, **DATASTORE}).initial:
        dp.on_datastore_message(payload_of(env)[1])
    dp.set_iface_in_sync()
    try:
        report = dp.apply()
        assert report.ok, f"{mode}: apply failed: {report}"
        assert all(getattr(c, "done", False) for c in dp.cleanups), f"{mode}: cleanup not finished"
    finally:
        dp.close()
    return built


def sh(*args: str) -> str:
    # This thread is inside the namespace: a plain subprocess inherits it (never the root namespace).
    import subprocess

    return subprocess.run(list(args), check=True, capture_output=True, text=True).stdout


def ipt_save(backend: str, v: int) -> str:
    six = "6" if v == 6 else ""
    return sh(f"ip{six}tables-{backend}-save")


def nft_tables() -> set[str]:
    return {ln.removeprefix("table ").strip() for ln in sh("nft", "list", "tables").splitlines() if ln.strip()}


def ipsets() -> set[str]:
    return set(sh("ipset", "list", "-name").split())


_COUNTERS = re.compile(r"\[\d+:\d+\]")
_NFT_COUNTERS = re.compile(r"counter packets \d+ bytes \d+")
_INITVAL = re.compile(r" initval 0x[0-9a-f]+")


def normalised(mode: str) -> dict[str, list[str]]:
    """The active backend's dump without counters, comments or timestamps (what a clean start compares to)."""
    out: dict[str, list[str]] = {}
    if mode == "nftables":
        for fam in ("ip", "ip6"):
            text = sh("nft", "list", "table", fam, "calico")
            out[fam] = [_NFT_COUNTERS.sub("counter", ln.strip()) for ln in text.splitlines() if ln.strip()]
    else:
        backend = mode.split("-")[1]
        for v in (4, 6):
            table = "?"
            for ln in ipt_save(backend, v).splitlines():
                if ln.startswith("*"):
                    table = ln[1:]  # tables in the order they were loaded: compare per table
                if not ln.startswith("#") and "FOREIGN" not in ln and "9999" not in ln:
                    out.setdefault(f"v{v} {table}", []).append(_COUNTERS.sub("", ln))
        out["ipsets"] = sorted(_INITVAL.sub("", ln) for ln in sh("ipset", "save").splitlines() if "foreign" not in ln)
    return out


def add_foreign() -> None:
    for backend in ("legacy", "nft"):
        for six in ("", "6"):
            sh(f"ip{six}tables-{backend}", "-w", "5", "-A", "FORWARD", "-p", "udp", "--dport", "9999", "-j", "ACCEPT")
            sh(f"ip{six}tables-{backend}", "-w", "5", "-N", "FOREIGN-chain")
            sh(f"ip{six}tables-{backend}", "-w", "5", "-A", "FOREIGN-chain", "-p", "tcp", "--dport", "9999",
               "-j", "DROP")
    sh("nft", "add", "table", "ip", "foreign")
    sh("nft", "add", "chain", "ip", "foreign", "c")
    sh("ipset", "create", "foreign-set", "hash:ip")


def assert_foreign_intact() -> None:
    for backend in ("legacy", "nft"):
        for v in (4, 6):
            text = ipt_save(backend, v)
            assert "-A FORWARD -p udp -m udp --dport 9999 -j ACCEPT" in text, (backend, v, text)
            assert "-A FOREIGN-chain -p tcp -m tcp --dport 9999 -j DROP" in text, (backend, v, text)
    assert "ip foreign" in nft_tables()
    assert "foreign-set" in ipsets()


def assert_only(mode: str) -> None:
    """Nothing of ours outside *mode*'s backend."""
    active = mode.split("-")[1] if mode.startswith("iptables") else None
    for backend in ("legacy", "nft"):
        if backend == active:
            continue
        for v in (4, 6):
            text = ipt_save(backend, v)
            assert "cali" not in text, f"{mode}: {backend} v{v} still holds Calico objects:\n{text}"
    tables = nft_tables()
    if mode == "nftables":
        assert {"ip calico", "ip6 calico"} <= tables
        assert not {n for n in ipsets() if n.startswith(("cali", "felix-"))}, ipsets()
    else:
        assert not {"ip calico", "ip6 calico"} & tables, tables
        assert any(n.startswith("cali40") for n in ipsets()) and any(n.startswith("cali60") for n in ipsets())


@pytest.fixture(scope="module")
def clean_dumps() -> dict[str, dict[str, list[str]]]:
    """Each mode's dump after a clean start in its own fresh namespace."""
    out = {}
    for mode in MODES:
        with nsmod.netns("fpyt") as ns, nsmod.entered(ns):
            start(mode)
            out[mode] = normalised(mode)
    return out


@pytest.fixture
def switched_ns(in_netns: str) -> Iterator[str]:
    add_foreign()
    yield in_netns


def test_legacy_nft_nftables_legacy(switched_ns: str, clean_dumps: dict[str, dict[str, list[str]]]) -> None:
    sequence = ["iptables-legacy", "iptables-nft", "nftables", "iptables-legacy"]
    for i, mode in enumerate(sequence):
        built = start(mode)
        assert built.mode == mode
        assert_only(mode)
        got = normalised(mode)
        assert set(got) == set(clean_dumps[mode]), f"{mode}: tables differ from a clean start"
        for key, want in clean_dumps[mode].items():
            diff = "\n".join(difflib.unified_diff(want, got[key], "clean start", "after switch", lineterm=""))
            assert not diff, f"{mode} (after {sequence[i - 1] if i else 'nothing'}) {key} differs:\n{diff}"
        assert_foreign_intact()
        if i:  # the switch removed something, so the test saw a real switch
            removed = sum(getattr(c, "removed_chains", 0) + getattr(c, "removed", 0)
                          for c in built.dataplane.cleanups)
            assert removed > 0, f"{mode}: the switch from {sequence[i - 1]} removed nothing"


def test_restart_in_the_same_mode_cleans_nothing_and_writes_nothing(in_netns: str) -> None:
    """No switch: the cleanups find nothing, and the active backend is not rewritten."""
    start("iptables-nft")
    before = normalised("iptables-nft")
    built = start("iptables-nft")
    assert sum(getattr(c, "removed_chains", 0) + getattr(c, "removed", 0) for c in built.dataplane.cleanups) == 0
    assert normalised("iptables-nft") == before
