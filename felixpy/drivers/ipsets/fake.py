"""A stateful fake ``ipset`` for tests: a :class:`~felixpy.drivers.cmdshim.CommandRunner` backed by a dict.

It keeps sets (type, family, maxelem, members, references) and answers the
commands the driver and the tests use — ``restore``, ``list`` (``-name``,
``-terse``, one set or all), ``save``, ``create``, ``add``, ``del``, ``test``,
``destroy``, ``swap``, ``rename``, ``flush`` — with the kernel's rules and
ipset 7.17's messages:

* members are stored in the kernel's printed form, validated independently of
  the driver (``ipaddress``): wrong family or garbage is a syntax error, a
  hash:net ``/0`` is refused, host bits are masked, ``maxelem`` is enforced;
* ``add`` of a present member / ``del`` of an absent one fail unless
  ``-exist``/``--exist``;
* ``destroy`` and ``rename`` of a set a rule references (:meth:`reference`)
  fail "in use"; ``swap`` needs the same type and family and leaves the
  references with the names, as the kernel does;
* ``restore`` runs line by line and stops at the first failing line
  (``Error in line N: …``); earlier lines stay applied, except that a syntax
  error also drops the pending batch of add/del lines since the last other
  command — ipset parses a batch before sending it (observed on 7.17).

Failure injection: :meth:`inject` makes the next matching command(s) fail
(optionally part-way through a restore); :meth:`make_unlistable` marks a set
``ipset list``/``save`` cannot print (as a set made by a newer ipset).  Every
call is recorded in :attr:`calls`.  Given a :class:`~felixpy.testing.clock.FakeClock`,
:attr:`FakeIPSet.cost` advances it per command, to test time budgets.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from felixpy.drivers.cmdshim import CommandResult
from felixpy.testing.clock import FakeClock

VERSION = "ipset v7.17"
_REVISIONS = {"hash:ip": 6, "hash:net": 7, "hash:ip,port": 7}
_ADT = frozenset({"add", "del", "test"})


@dataclass(slots=True)
class FakeSet:
    type: str
    family: str
    max_size: int
    members: set[str] = field(default_factory=set)
    references: int = 0
    raw: bool = False  # foreign type: members stored as given
    unlistable: bool = False  # ipset list/save cannot print it (made by a newer ipset)

    def clone_content(self) -> FakeSet:
        return FakeSet(self.type, self.family, self.max_size, set(self.members), 0, self.raw, self.unlistable)


class _Fail(Exception):
    def __init__(self, message: str, syntax: bool = False) -> None:
        super().__init__(message)
        self.syntax = syntax


@dataclass(slots=True)
class _Injection:
    op: str
    times: int | None
    stderr: str
    at_line: int | None
    name: str | None


def _addr(text: str, family: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        a = ipaddress.ip_address(text)
    except ValueError:
        a = None
    want = 4 if family == "inet" else 6
    if a is None or a.version != want:
        raise _Fail(f"Syntax error: cannot parse {text}: resolving to IPv{want} address failed", syntax=True)
    return a


def _fmt(a: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if a.version == 4:
        return str(a)
    return socket.inet_ntop(socket.AF_INET6, a.packed)  # ipset prints with inet_ntop


def kernel_member(set_type: str, family: str, member: str) -> str:
    """The text the kernel would print for *member* added to a set (or raise _Fail)."""
    bits = 32 if family == "inet" else 128
    if set_type == "hash:ip":
        text, _, suffix = member.partition("/")
        if suffix and suffix != str(bits):
            raise _Fail("fake ipset: hash:ip ranges are not modelled", syntax=True)
        return _fmt(_addr(text, family))
    if set_type == "hash:net":
        text, slash, plen_text = member.partition("/")
        a = _addr(text, family)
        if slash:
            if not plen_text.isdigit() or int(plen_text) > bits:
                raise _Fail(f"Syntax error: '{plen_text}' is out of range 0-{bits}", syntax=True)
            plen: int = int(plen_text)
        else:
            plen = bits
        if plen == 0:
            raise _Fail("The value of the CIDR parameter of the IP address is invalid")
        net = ipaddress.ip_network(f"{a}/{plen}", strict=False)
        return _fmt(net.network_address) if plen == bits else f"{_fmt(net.network_address)}/{plen}"
    if set_type == "hash:ip,port":
        text, comma, rest = member.partition(",")
        proto, colon, port = rest.partition(":")
        if not comma or not colon or not port.isdigit() or int(port) > 65535:
            raise _Fail(f"Syntax error: cannot parse {member}", syntax=True)
        if proto.lower() not in ("tcp", "udp", "sctp", "udplite", "icmp", "icmpv6"):
            raise _Fail(f"Syntax error: cannot parse {proto}: unknown protocol", syntax=True)
        return f"{_fmt(_addr(text, family))},{proto.lower()}:{int(port)}"
    raise _Fail(f"Syntax error: unknown settype {set_type}", syntax=True)


class FakeIPSet:
    """The fake; pass it wherever a :class:`CommandRunner` goes."""

    def __init__(self, clock: FakeClock | None = None, restore_drops_batch_on_syntax_error: bool = True) -> None:
        self.sets: dict[str, FakeSet] = {}
        self.calls: list[tuple[tuple[str, ...], str | None]] = []
        self.clock = clock
        self.cost: dict[str, float] = {}  # op -> fake seconds per call
        self.before_command: Callable[[tuple[str, ...], str | None], None] | None = None
        self.restore_drops_batch = restore_drops_batch_on_syntax_error
        self._injections: list[_Injection] = []
        self._undo: list[Callable[[], None]] = []

    # ---------------------------------------------------------------- test helpers
    def reference(self, name: str) -> None:
        """As an iptables rule ``-m set --match-set name`` would."""
        self._get(name).references += 1

    def unreference(self, name: str) -> None:
        s = self._get(name)
        s.references = max(0, s.references - 1)

    def add_set(self, name: str, set_type: str = "hash:ip", family: str = "inet", max_size: int = 1048576,
                members: Sequence[str] = ()) -> None:
        """Create a set directly (as another program, or an earlier Felix, would)."""
        raw = set_type not in _REVISIONS
        s = FakeSet(set_type, family, max_size, raw=raw)
        for m in members:
            s.members.add(m if raw else kernel_member(set_type, family, m))
        self.sets[name] = s

    def make_unlistable(self, name: str) -> None:
        """``ipset list``/``save`` will fail on this set (the property moves with swap/rename)."""
        self._get(name).unlistable = True

    def members(self, name: str) -> set[str]:
        return set(self.sets[name].members)

    def inject(self, op: str, *, times: int | None = 1, stderr: str = "", at_line: int | None = None,
               name: str | None = None) -> None:
        """Make the next *times* (None: every) matching command fail.

        *op* is the ipset subcommand (``restore``, ``list``, ``save``, ``destroy``…;
        ``list-name`` for ``ipset list -name``); *name* restricts it to one set;
        *at_line* makes a restore apply the lines before it, then fail there.
        """
        self._injections.append(_Injection(op, times, stderr, at_line, name))

    def commands(self, op: str | None = None) -> list[tuple[str, ...]]:
        """The argv of every recorded call (of subcommand *op*)."""
        return [argv for argv, _ in self.calls if op is None or (len(argv) > 1 and _op_of(argv) == op)]

    def restore_inputs(self) -> list[str]:
        return [stdin or "" for argv, stdin in self.calls if _op_of(argv) == "restore"]

    # ---------------------------------------------------------------- runner API
    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        result = self._run(argv, stdin)
        if while_running is not None:
            while_running()
        return result

    def _run(self, argv: Sequence[str], stdin: str | None) -> CommandResult:
        args = tuple(argv)
        self.calls.append((args, stdin))
        if self.before_command is not None:
            self.before_command(args, stdin)
        if not args or args[0] != "ipset":
            return CommandResult(127, "", f"{args[0] if args else ''}: not found")
        op = _op_of(args)
        if self.clock is not None:
            self.clock.advance(self.cost.get(op, 0.0))
        words = [a for a in args[1:] if a not in ("-exist", "--exist", "-!")]
        exist = len(words) != len(args) - 1
        inj = self._take_injection(op, words)
        if inj is not None and inj.at_line is None:
            return CommandResult(1, "", inj.stderr or f"{VERSION}: injected failure\n")
        try:
            if op == "restore":
                return self._restore(stdin or "", inj)
            if op in ("list", "list-name"):
                return self._list(words[1:])
            if op == "save":
                return self._save(words[1:])
            self._undo = []
            self._command(words, exist)
            return CommandResult(0, "", "")
        except _Fail as exc:
            return CommandResult(1, "", f"{VERSION}: {exc}\n")

    def _take_injection(self, op: str, words: list[str]) -> _Injection | None:
        for inj in self._injections:
            if inj.op != op:
                continue
            if inj.name is not None and inj.name not in words:
                continue
            if inj.times is not None:
                inj.times -= 1
                if inj.times <= 0:
                    self._injections.remove(inj)
            return inj
        return None

    # ---------------------------------------------------------------- commands
    def _get(self, name: str) -> FakeSet:
        s = self.sets.get(name)
        if s is None:
            raise _Fail("The set with the given name does not exist")
        return s

    def _command(self, words: list[str], exist: bool) -> str | None:
        if not words:
            raise _Fail("Syntax error: no command specified", syntax=True)
        cmd, args = words[0], words[1:]
        if cmd == "create":
            if len(args) < 2:
                raise _Fail("Syntax error: missing set type", syntax=True)
            name, set_type = args[0], args[1]
            opts = dict(zip(args[2::2], args[3::2], strict=False))
            family = opts.get("family", "inet")
            max_size = int(opts.get("maxelem", "65536"))
            if set_type not in _REVISIONS:
                raise _Fail(f"Syntax error: Unknown settype {set_type}", syntax=True)
            if name in self.sets:
                old = self.sets[name]
                if exist and (old.type, old.family, old.max_size) == (set_type, family, max_size):
                    return None
                raise _Fail("Set cannot be created: set with the same name already exists")
            self.sets[name] = FakeSet(set_type, family, max_size)
            return None
        if cmd in ("add", "del", "test"):
            if len(args) < 2:
                raise _Fail("Syntax error: missing element", syntax=True)
            s = self._get(args[0])
            m = args[1] if s.raw else kernel_member(s.type, s.family, args[1])
            if cmd == "test":
                if m not in s.members:
                    raise _Fail(f"{args[1]} is NOT in set {args[0]}.")
                return None
            if cmd == "add":
                if m in s.members:
                    if exist:
                        return None
                    raise _Fail("Element cannot be added to the set: it's already added")
                if len(s.members) >= s.max_size:
                    raise _Fail("Hash is full, cannot add more elements")
                s.members.add(m)
                self._undo.append(lambda: s.members.discard(m))
            else:
                if m not in s.members:
                    if exist:
                        return None
                    raise _Fail("Element cannot be deleted from the set: it's not added")
                s.members.discard(m)
                self._undo.append(lambda: s.members.add(m))
            return None
        if cmd in ("destroy", "x"):
            names = args or [n for n, s in self.sets.items()]
            for name in names:
                if self._get(name).references:
                    raise _Fail("Set cannot be destroyed: it is in use by a kernel component")
            for name in names:
                del self.sets[name]
            return None
        if cmd == "flush":
            for name in args or list(self.sets):
                self._get(name).members.clear()
            return None
        if cmd == "swap":
            a, b = self._get(args[0]), self._get(args[1])
            if (a.type, a.family) != (b.type, b.family):
                raise _Fail("The sets cannot be swapped: their type does not match")
            # The kernel swaps the sets but leaves names and references in place.
            ca, cb = a.clone_content(), b.clone_content()
            ca.references, cb.references = b.references, a.references
            self.sets[args[0]], self.sets[args[1]] = cb, ca
            return None
        if cmd == "rename":
            s = self._get(args[0])
            if args[1] in self.sets:
                raise _Fail("Set cannot be renamed: a set with the new name already exists")
            if s.references:
                raise _Fail("Set cannot be renamed: it is in use by another system")
            self.sets[args[1]] = self.sets.pop(args[0])
            return None
        raise _Fail(f"Syntax error: unknown command {cmd}", syntax=True)

    def _restore(self, text: str, inj: _Injection | None) -> CommandResult:
        self._undo = []
        for line_no, line in enumerate(text.split("\n"), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if inj is not None and inj.at_line == line_no:
                return CommandResult(1, "", f"{VERSION}: Error in line {line_no}: {inj.stderr or 'injected failure'}\n")
            if line == "COMMIT":
                self._undo = []
                continue
            words = line.split()
            exist = any(w in ("-exist", "--exist", "-!") for w in words)
            words = [w for w in words if w not in ("-exist", "--exist", "-!")]
            if words[0] not in _ADT:
                self._undo = []  # a non-ADT command sends (commits) the pending batch
            try:
                self._command(words, exist)
            except _Fail as exc:
                if exc.syntax and self.restore_drops_batch:
                    for undo in reversed(self._undo):
                        undo()
                return CommandResult(1, "", f"{VERSION}: Error in line {line_no}: {exc}\n")
        return CommandResult(0, "", "")

    # ---------------------------------------------------------------- output
    def _list(self, args: list[str]) -> CommandResult:
        if args and args[0] == "-name":
            return CommandResult(0, "".join(f"{n}\n" for n in self.sets), "")
        terse = bool(args) and args[0] == "-terse"
        names = [a for a in args if not a.startswith("-")]
        if names:
            s = self._get(names[0])
            if s.unlistable:
                raise _Fail("Kernel error received: set type not supported")
            return CommandResult(0, self._format_list(names[0], s, terse), "")
        if any(s.unlistable for s in self.sets.values()):
            raise _Fail("Kernel error received: set type not supported")
        return CommandResult(0, "\n".join(self._format_list(n, s, terse) for n, s in self.sets.items()), "")

    def _format_list(self, name: str, s: FakeSet, terse: bool) -> str:
        out = [f"Name: {name}", f"Type: {s.type}", f"Revision: {_REVISIONS.get(s.type, 1)}",
               f"Header: family {s.family} hashsize 1024 maxelem {s.max_size} bucketsize 12 initval 0x00000000",
               "Size in memory: 1024", f"References: {s.references}", f"Number of entries: {len(s.members)}"]
        if not terse:
            out.append("Members:")
            out.extend(s.members)
        return "\n".join(out) + "\n"

    def _save(self, args: list[str]) -> CommandResult:
        names = args[:1] or list(self.sets)
        out = []
        for name in names:
            s = self._get(name)
            if s.unlistable:
                raise _Fail("Kernel error received: set type not supported")
            out.append(f"create {name} {s.type} family {s.family} hashsize 1024 maxelem {s.max_size} "
                       f"bucketsize 12 initval 0x00000000\n")
            out.extend(f"add {name} {m}\n" for m in s.members)
        return CommandResult(0, "".join(out), "")


def _op_of(argv: Sequence[str]) -> str:
    words = [a for a in argv[1:] if a not in ("-exist", "--exist", "-!")]
    if not words:
        return ""
    if words[0] == "list" and len(words) > 1 and words[1] == "-name":
        return "list-name"
    return words[0]
