"""``ip[6]tables-save`` output → a :class:`~.ruleset.Ruleset` (pure; rules parsed per chain on use).

Chains are keyed ``<table>/<chain>``; a jump stays in its table.  The built-in chains
become hook entries in netfilter's table order (raw −300, mangle −150, nat −100 on the
way in / 100 on the way out, filter 0).  A rule line is tokenised as the shell would
(``shlex``) and walked option by option into the model's criteria; options the model
has no value for become :class:`~.ruleset.UnknownMatch`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from felixpy.drivers.generictables import model as m
from felixpy.explain.packet import ICMP_TYPES, ICMPV6_TYPES, protocol_number
from felixpy.explain.ruleset import (
    AnyAction, AnyCriterion, HookEntry, KRule, LazyChains, Ruleset, SetLookup, UnknownAction, UnknownMatch,
)

HASH_PREFIX = "cali:"
# (hook, table) → priority, as the kernel registers the iptables tables.
TABLE_HOOKS: dict[str, list[tuple[str, str, int]]] = {
    "prerouting": [("raw", "PREROUTING", -300), ("mangle", "PREROUTING", -150), ("nat", "PREROUTING", -100)],
    "input": [("mangle", "INPUT", -150), ("filter", "INPUT", 0), ("nat", "INPUT", 100)],
    "forward": [("mangle", "FORWARD", -150), ("filter", "FORWARD", 0)],
    "output": [("raw", "OUTPUT", -300), ("mangle", "OUTPUT", -150), ("nat", "OUTPUT", -100),
               ("filter", "OUTPUT", 0)],
    "postrouting": [("mangle", "POSTROUTING", -150), ("nat", "POSTROUTING", 100)],
}
_SET_DIRECTIONS: dict[str, type[m.SourceIPSet] | type[m.DestIPSet] | type[m.SourceIPPortSet]
                      | type[m.DestIPPortSet]] = {
    "src": m.SourceIPSet, "dst": m.DestIPSet, "src,src": m.SourceIPPortSet, "dst,dst": m.DestIPPortSet}
_STANDARD_TARGETS = {"ACCEPT", "DROP", "RETURN", "REJECT", "MARK", "NOTRACK", "LOG", "NFLOG", "SNAT", "DNAT",
                     "MASQUERADE", "CONNMARK", "DSCP", "CT"}


_DECLARATION = re.compile(r"^:(\S+) (\S+)", re.M)


class _Table:
    """One table of a save: its chain declarations, and its ``-A`` lines found by bisection.

    ``*-save`` prints a table's declarations ``:<chain> <policy> …`` in one order and then the
    chains' ``-A`` lines grouped in that same order (both loops walk one chain list), so the
    line of chain number *k* is found by bisecting on the declaration index of the chain named
    on a line — ~50 short searches per chain on a 20 MB, 140,000-rule table, where a search
    from the table's start is a scan of megabytes (10–20 ms each).  That order is what
    iptables-legacy-save and iptables-nft-save print (tests/explain check it on real saves);
    a line whose chain is not declared, or a block whose ends do not name the chain, shows
    the order is not what is assumed, and then the chain is searched for from the start.
    """

    __slots__ = ("decl", "end", "order", "rules_start", "text")

    def __init__(self, text: str, start: int, end: int) -> None:
        self.text, self.end = text, end
        first_rule = text.find("\n-A ", start, end)
        self.rules_start = first_rule if first_rule >= 0 else end
        pairs = _DECLARATION.findall(text, start, self.rules_start)
        self.decl: dict[str, str] = dict(pairs)
        self.order: dict[str, int] = {name: i for i, (name, _) in enumerate(pairs)}

    def _name_at(self, line: int) -> str:
        t = self.text
        return t[line + 4:t.find(" ", line + 4, self.end)]

    def _lower_bound(self, k: int) -> int | None:
        """Offset of the ``\\n`` of the first ``-A`` line whose chain's index is >= k (``end`` if none);
        None when a line names an undeclared chain."""
        t, e, order = self.text, self.end, self.order
        lo, hi = self.rules_start, e
        # Invariant: lines starting before lo are of chains < k; the first line at/after hi is >= k.
        while lo < hi:
            mid = (lo + hi) // 2
            line = t.find("\n-A ", mid, e)
            if line < 0:
                hi = mid
                continue
            o = order.get(self._name_at(line))
            if o is None:
                return None
            if o < k:
                lo = line + 1
            else:
                hi = mid
        line = t.find("\n-A ", lo, e)
        return line if line >= 0 else e

    def block(self, chain: str) -> str:
        k = self.order.get(chain)
        if k is None:
            return ""
        first, after = self._lower_bound(k), self._lower_bound(k + 1)
        if first is None or after is None:
            return self._linear_block(chain)
        if first >= after:
            return ""
        last = self.text.rfind("\n-A ", first, after)
        if self._name_at(first) != chain or self._name_at(last) != chain:
            return self._linear_block(chain)
        return self.text[first + 1:after + 1]

    def _linear_block(self, chain: str) -> str:
        t, e = self.text, self.end
        prefix = f"\n-A {chain} "
        i = t.find(prefix, self.rules_start - 1 if self.rules_start else 0, e)
        if i < 0:
            return ""
        j = i
        while True:
            nl = t.find("\n", j + 1, e)
            if nl < 0 or not t.startswith(prefix, nl):
                break
            j = nl
        stop = t.find("\n", j + 1, e)
        return t[i + 1:(stop if stop >= 0 else e) + 1]


class SaveIndex:
    """One ``*-save`` dump (or one dump per table), searched per chain on demand.

    No line of an unvisited chain is touched: a table's declarations are read once, its
    ``-A`` lines are found by bisection (:class:`_Table`).
    """

    def __init__(self, text: str | None = None, *, tables: dict[str, str] | None = None) -> None:
        """``text``: a whole save; or ``tables``: table name → that table's ``*-save -t <table>``."""
        self.tables: dict[str, _Table] = {}
        if text is not None:
            self._add(text, one_table=False)
        for t in (tables or {}).values():
            self._add(t, one_table=True)

    def _add(self, t: str, one_table: bool) -> None:
        # ``*<table>`` starts a table and ``COMMIT`` ends it; in a one-table dump the COMMIT is
        # searched for from the end (a forward search would scan the whole table).
        i = -1 if t.startswith("*") else t.find("\n*")
        while i >= -1:
            eol = t.find("\n", i + 1)
            eol = len(t) if eol < 0 else eol
            end = t.rfind("\nCOMMIT", eol) if one_table else t.find("\nCOMMIT", eol)
            end = len(t) if end < 0 else end
            self.tables[t[i + 2:eol].strip()] = _Table(t, eol, end)
            if one_table:
                break
            i = t.find("\n*", end)
            if i < 0:
                break

    def declaration(self, table: str, chain: str) -> str | None:
        """The policy word of ``:<chain> <policy> …`` (``-`` for a user chain); None if not declared."""
        tab = self.tables.get(table)
        return tab.decl.get(chain) if tab is not None else None

    def block(self, table: str, chain: str) -> str:
        """The chain's ``-A`` lines (one string), ``""`` when it has none."""
        tab = self.tables.get(table)
        return tab.block(chain) if tab is not None else ""


def block_specs(block: str) -> list[str]:
    """The rule specs (``-A <chain> `` removed) of one chain's block."""
    return [line.partition(" ")[2].partition(" ")[2] for line in block.splitlines() if line.startswith("-A ")]


def _mark(value: str) -> tuple[int, int]:
    v, _, mask = value.partition("/")
    return int(v, 0), int(mask, 0) if mask else 0xFFFFFFFF


def _ports(text: str) -> tuple[m.PortRange, ...]:
    out = []
    for part in text.split(","):
        a, _, b = part.partition(":")
        out.append(m.PortRange(int(a), int(b) if b else -1))
    return tuple(out)


def _icmp_type(text: str, names: dict[str, int]) -> tuple[int, int | None]:
    t, _, c = text.partition("/")
    if t in names:
        return names[t], None
    return int(t), int(c) if c else None


def _action(target: str, opts: list[str], chain_exists: Callable[[str], bool]) -> AnyAction:  # noqa: C901
    o = dict(zip(opts[::2], opts[1::2]))
    if target == "ACCEPT":
        return m.Accept()
    if target == "DROP":
        return m.Drop()
    if target == "RETURN":
        return m.Return()
    if target == "REJECT":
        return m.Reject(o.get("--reject-with", ""))
    if target == "MARK":
        for key in ("--set-xmark", "--set-mark"):
            if key in o:
                value, mask = _mark(o[key])
                return m.SetMaskedMark(value, mask)
        return UnknownAction("MARK " + " ".join(opts))
    if target in ("NOTRACK",) or (target == "CT" and "--notrack" in opts):
        return m.NoTrack()
    if target == "LOG":
        return m.Log(o.get("--log-prefix", ""))
    if target == "NFLOG":
        return m.Nflog(int(o.get("--nflog-group", "0")), o.get("--nflog-prefix", ""))
    if target == "SNAT":
        return m.SNAT(o.get("--to-source", ""))
    if target == "DNAT":
        return m.DNAT(o.get("--to-destination", ""))
    if target == "MASQUERADE":
        return m.Masquerade(o.get("--to-ports", ""))
    if target == "CONNMARK" and "--set-xmark" in o:
        value, mask = _mark(o["--set-xmark"])
        return m.SetConnMark(value, mask)
    if target == "DSCP":
        return m.DSCP(int(o.get("--set-dscp", "0"), 0))
    if target not in _STANDARD_TARGETS and chain_exists(target):
        return m.Jump(target)
    return UnknownAction(" ".join([target, *opts]))


# A double-quoted word (iptables-save quotes comments; backslash escapes inside) or a bare word.
_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')


def tokens(spec: str) -> list[str] | None:
    """Split a rule as the shell would for what *-save prints (quoted comments, escapes); None if
    a quote is left open.  A regex in C: ``shlex`` is the same, 10× slower."""
    if '"' not in spec:
        return spec.split()
    out = []
    for quoted, bare in _TOKEN.findall(spec):
        if bare:
            if '"' in bare:
                try:
                    out.extend(shlex.split(bare))
                except ValueError:
                    return None
                continue
            out.append(bare)
        else:
            out.append(re.sub(r"\\(.)", r"\1", quoted))
    return out


def parse_rule(spec: str, ip_version: int, position: int,
               chain_exists: Callable[[str], bool] = lambda _: True) -> KRule:  # noqa: C901
    """One rule (the line after ``-A <chain> ``) → :class:`KRule`."""
    toks = tokens(spec)
    if toks is None:
        return KRule(position, (UnknownMatch(spec),), None, text=spec)
    crit: list[AnyCriterion] = []
    comments: list[str] = []
    hash_ = ""
    action: AnyAction | None = None
    neg = False
    module = ""
    i, n = 0, len(toks)
    icmp_names = ICMP_TYPES if ip_version == 4 else ICMPV6_TYPES

    def arg(k: int = 1) -> str:
        return toks[i + k] if i + k < n else ""

    while i < n:
        t = toks[i]
        step = 2
        if t == "!":
            neg = True
            i += 1
            continue
        if t in ("-s", "--source"):
            crit.append(m.SourceNet(arg(), neg))
        elif t in ("-d", "--destination"):
            crit.append(m.DestNet(arg(), neg))
        elif t in ("-i", "--in-interface"):
            crit.append(m.InInterface(arg(), neg))
        elif t in ("-o", "--out-interface"):
            crit.append(m.OutInterface(arg(), neg))
        elif t in ("-p", "--protocol"):
            num = protocol_number(arg())
            crit.append(m.ProtocolNum(num, neg) if num is not None else UnknownMatch(f"-p {arg()}"))
        elif t in ("-m", "--match"):
            module = arg()
        elif t == "--comment":
            c = arg()
            if not hash_ and c.startswith(HASH_PREFIX):
                hash_ = c[len(HASH_PREFIX):]
            else:
                comments.append(c)
        elif t == "--mark":
            value, mask = _mark(arg())
            crit.append(m.ConnMarkMatchesWithMask(value, mask) if module == "connmark"
                        else m.MarkMatchesWithMask(value, mask, neg))
            if module == "connmark" and neg:
                crit[-1] = UnknownMatch(f"! connmark --mark {arg()}")
        elif t == "--match-set":
            name, direction = arg(), arg(2)
            step = 3
            cls = _SET_DIRECTIONS.get(direction)
            crit.append(cls(name, neg) if cls is not None else UnknownMatch(f"--match-set {name} {direction}"))
        elif t in ("--dports", "--destination-ports", "--dport", "--destination-port"):
            crit.append(m.DestPorts(_ports(arg()), neg))
        elif t in ("--sports", "--source-ports", "--sport", "--source-port"):
            crit.append(m.SourcePorts(_ports(arg()), neg))
        elif t in ("--ctstate", "--state"):
            crit.append(m.ConntrackState(arg(), neg))
        elif t == "--icmp-type":
            ty, code = _icmp_type(arg(), ICMP_TYPES)
            crit.append(m.ICMPType(ty, code, neg))
        elif t == "--icmpv6-type":
            ty, code = _icmp_type(arg(), icmp_names)
            crit.append(m.ICMPV6Type(ty, code, neg))
        elif t == "--src-type":
            limit = arg(2) == "--limit-iface-out"
            crit.append(m.SrcAddrType(arg(), limit, neg))
            step = 3 if limit else 2
        elif t == "--dst-type":
            crit.append(m.DestAddrType(arg(), neg))
        elif t == "--tcp-flags":
            flag_mask, comp = arg(), arg(2)
            step = 3
            crit.append(m.TCPFlagsSet(comp) if set(flag_mask.split(",")) == {"FIN", "SYN", "RST", "ACK"}
                        else UnknownMatch(f"--tcp-flags {flag_mask} {comp}"))
        elif t == "--syn":
            crit.append(m.TCPFlagsSet("SYN"))
            step = 1
        elif t == "--ipvs":
            crit.append(m.IPVSConnection(neg))
            step = 1
        elif t == "--validmark":
            step = 1
        elif t == "--invert" and module == "rpfilter":
            crit.append(m.RPFCheckFailed())
            step = 1
        elif t == "--limit":
            burst = arg(3) if arg(2) == "--limit-burst" else "5"
            crit.append(m.Limit(arg(), int(burst)))
            step = 4 if arg(2) == "--limit-burst" else 2
        elif t == "--connlimit-above":
            cl_mask = arg(3) if arg(2) == "--connlimit-mask" else "0"
            crit.append(m.ConnLimit(int(arg()), int(cl_mask)))
            step = 4 if arg(2) == "--connlimit-mask" else 2
        elif t in ("-j", "--jump", "-g", "--goto"):
            target = arg()
            opts = toks[i + 2:]
            if t in ("-g", "--goto"):
                action = m.Goto(target)
            else:
                action = _action(target, opts, chain_exists)
            break
        else:
            # An option we do not model: it and its values ("--foo a b") are one unknown criterion.
            j = i + 1
            while j < n and not toks[j].startswith("-") and toks[j] != "!":
                j += 1
            crit.append(UnknownMatch(" ".join(toks[i:j])))
            step = j - i
        neg = False
        i += step
    return KRule(position, tuple(crit), action, hash_, tuple(comments), spec)


def ruleset_from_save(text: str | dict[str, str], ip_version: int, sets: SetLookup, backend: str) -> Ruleset:
    """``text``: a whole save, or table name → that table's save."""
    index = SaveIndex(text) if isinstance(text, str) else SaveIndex(tables=text)

    def fetch(key: str) -> object | None:
        table, _, chain = key.partition("/")
        if index.declaration(table, chain) is None:
            return None
        return index.block(table, chain)

    def parse(key: str, raw: object) -> list[KRule]:
        table = key.split("/", 1)[0]
        lines = block_specs(raw) if isinstance(raw, str) else []
        return [parse_rule(spec, ip_version, i + 1, lambda c: index.declaration(table, c) is not None)
                for i, spec in enumerate(lines)]

    hooks: dict[str, list[HookEntry]] = {}
    for hook, entries in TABLE_HOOKS.items():
        hooks[hook] = []
        for t, c, prio in entries:
            policy = index.declaration(t, c)
            if policy is not None:
                hooks[hook].append(HookEntry(f"{t} {c}", f"{t}/{c}", prio, "drop" if policy == "DROP" else "accept"))
    return Ruleset(backend=backend, ip_version=ip_version, chains=LazyChains({}, parse, fetch), hooks=hooks,
                   sets=sets, resolve=lambda current, target: current.split("/", 1)[0] + "/" + target,
                   display=lambda key: key.replace("/", " ", 1))


def parse_listing(text: str) -> tuple[list[str], str | None]:
    """``iptables -S <chain>`` output → (rule specs without ``-A <chain> ``, built-in policy or None)."""
    specs: list[str] = []
    policy = None
    for line in text.splitlines():
        if line.startswith("-A "):
            specs.append(line[3:].partition(" ")[2])
        elif line.startswith("-P "):
            p = line.split()[-1]
            policy = p.lower() if p in ("ACCEPT", "DROP") else None
    return specs, policy


def lazy_ruleset(list_chain: Callable[[str, str], str | None], ip_version: int, sets: SetLookup,
                 backend: str) -> Ruleset:
    """A ruleset that lists each chain (``list_chain(table, chain)`` → ``-S`` text, None if absent) on use."""
    policies: dict[str, str] = {}

    def fetch(key: str) -> object | None:
        table, _, chain = key.partition("/")
        text = list_chain(table, chain)
        if text is None:
            return None
        specs, policy = parse_listing(text)
        if policy is not None:
            policies[key] = policy
        return specs

    def parse(key: str, raw: object) -> list[KRule]:
        lines = raw if isinstance(raw, list) else []
        return [parse_rule(spec, ip_version, i + 1) for i, spec in enumerate(lines)]

    chains = LazyChains({}, parse, fetch)

    def hook_source(hook: str) -> list[HookEntry]:
        out = []
        for t, c, prio in TABLE_HOOKS.get(hook, ()):
            key = f"{t}/{c}"
            if key in chains:   # lists it (and learns its policy)
                out.append(HookEntry(f"{t} {c}", key, prio, policies.get(key, "accept")))
        return out

    return Ruleset(backend=backend, ip_version=ip_version, chains=chains, hooks={}, sets=sets,
                   resolve=lambda current, target: current.split("/", 1)[0] + "/" + target,
                   display=lambda key: key.replace("/", " ", 1), hook_source=hook_source)
