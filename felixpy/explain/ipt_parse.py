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


class SaveIndex:
    """One ``*-save`` dump, searched per chain on demand (no line of an unvisited chain is touched).

    The save prints each table as ``*<table>``, the chain declarations ``:<chain> <policy> …``,
    then every chain's ``-A`` lines together; so a chain's block is found with two substring
    searches in C, and a 100,000-rule dump costs nothing until a packet reaches a chain.
    """

    def __init__(self, text: str) -> None:
        self.text = "\n" + text if not text.startswith("\n") else text
        self.tables: dict[str, tuple[int, int]] = {}
        t = self.text
        pos = 0
        while (i := t.find("\n*", pos)) >= 0:
            eol = t.find("\n", i + 1)
            eol = len(t) if eol < 0 else eol
            end = t.find("\nCOMMIT", eol)
            end = len(t) if end < 0 else end
            self.tables[t[i + 2:eol].strip()] = (eol, end)
            pos = end

    def declaration(self, table: str, chain: str) -> str | None:
        """The policy word of ``:<chain> <policy> …`` (``-`` for a user chain); None if not declared."""
        span = self.tables.get(table)
        if span is None:
            return None
        head = f"\n:{chain} "
        i = self.text.find(head, *span)
        if i < 0:
            return None
        return self.text[i + len(head):self.text.find(" ", i + len(head))]

    def block(self, table: str, chain: str) -> str:
        """The chain's ``-A`` lines (one string), ``""`` when it has none."""
        s, e = self.tables.get(table, (0, 0))
        t = self.text
        prefix = f"\n-A {chain} "
        i = t.find(prefix, s, e)
        if i < 0:
            return ""
        j = i
        while True:
            nl = t.find("\n", j + 1)
            if nl < 0 or not t.startswith(prefix, nl):
                break
            j = nl
        stop = t.find("\n", j + 1)
        return t[i + 1:(stop if stop >= 0 else len(t)) + 1]


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


def ruleset_from_save(text: str, ip_version: int, sets: SetLookup, backend: str) -> Ruleset:
    index = SaveIndex(text)

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


def has_felixpy_chains(text: str) -> bool:
    """Whether a save dump holds felixpy's chains (``:cali-…`` declarations)."""
    return "\n:cali-" in text


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
