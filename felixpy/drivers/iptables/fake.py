"""A stateful fake of ``ip[6]tables-{legacy,nft}-{save,restore}`` for unit tests.

:class:`FakeIptables` is a :class:`~felixpy.drivers.cmdshim.CommandRunner`:
it holds real table state per (backend, IP version, table), applies
``*-restore`` input one transaction at a time — a transaction lands whole at
``COMMIT`` or not at all, as the kernel does — and prints ``*-save`` output
(with ``-c`` counters) from that state.  Tests assert the resulting state,
never the sequence of calls.

It behaves like the real tools where the table relies on them:

* ``--noflush``: ``:<chain> - -`` creates a chain or flushes it; without it the
  whole table is replaced;
* a jump/goto to a missing chain, a replace/delete out of range, a delete of a
  rule that is not there, deleting a non-empty, built-in or referenced chain:
  the restore fails and that transaction is discarded;
* the iptables-nft quirk Felix works around: a chain still referenced at the
  *start* of a transaction cannot be deleted in it;
* ``*-save`` prints rules the way iptables-save does (``-j`` for ``--jump``,
  addresses/interfaces/protocol first), so parsers cannot rely on an echo.

Failure injection: :attr:`fail_next_restores`, :attr:`fail_all_restores`,
:attr:`lock_timeout_next_restores`, :attr:`fail_next_saves`,
:attr:`fail_all_saves`, :attr:`nft_incompatible`.  Tests give the table
:class:`~felixpy.testing.clock.FakeClock`'s ``monotonic`` and ``sleep``, which only advance virtual time.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from felixpy.drivers.cmdshim import CommandResult

BUILTIN_CHAINS: dict[str, tuple[str, ...]] = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
    "security": ("INPUT", "FORWARD", "OUTPUT"),
}
_TOOL_RE = re.compile(r"^ip(6?)tables(?:-(legacy|nft))?(?:-(save|restore))?$")
_TARGET_RE = re.compile(r"(?:^|\s)(?:-j|--jump|-g|--goto)\s+(\S+)")
_LONG_TO_SHORT = {"--jump": "-j", "--goto": "-g", "--in-interface": "-i", "--out-interface": "-o",
                  "--source": "-s", "--destination": "-d", "--protocol": "-p"}
_FIRST_OPTS = ("-s", "-d", "-i", "-o", "-p")
LOCK_MESSAGE = "Another app is currently holding the xtables lock. Stopped waiting after 10s."


@dataclass(slots=True, eq=False)
class FakeRule:
    spec: str              # canonical text after "-A <chain> "
    tokens: tuple[str, ...]
    target: str | None
    packets: int = 0
    bytes: int = 0


@dataclass(slots=True)
class FakeChain:
    builtin: bool
    policy: str = "-"
    rules: list[FakeRule] = field(default_factory=list)

    def copy(self) -> FakeChain:
        return FakeChain(self.builtin, self.policy, list(self.rules))


class RestoreError(Exception):
    pass


def _quote(tok: str) -> str:
    if tok == "" or any(ch in tok for ch in ' \t"\''):
        return '"' + tok.replace('"', '\\"') + '"'
    return tok


def canonical_tokens(spec: str) -> tuple[str, ...]:
    """iptables-save's ordering and short options, enough to compare rules by value."""
    toks = [_LONG_TO_SHORT.get(t, t) for t in shlex.split(spec)]
    first: dict[str, list[str]] = {}
    rest: list[str] = []
    i = 0
    while i < len(toks):
        neg = toks[i] == "!" and i + 1 < len(toks) and toks[i + 1] in _FIRST_OPTS
        opt = toks[i + 1] if neg else toks[i]
        if opt in _FIRST_OPTS and (i + (2 if neg else 1)) < len(toks):
            val = toks[i + (2 if neg else 1)]
            first[opt] = (["!"] if neg else []) + [opt, val]
            i += 3 if neg else 2
            continue
        rest.append(toks[i])
        i += 1
    out: list[str] = []
    for opt in _FIRST_OPTS:
        out.extend(first.get(opt, []))
    return tuple(out + rest)


def _render_tokens(toks: Sequence[str]) -> str:
    out = []
    prev = ""
    for t in toks:
        out.append('"' + t + '"' if prev == "--comment" else _quote(t))
        prev = t
    return " ".join(out)


def make_rule(spec: str) -> FakeRule:
    toks = canonical_tokens(spec)
    m = _TARGET_RE.search(" ".join(toks))
    return FakeRule(_render_tokens(toks), toks, m.group(1) if m else None)


class FakeIptables:
    """A fake netfilter with the iptables tools' command lines; see the module docstring."""

    def __init__(self, version: str = "1.8.9", default_backend: str = "nft") -> None:
        self.version = version
        self.default_backend = default_backend
        self.tables: dict[tuple[str, int, str], dict[str, FakeChain]] = {}
        self.calls: list[tuple[tuple[str, ...], str | None]] = []
        self.restore_inputs: list[str] = []
        self.fail_next_restores = 0
        self.fail_all_restores = False
        self.lock_timeout_next_restores = 0
        self.fail_next_saves = 0
        self.fail_all_saves = False
        self.nft_incompatible = False
        self.missing_binaries: set[str] = set()

    # ----------------------------------------------------------------- CommandRunner
    def which(self, name: str) -> str | None:
        if name in self.missing_binaries:
            return None
        if _TOOL_RE.match(name):
            return "/usr/sbin/" + name
        return None

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        result = self._run(tuple(argv), stdin)
        if while_running is not None:
            while_running()
        return result

    def _run(self, argv: tuple[str, ...], stdin: str | None) -> CommandResult:
        self.calls.append((argv, stdin))
        prog = argv[0].rsplit("/", 1)[-1]
        if prog == "cat" and len(argv) == 2:
            return self._cat(argv)
        m = _TOOL_RE.match(prog)
        if not m or prog in self.missing_binaries:
            return CommandResult(127, "", f"{prog}: command not found", argv)
        ipv = 6 if m.group(1) else 4
        backend = m.group(2) or self.default_backend
        kind = m.group(3)
        if kind == "save":
            return self._save_cmd(argv, backend, ipv)
        if kind == "restore":
            return self._restore_cmd(argv, backend, ipv, stdin or "")
        if "--version" in argv or "-V" in argv:
            flavour = "nf_tables" if backend == "nft" else "legacy"
            return CommandResult(0, f"ip{'6' if ipv == 6 else ''}tables v{self.version} ({flavour})\n", "", argv)
        return CommandResult(2, "", "unsupported fake iptables invocation", argv)

    def _cat(self, argv: tuple[str, ...]) -> CommandResult:
        path = argv[1]
        if path in ("/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"):
            ipv = 6 if "ip6" in path else 4
            names = [t for (b, v, t) in self.tables if b == "legacy" and v == ipv]
            return CommandResult(0, "".join(n + "\n" for n in names), "", argv)
        return CommandResult(1, "", f"cat: {path}: No such file or directory", argv)

    # ----------------------------------------------------------------- state helpers
    def _table(self, backend: str, ipv: int, table: str, create: bool = True) -> dict[str, FakeChain] | None:
        key = (backend, ipv, table)
        t = self.tables.get(key)
        if t is None and create:
            if table not in BUILTIN_CHAINS:
                return None
            t = {c: FakeChain(True, "ACCEPT") for c in BUILTIN_CHAINS[table]}
            self.tables[key] = t
        return t

    def chain_specs(self, table: str, chain: str, ip_version: int = 4, backend: str | None = None) -> list[str]:
        t = self._table(backend or self.default_backend, ip_version, table)
        assert t is not None
        return [r.spec for r in t[chain].rules] if chain in t else []

    def chain_names(self, table: str, ip_version: int = 4, backend: str | None = None) -> list[str]:
        t = self._table(backend or self.default_backend, ip_version, table)
        assert t is not None
        return list(t)

    def hit(self, table: str, chain: str, index: int, packets: int = 1, ip_version: int = 4,
            backend: str | None = None) -> None:
        """Count traffic on a rule (0-based index), as the kernel would."""
        t = self._table(backend or self.default_backend, ip_version, table)
        assert t is not None
        r = t[chain].rules[index]
        r.packets += packets
        r.bytes += 84 * packets

    def external_restore(self, text: str, ip_version: int = 4, backend: str | None = None,
                         noflush: bool = True) -> None:
        """Another process writes: apply restore input or raise :class:`RestoreError`."""
        self._restore(backend or self.default_backend, ip_version, text, noflush)

    def save(self, table: str, ip_version: int = 4, backend: str | None = None, counters: bool = False) -> str:
        t = self._table(backend or self.default_backend, ip_version, table)
        assert t is not None
        return self._render_table(table, t, counters)

    def restore_count(self) -> int:
        return sum(1 for argv, _ in self.calls if argv[0].endswith("-restore"))

    def command_count(self) -> int:
        return len(self.calls)

    # ----------------------------------------------------------------- save
    def _save_cmd(self, argv: tuple[str, ...], backend: str, ipv: int) -> CommandResult:
        if self.fail_all_saves or self.fail_next_saves > 0:
            if self.fail_next_saves > 0:
                self.fail_next_saves -= 1
            return CommandResult(1, "", "iptables-save: injected failure", argv)
        counters = "-c" in argv or "--counters" in argv
        tables: list[str]
        if "-t" in argv:
            name = argv[argv.index("-t") + 1]
            if self._table(backend, ipv, name) is None:
                return CommandResult(1, "", f"iptables-save: Table does not exist ({name})", argv)
            tables = [name]
        else:
            tables = [t for (b, v, t) in self.tables if b == backend and v == ipv]
        out = []
        for name in tables:
            t = self._table(backend, ipv, name)
            assert t is not None
            out.append(f"# Generated by fake iptables-save v{self.version}\n")
            if self.nft_incompatible and backend == "nft":
                out.append(f"# Table `{name}' is incompatible, use 'nft' tool.\n")
                continue
            out.append(self._render_table(name, t, counters))
            out.append("# Completed\n")
        return CommandResult(0, "".join(out), "", argv)

    @staticmethod
    def _render_table(name: str, t: dict[str, FakeChain], counters: bool) -> str:
        lines = [f"*{name}"]
        for cname, ch in t.items():
            lines.append(f":{cname} {ch.policy if ch.builtin else '-'} [0:0]")
        for cname, ch in t.items():
            for r in ch.rules:
                prefix = f"[{r.packets}:{r.bytes}] " if counters else ""
                lines.append(f"{prefix}-A {cname} {r.spec}".rstrip())
        lines.append("COMMIT")
        return "".join(line + "\n" for line in lines)

    # ----------------------------------------------------------------- restore
    def _restore_cmd(self, argv: tuple[str, ...], backend: str, ipv: int, text: str) -> CommandResult:
        self.restore_inputs.append(text)
        noflush = False
        i = 1
        while i < len(argv):
            a = argv[i]
            if a in ("--noflush", "-n"):
                noflush = True
            elif a in ("--verbose", "-v", "--counters", "-c"):
                pass
            elif a in ("--wait", "-w", "--wait-interval", "-W"):
                if i + 1 < len(argv) and argv[i + 1][:1].isdigit():
                    i += 1
            else:
                return CommandResult(2, "", f"unknown option {a!r}", argv)
            i += 1
        if self.lock_timeout_next_restores > 0:
            self.lock_timeout_next_restores -= 1
            return CommandResult(4, "", LOCK_MESSAGE + "\n", argv)
        if self.fail_all_restores or self.fail_next_restores > 0:
            if self.fail_next_restores > 0:
                self.fail_next_restores -= 1
            return CommandResult(1, "", "iptables-restore: line 2 failed (injected)\n", argv)
        try:
            self._restore(backend, ipv, text, noflush)
        except RestoreError as e:
            return CommandResult(1, "", f"{e}\n", argv)
        return CommandResult(0, "", "", argv)

    def _restore(self, backend: str, ipv: int, text: str, noflush: bool) -> None:
        table_name = ""
        work: dict[str, FakeChain] | None = None
        start_refs: dict[str, int] = {}
        lineno = 0
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                if line.startswith("*"):
                    if work is not None:
                        raise RestoreError("COMMIT expected")
                    table_name = line[1:]
                    committed = self._table(backend, ipv, table_name)
                    if committed is None:
                        raise RestoreError(f"table '{table_name}' does not exist")
                    work = {c: ch.copy() for c, ch in committed.items()}
                    if not noflush:
                        work = {c: FakeChain(True, ch.policy) for c, ch in work.items() if ch.builtin}
                    start_refs = self._refs(work)
                    continue
                if work is None:
                    raise RestoreError("no table specified")
                if line == "COMMIT":
                    self.tables[(backend, ipv, table_name)] = work
                    work = None
                    continue
                self._apply_line(work, line, backend, start_refs)
            except RestoreError as e:
                raise RestoreError(f"iptables-restore: line {lineno} failed: {e}") from None
        if work is not None:
            raise RestoreError(f"iptables-restore: COMMIT expected at line {lineno + 1}")

    @staticmethod
    def _refs(t: dict[str, FakeChain]) -> dict[str, int]:
        refs: dict[str, int] = {}
        for ch in t.values():
            for r in ch.rules:
                if r.target is not None:
                    refs[r.target] = refs.get(r.target, 0) + 1
        return refs

    @staticmethod
    def _check_target(t: dict[str, FakeChain], rule: FakeRule) -> None:
        tgt = rule.target
        if tgt is not None and tgt not in t and not tgt.isupper():
            raise RestoreError(f"Couldn't load target `{tgt}'")

    def _apply_line(self, t: dict[str, FakeChain], line: str, backend: str, start_refs: dict[str, int]) -> None:
        if line.startswith(":"):
            parts = line[1:].split()
            name = parts[0]
            policy = parts[1] if len(parts) > 1 else "-"
            ch = t.get(name)
            if ch is None:
                if policy != "-":
                    raise RestoreError(f"bad built-in chain {name}")
                t[name] = FakeChain(False)
            elif ch.builtin:
                if policy != "-":
                    ch.policy = policy
            else:
                ch.rules = []
            return
        op, _, rest = line.partition(" ")
        if op in ("--delete-chain", "-X"):
            name = rest.strip()
            ch = t.get(name)
            if ch is None:
                raise RestoreError(f"chain {name} does not exist")
            if ch.builtin:
                raise RestoreError(f"cannot delete built-in chain {name}")
            if ch.rules:
                raise RestoreError(f"chain {name} is not empty")
            if self._refs(t).get(name):
                raise RestoreError(f"chain {name} is referenced")
            if backend == "nft" and start_refs.get(name):
                raise RestoreError(f"chain {name} is referenced (at transaction start; iptables-nft)")
            del t[name]
            return
        if op in ("-N", "--new-chain"):
            name = rest.strip()
            if name in t:
                raise RestoreError(f"chain {name} already exists")
            t[name] = FakeChain(False)
            return
        if op in ("-F", "--flush"):
            name = rest.strip()
            for cname, ch in t.items():
                if not name or cname == name:
                    ch.rules = []
            return
        if op in ("-P", "--policy"):
            name, policy = rest.split()
            if name not in t or not t[name].builtin:
                raise RestoreError(f"bad built-in chain {name}")
            t[name].policy = policy
            return
        chain, _, spec = rest.partition(" ")
        ch = t.get(chain)
        if ch is None:
            raise RestoreError(f"chain {chain} does not exist")
        if op in ("-A", "--append"):
            rule = make_rule(spec)
            self._check_target(t, rule)
            ch.rules.append(rule)
        elif op in ("-I", "--insert"):
            num, _, tail = spec.partition(" ")
            pos = 1
            if num.isdigit():
                pos, spec = int(num), tail
            if not 1 <= pos <= len(ch.rules) + 1:
                raise RestoreError("Index of insertion too big")
            rule = make_rule(spec)
            self._check_target(t, rule)
            ch.rules.insert(pos - 1, rule)
        elif op in ("-R", "--replace"):
            num, _, tail = spec.partition(" ")
            if not num.isdigit() or not 1 <= int(num) <= len(ch.rules):
                raise RestoreError("Index of replacement too big")
            rule = make_rule(tail)
            self._check_target(t, rule)
            ch.rules[int(num) - 1] = rule
        elif op in ("-D", "--delete"):
            if spec.strip().isdigit():
                n = int(spec)
                if not 1 <= n <= len(ch.rules):
                    raise RestoreError("Index of deletion too big")
                del ch.rules[n - 1]
            else:
                want = canonical_tokens(spec)
                for i, r in enumerate(ch.rules):
                    if r.tokens == want:
                        del ch.rules[i]
                        break
                else:
                    raise RestoreError("Bad rule (does a matching rule exist in that chain?)")
        else:
            raise RestoreError(f"unknown command {op!r}")
