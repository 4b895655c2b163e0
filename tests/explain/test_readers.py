"""The readers against a kernel that serves the captured state through the tools' command lines.

:class:`CapturedKernel` is a :class:`~felixpy.drivers.cmdshim.CommandRunner` answering
``ip[6]tables-*-save``, ``iptables -S <chain>``, ``ipset save [NAME]``, ``nft -j list
table|chain|set|map`` and ``ip -j addr|route`` from one capture (tests/explain/data), and
failing like the real tools for what is not there.  Per-chain (lazy) reading must give
exactly the answers a full dump gives, and every mode must be found by :func:`read_kernel`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from felixpy.drivers.cmdshim import CommandResult
from felixpy.explain.ipt_parse import SaveIndex, block_specs
from felixpy.explain.packet import make_packet
from felixpy.explain.query import explain_packet
from felixpy.explain.readers import read_kernel

DATA = Path(__file__).parent / "data"
MODES = ("iptables-legacy", "iptables-nft", "nftables")
CASES = {4: [("10.65.0.2", "10.65.0.3", "tcp", 8080, None), ("10.65.0.4", "10.65.0.3", "tcp", 8080, None),
             ("10.65.0.9", "10.65.0.3", "tcp", 8081, "calic"), ("10.65.0.4", "10.65.0.2", "icmp", None, None),
             ("10.65.0.5", "10.65.0.2", "udp", 5353, "calid"), ("10.99.0.1", "10.65.0.3", "udp", 5353, None),
             ("10.65.0.2", "10.99.0.1", "tcp", 22, None)],
         6: [("fd00:65::2", "fd00:65::3", "tcp", 8080, None), ("fd00:65::4", "fd00:65::3", "tcp", 8080, None),
             ("fd00:65::9", "fd00:65::3", "tcp", 8081, "calic"), ("fd00:65::4", "fd00:65::2", "icmpv6", None, None),
             ("fd00:65::5", "fd00:65::2", "udp", 5353, "calid"), ("fd00:99::1", "fd00:65::3", "udp", 5353, None)]}


class CapturedKernel:
    def __init__(self, mode: str | None) -> None:
        self.mode = mode
        self.calls: list[tuple[str, ...]] = []
        self.dir = DATA / (mode or "iptables-legacy")

    def _file(self, name: str) -> str:
        return (self.dir / name).read_text()

    def run(self, argv: Sequence[str], stdin: str | None = None, **_: object) -> CommandResult:
        args = tuple(argv)
        self.calls.append(args)
        out = self._answer(args)
        if out is None:
            return CommandResult(1, "", "not found", args)
        return CommandResult(0, out, "", args)

    def _answer(self, a: tuple[str, ...]) -> str | None:  # noqa: C901
        tool = a[0]
        if tool == "cat" and a[1].startswith("/proc/net/ip"):
            # The legacy tables that exist: those of the capture's save (none outside legacy mode).
            if self.mode != "iptables-legacy":
                return ""
            return "".join(f"{t}\n" for t in SaveIndex(self._file(
                f"ip{'6' if a[1].startswith('/proc/net/ip6') else ''}tables-save.txt")).tables)
        if tool == "ip":
            if a[1:3] == ("-j", "addr"):
                return self._file("addr.json")
            return self._file(f"route{a[1][1]}.json")
        if self.mode is None:
            return "" if tool.endswith("-save") or tool == "ipset" else None
        if tool.startswith("ip") and "tables" in tool:
            backend = tool.split("-")[1]
            if self.mode != f"iptables-{backend}":
                return "" if tool.endswith("-save") else None
            v6 = tool.startswith("ip6")
            save = self._file(f"ip{'6' if v6 else ''}tables-save.txt")
            if tool.endswith("-save"):
                return _one_table(save, a[a.index("-t") + 1]) if "-t" in a else save
            table, chain = a[a.index("-t") + 1], a[a.index("-S") + 1]
            index = SaveIndex(save)
            policy = index.declaration(table, chain)
            if policy is None:
                return None
            head = f"-N {chain}" if policy == "-" else f"-P {chain} {policy}"
            return "\n".join([head] + [f"-A {chain} {spec}" for spec in block_specs(index.block(table, chain))]) + "\n"
        if tool == "ipset":
            if self.mode == "nftables":
                return ""
            lines = self._file("ipset-save.txt").splitlines()
            if len(a) == 3:
                lines = [ln for ln in lines if ln.split()[1] == a[2]]
                if not lines:
                    return None
            return "\n".join(lines) + "\n"
        if tool == "nft":
            if self.mode != "nftables":
                return None
            kind, family, table = a[3], a[4], a[5]
            objs = [o for o in json.loads(self._file("nft.json"))["nftables"]
                    if any(isinstance(v, dict) and v.get("family") == family and v.get("table", v.get("name")) == table
                           for v in o.values())]
            if kind == "table":
                return json.dumps({"nftables": objs}) if objs else None
            name = a[6]
            if kind == "chain":
                sel = [o for o in objs if ("chain" in o and o["chain"]["name"] == name) or
                       ("rule" in o and o["rule"]["chain"] == name)]
            else:
                sel = [o for o in objs if kind in o and o[kind]["name"] == name]
            return json.dumps({"nftables": sel}) if sel else None
        return None


def _one_table(save: str, table: str) -> str | None:
    """What ``*-save -t <table>`` prints: that table's block of the whole save."""
    lines = save.splitlines()
    try:
        start = lines.index(f"*{table}")
    except ValueError:
        return None
    end = lines.index("COMMIT", start)
    return "\n".join(["# Generated by test", *lines[start:end + 1], "# Completed"]) + "\n"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("v", [4, 6])
def test_lazy_reading_answers_as_a_full_dump(mode: str, v: int) -> None:
    lazy_k, full_k = CapturedKernel(mode), CapturedKernel(mode)
    lazy, full = read_kernel(lazy_k, v, full=False), read_kernel(full_k, v, full=True)
    assert lazy.ruleset is not None and full.ruleset is not None
    assert lazy.ruleset.backend == full.ruleset.backend == mode
    for src, dst, proto, dport, from_iface in CASES[v]:
        pkt = make_packet(src, dst, proto, dport=dport)
        a = explain_packet(lazy, pkt, from_iface=from_iface).json()
        b = explain_packet(full, pkt, from_iface=from_iface).json()
        assert a == b, f"{src} -> {dst} {proto}/{dport}"
    # Lazily, only what the packets reached was listed: never a whole dump.
    assert not any(c[0].endswith("-save") or c[:4] == ("nft", "-j", "list", "table") for c in lazy_k.calls)


@pytest.mark.parametrize("full", [False, True])
def test_no_felixpy_state_is_reported(full: bool) -> None:
    st = read_kernel(CapturedKernel(None), 4, full=full)
    assert st.ruleset is None


@pytest.mark.parametrize("mode", MODES)
def test_mode_is_detected_and_can_be_forced(mode: str) -> None:
    assert read_kernel(CapturedKernel(mode), 4).ruleset.backend == mode  # type: ignore[union-attr]
    other = next(m for m in MODES if m != mode)
    assert read_kernel(CapturedKernel(mode), 4, mode=other).ruleset is None


@pytest.mark.parametrize("mode", MODES)
def test_default_read_is_the_cheaper_one_for_the_mode(mode: str) -> None:
    k = CapturedKernel(mode)
    read_kernel(k, 4)
    dumped = any(c[0].endswith("-save") and "legacy" in c[0] for c in k.calls)
    assert dumped == (mode == "iptables-legacy")
    # nft fills its cache with every rule of every table for any listing (20 s beside 129k rules):
    # no probe lists all tables or the ruleset.
    assert not any(c[0] == "nft" and ("tables" in c or "ruleset" in c) for c in k.calls)


def test_legacy_full_read_starts_the_filter_save_before_importing_any_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """In iptables-legacy mode the filter table's save is the answer's wall time: the reader must have
    it running before it imports the save parser (an import holds the GIL and the import lock while the
    other readers and the main thread import theirs).  Pinned by asking, inside the save itself,
    whether the parser is loaded — with it taken out of ``sys.modules`` first."""
    import sys

    import felixpy.explain
    from felixpy.explain.readers import IptablesReader

    for name in ("ipt_parse", "ipset_parse"):   # ``from felixpy.explain import x`` finds the attribute first
        monkeypatch.delitem(sys.modules, f"felixpy.explain.{name}", raising=False)
        monkeypatch.delattr(felixpy.explain, name, raising=False)
    k = CapturedKernel("iptables-legacy")
    loaded_at_filter_save: list[bool] = []
    real_run = k.run

    def run(argv: Sequence[str], stdin: str | None = None, **kw: object) -> CommandResult:
        if argv[0].endswith("-save") and list(argv[-2:]) == ["-t", "filter"]:
            loaded_at_filter_save.append("felixpy.explain.ipt_parse" in sys.modules)
        return real_run(argv, stdin)

    monkeypatch.setattr(k, "run", run)
    rs = IptablesReader("legacy").read(k, 4, full=True)
    assert rs is not None and "filter/cali-FORWARD" in rs.chains
    assert loaded_at_filter_save == [False]
    assert "felixpy.explain.ipt_parse" in sys.modules     # parsed afterwards
