"""iproute2 (``ip``) as the bulk path: route and neighbour writes, and the dumps a resync reads.

Why ``ip`` and not pyroute2 here: one pyroute2 call per route is ~10x slower
than ``ip -batch`` (a blocking round trip plus Python encoding per route), and
decoding a 5k-route dump with pyroute2 takes ~0.3 s.  ``ip -batch`` is the
standard tool for bulk writes, and ``ip -j`` prints dumps as JSON that
``json.loads`` reads in milliseconds.  Measurements: ``docs/routing.md``.

Writes
    One ``ip -4|-6 -force -batch -`` per family, one line per route or
    neighbour, ``replace`` semantics.  With ``-force``, ``ip`` keeps going
    after a failed line and reports ``Command failed -:<line>`` on stderr after
    the line's error message; :func:`parse_batch_stderr` maps those back to
    the items (one errno each, 0 = done).  ``ip neigh`` is the exception: it
    exits on a kernel error even with ``-force``.  Such an *abort* is located
    by dumping the neighbours (the first unreported line whose entry is not in
    the kernel failed; the ones before it landed) and the rest is re-run.

Interface names
    ``ip`` speaks names; the shim's values carry indexes.  The index->name map
    of a batch or a one-device dump is looked up for the indexes it names alone
    (:func:`.ifnames.indextonames`, ~2 µs an index); a dump that may name any
    interface takes the whole map (``if_nameindex(3)``, a full link dump, 15-26 ms
    at 2,000 interfaces, the GIL let go).  Either is taken before a batch (an
    index with no interface fails with ENODEV without being sent) and again after it: an item whose interface vanished or changed name
    meanwhile is reported ENODEV (the route table then rescans the interface).
    Dumps map ``dev`` names back through the names that kept the same index
    across the dump; a route via an interface that appeared, vanished or was
    recreated during the dump is left out (the table would ignore it anyway,
    as a route via an unknown index).

Dumps (``-N``: numeric protocol/scope/type/table, so ``/etc/iproute2`` names
never matter)
    ``ip -4|-6 -j -d -N route show table T [dev NAME]`` -> :func:`parse_route_dump`;
    ``ip -j -d link show`` -> :func:`parse_link_dump`;
    ``ip -4|-6 -j neigh show nud all [dev NAME]`` -> :func:`parse_neigh_dump`;
    ``bridge -j fdb show dev NAME`` -> :func:`parse_fdb_dump`.
    A dump ``ip`` reports as interrupted (``NLM_F_DUMP_INTR``) is retried.

TC (BPF mode's clsact attach)
    ``tc -force -batch -`` with the qdisc and filter lines of
    :mod:`felixpy.bpf.attach` (:meth:`IpTool.tc_batch`); failed lines are reported as ``ip``
    reports them.

Bridge FDB (VXLAN devices)
    ``bridge -force -batch -`` with ``fdb replace MAC dev NAME dst IP self
    permanent`` lines: one child for every entry instead of one pyroute2
    round trip each (5,000 remote VTEPs took 70 % of a large node's cold
    start that way).  ``bridge`` reports failed lines like ``ip`` and, like
    ``ip neigh``, exits on a kernel error: located with an FDB dump and the
    rest re-run.

Everything that parses text is a pure function, unit-tested on captured output.
"""

from __future__ import annotations

import errno as _errno
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog

from felixpy.drivers.cmdshim import CommandResult, CommandRunner, takes_stdin_lines
from felixpy.drivers.netlink.errors import NetlinkCallError
from felixpy.drivers.netlink.types import (
    AF_INET,
    AF_INET6,
    NUD_PERMANENT,
    RT_SCOPE_UNIVERSE,
    RTN_BLACKHOLE,
    RTN_LOCAL,
    RTN_PROHIBIT,
    RTN_THROW,
    RTN_UNICAST,
    RTN_UNREACHABLE,
    RTPROT_BOOT,
    SPECIAL_ROUTE_TYPES,
    NTF_SELF,
    FDBEntry,
    Link,
    Neigh,
    Route,
    VXLANInfo,
    canon_cidr,
    canon_ip,
    canon_mac,
)

log = structlog.get_logger(__name__)

FAMILY_FLAG = {AF_INET: "-4", AF_INET6: "-6"}

_ROUTE_TYPE_KEYWORDS = {
    RTN_UNICAST: "unicast", RTN_LOCAL: "local", 3: "broadcast", 4: "anycast", 5: "multicast",
    RTN_BLACKHOLE: "blackhole", RTN_UNREACHABLE: "unreachable", RTN_PROHIBIT: "prohibit", RTN_THROW: "throw",
    10: "nat",
}

NUD_BY_NAME = {"NONE": 0x00, "INCOMPLETE": 0x01, "REACHABLE": 0x02, "STALE": 0x04, "DELAY": 0x08,
               "PROBE": 0x10, "FAILED": 0x20, "NOARP": 0x40, "PERMANENT": 0x80}

# Messages that carry no strerror text but identify an errno the drivers act on.
# Anything else printed as "Error: ..." (a kernel extack message) maps to EINVAL.
_KNOWN_MESSAGES = (
    ("Cannot find device", _errno.ENODEV),  # ip: the name did not resolve
    ("Device for nexthop is not up", _errno.ENETDOWN),  # ipv4 extack
    ("Nexthop device is not up", _errno.ENETDOWN),  # ipv6 extack
    ("FIB table does not exist", _errno.ENOENT),
)
_STRERROR = {os.strerror(e): e for e in sorted(_errno.errorcode, reverse=True)}
_FAILED_LINE = re.compile(r"^Command failed (.*):(\d+)$")
_SAFE_NAME = re.compile(r"\A[A-Za-z0-9_.@+=-]+\Z")  # \Z: "$" matches before a final newline


# ---------------------------------------------------------------------------- batch lines
def quote_name(name: str) -> str | None:
    """An interface name as one ``ip -batch`` token (None if it cannot be quoted)."""
    if _SAFE_NAME.match(name):
        return name
    for q in ('"', "'"):
        if q not in name:
            return f"{q}{name}{q}"
    return None


def route_dev_needed(route: Route) -> bool:
    """Whether a replace names the output interface (not for blackhole & co. without one)."""
    return bool(route.oif) and not (route.type in SPECIAL_ROUTE_TYPES and route.oif <= 1)


def route_replace_line(route: Route, dev: str | None) -> str:
    parts = ["route", "replace", _ROUTE_TYPE_KEYWORDS[route.type], route.dst, "table", str(route.table),
             "proto", str(route.protocol), "scope", str(route.scope)]
    if route.tos:
        parts += ["tos", f"{route.tos:#x}"]  # ip reads TOS as hex
    if route.priority:
        parts += ["metric", str(route.priority)]
    if dev is not None:
        parts += ["dev", dev]
    if route.gateway:
        parts += ["via", route.gateway]
    if route.src:
        parts += ["src", route.src]
    if route.onlink:
        parts.append("onlink")
    if route.mtu:
        parts += ["mtu", str(route.mtu)]
    return " ".join(parts)


def route_delete_line(route: Route) -> str:
    """Matches on (table, destination, TOS, metric) only, as the kernel's FIB key does."""
    parts = ["route", "del", route.dst, "table", str(route.table)]
    if route.tos:
        parts += ["tos", f"{route.tos:#x}"]
    if route.priority:
        parts += ["metric", str(route.priority)]
    return " ".join(parts)


def neigh_replace_line(neigh: Neigh, dev: str) -> str:
    parts = ["neigh", "replace", neigh.dst]
    if neigh.lladdr:
        parts += ["lladdr", neigh.lladdr]
    nud = "permanent" if neigh.state == NUD_PERMANENT else f"{neigh.state:#x}"
    parts += ["nud", nud, "dev", dev]
    return " ".join(parts)


# ---------------------------------------------------------------------------- batch stderr
@dataclass(frozen=True, slots=True)
class BatchFailure:
    errno: int
    message: str


@dataclass(frozen=True, slots=True)
class BatchReport:
    failed: dict[int, BatchFailure]  # 1-based line number -> why
    aborted: BatchFailure | None  # ip stopped at an unreported line after last_reported
    last_reported: int  # the highest line reported failed (0: none)


def errno_from_message(line: str) -> int | None:
    """The errno one stderr line of ``ip`` stands for, if it identifies one."""
    if line.startswith("RTNETLINK answers: "):
        return _STRERROR.get(line[len("RTNETLINK answers: "):].strip())
    for needle, err in _KNOWN_MESSAGES:
        if needle in line:
            return err
    return None


def failure_from_lines(lines: Sequence[str]) -> BatchFailure:
    for line in reversed(lines):
        err = errno_from_message(line)
        if err is not None:
            return BatchFailure(err, " / ".join(lines))
    if any(line.startswith("Error:") for line in lines):
        return BatchFailure(_errno.EINVAL, " / ".join(lines))
    return BatchFailure(_errno.EIO, " / ".join(lines) or "no error message")


def parse_batch_stderr(stderr: str, returncode: int) -> BatchReport:
    """Which lines of an ``ip -force -batch`` run failed, and whether it stopped early.

    Messages printed before a ``Command failed <file>:<n>`` belong to line n.
    Error messages after the last such marker with a non-zero exit mean ``ip``
    exited mid-batch (``ip neigh`` does on kernel errors); so does an exit
    status other than 0 or 1 (1 = "some lines failed").
    """
    failed: dict[int, BatchFailure] = {}
    pending: list[str] = []
    last = 0
    for raw in stderr.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _FAILED_LINE.match(line)
        if m is None:
            pending.append(line)
            continue
        n = int(m.group(2))
        failed[n] = failure_from_lines(pending)
        last = max(last, n)
        pending = []
    errors = [line for line in pending if not line.startswith("Warning")]
    aborted = None
    if returncode != 0 and (returncode != 1 or errors or not failed):
        aborted = failure_from_lines(errors) if errors else BatchFailure(
            _errno.EIO, f"ip exited with status {returncode}")
    return BatchReport(failed, aborted, last)


# ---------------------------------------------------------------------------- dumps
def _int(value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, int):
        return value
    return int(str(value), 0)


# json's C scanner: (value, end) of the value at an index (what raw_decode calls, without its frame).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_SPACE = re.compile(r"[ \t\n\r]*")
_DEV_FIELD = re.compile(r'"dev"[ \t\n\r]*:[ \t\n\r]*"((?:[^"\\]|\\.)*)"')


def dumped_dev_names(text: str) -> set[str]:
    """Every interface name a ``-j`` dump gives as a ``"dev"`` value (nexthops' too), decoded."""
    return {json.loads(f'"{raw}"') if "\\" in raw else raw for raw in set(_DEV_FIELD.findall(text))}


def _skip_space(text: str, i: int) -> int:
    m = _SPACE.match(text, i)
    return m.end() if m else i


def _load(text: str) -> Iterator[Any]:
    """The elements of the JSON list ``ip -j`` printed, decoded one at a time (ValueError if it is not
    one): the whole list never exists decoded.  At 10,000 links a ``link show -d`` decoded whole was
    ~21 MiB of dicts at once, +31-34 MiB of resident set for the host-MTU and route-table dumps; each
    element here is reduced to what the caller keeps before the next is decoded.  ``ip`` prints the
    list without spaces (``[{...},{...}]``), which is read without a pattern match between elements."""
    skip, scan = _skip_space, _SCAN
    i = skip(text, 0)
    if i == len(text):
        return
    if text[i] != "[":
        raise ValueError("expected a JSON list")
    i = skip(text, i + 1)
    more = i < len(text) and text[i] != "]"
    while more:
        try:
            obj, i = scan(text, i)
        except StopIteration as exc:
            raise ValueError(f"expected a JSON value at {exc.value} of the JSON list") from None
        yield obj
        c = text[i:i + 1]
        if c in _BLANKS:
            i = skip(text, i)
            c = text[i:i + 1]
        if c == ",":
            i += 1
            if text[i:i + 1] in _BLANKS:
                i = skip(text, i)
        elif c == "]":
            more = False
        else:
            raise ValueError(f"expected ',' or ']' at {i} of the JSON list")
    if text[i:i + 1] != "]" or skip(text, i + 1) != len(text):
        raise ValueError("the JSON list is cut short or followed by more")


_BLANKS = frozenset(" \t\n\r")


def _dst(dst: str, family: int) -> str:
    if dst == "default":
        return "0.0.0.0/0" if family == AF_INET else "::/0"
    if family == AF_INET:
        # ip prints the kernel's (already masked) prefix in canonical dotted form.
        return dst if "/" in dst else dst + "/32"
    return canon_cidr(dst)  # ipaddress spelling (e.g. of v4-mapped prefixes), as the drivers use


def _addr(addr: str | None, family: int) -> str | None:
    if not addr:
        return None
    return addr if family == AF_INET else canon_ip(addr)


def parse_route_dump(text: str, family: int, table: int, *, oif: int | None = None,
                     name_to_index: dict[str, int]) -> list[Route]:
    """``ip -j -d -N route show table T [dev NAME]`` output -> routes.

    ``oif`` is the index of the ``dev`` filter, if one was used (``ip`` then
    omits ``dev``).  Fields ``ip`` leaves out take iproute2's defaults (type
    unicast, protocol boot, scope universe, metric 0).  Multipath routes have
    no top-level ``dev``/``gateway`` and come back with ``oif`` 0.
    """
    out = []
    # Every interface has the same link-local prefix in the IPv6 table: each spelling is canonicalised once.
    dsts: dict[str, str] = {}
    for r in _load(text):
        if "table" in r and _int(r["table"], table) != table:
            continue
        dst = dsts.get(r["dst"])
        if dst is None:
            dst = dsts[r["dst"]] = _dst(r["dst"], family)
        dev = r.get("dev")
        if oif:
            ifindex = oif
        elif dev is None:
            ifindex = 0
        else:
            found = name_to_index.get(dev)
            if found is None:
                continue  # interface appeared/vanished during the dump
            ifindex = found
        mtu = None
        for m in r.get("metrics") or ():
            if isinstance(m, dict) and "mtu" in m:
                mtu = _int(m["mtu"], 0) or None
        tos = r.get("tos")
        out.append(Route(
            family=family,
            dst=dst,
            table=table,
            tos=int(tos, 16) if isinstance(tos, str) else _int(tos, 0),  # ip prints TOS in hex
            priority=_int(r.get("metric"), 0),
            type=_int(r.get("type"), RTN_UNICAST),
            scope=_int(r.get("scope"), RT_SCOPE_UNIVERSE),
            protocol=_int(r.get("protocol"), RTPROT_BOOT),
            oif=ifindex,
            gateway=_addr(r.get("gateway"), family),
            src=_addr(r.get("prefsrc"), family),
            onlink="onlink" in (r.get("flags") or ()),
            mtu=mtu,
        ))
    return out


def _mac(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    if len(value) == 17 and value.count(":") == 5:
        return value.lower()  # ip prints 6-byte addresses as %02x:%02x:...: already canonical
    if len(value.split(":")) == 6:
        return canon_mac(value)
    return None


def parse_link_dump(text: str) -> list[Link]:
    """``ip -j -d link show`` output -> links (VXLAN parameters decoded).

    ``oper_up`` is the kernel's IFF_RUNNING, which ``ip`` does not print: it
    is set exactly when the link is UP and ``ip`` does not add NO-CARRIER.
    """
    out: list[Link] = []
    index_of: dict[str, int] = {}
    vxlans: list[tuple[int, dict[str, Any]]] = []  # (position in out, info_data): parents named later
    for link in _load(text):
        flags = link.get("flags") or ()
        info = link.get("linkinfo") or {}
        kind = info.get("info_kind") or ""
        index_of[link["ifname"]] = int(link["ifindex"])
        data = info.get("info_data")
        if kind == "vxlan" and isinstance(data, dict):
            vxlans.append((len(out), data))
        out.append(Link(
            index=int(link["ifindex"]),
            name=link["ifname"],
            kind=kind,
            mtu=_int(link.get("mtu"), 0),
            mac=_mac(link.get("address")),
            admin_up="UP" in flags,
            oper_up="UP" in flags and "NO-CARRIER" not in flags,
        ))
    for pos, data in vxlans:  # a parent may come after its VXLAN device in the dump
        parent = data.get("link")
        parent_index = 0
        if parent:
            parent_index = index_of.get(parent, 0)
            m = re.fullmatch(r"if(\d+)", parent)
            if not parent_index and m:
                parent_index = int(m.group(1))  # ip's spelling of an index it cannot name
        out[pos] = replace(out[pos], vxlan=VXLANInfo(
            vni=_int(data.get("id"), 0),
            port=_int(data.get("port"), 0),
            local=data.get("local") or data.get("local6") or None,
            parent_index=parent_index,
            learning=bool(data.get("learning")),
            gbp="gbp" in data,
            l2miss=bool(data.get("l2miss")),
        ))
    return out


def parse_neigh_dump(text: str, family: int, *, ifindex: int | None = None,
                     name_to_index: dict[str, int]) -> list[Neigh]:
    """``ip -j neigh show [dev NAME]`` output -> neighbours (``ifindex``: the ``dev`` filter)."""
    out = []
    for n in _load(text):
        dst = n.get("dst")
        if not dst:
            continue
        if ifindex:
            idx = ifindex
        else:
            found = name_to_index.get(n.get("dev", ""))
            if found is None:
                continue
            idx = found
        state = 0
        for name in n.get("state") or ():
            state |= NUD_BY_NAME.get(name, 0)
        out.append(Neigh(family, idx, dst if family == AF_INET else canon_ip(dst), _mac(n.get("lladdr")), state))
    return out


def fdb_replace_line(entry: FDBEntry, dev: str) -> str:
    parts = ["fdb", "replace", entry.mac, "dev", dev]
    if entry.dst:
        parts += ["dst", entry.dst]
    parts += ["self", "permanent"]
    return " ".join(parts)


def parse_fdb_dump(text: str, ifindex: int) -> list[FDBEntry]:
    """``bridge -j fdb show dev NAME`` output -> the device's FDB entries (state/flags as netlink has them)."""
    out = []
    for e in _load(text):
        mac = _mac(e.get("mac"))
        if not mac:
            continue
        state = e.get("state") or ""
        flags = e.get("flags") or ()
        dst = e.get("dst")
        out.append(FDBEntry(ifindex, mac, canon_ip(dst) if isinstance(dst, str) and dst else None,
                            NUD_PERMANENT if state == "permanent" else NUD_BY_NAME.get(str(state).upper(), 0),
                            NTF_SELF if "self" in flags else 0))
    return out


# ---------------------------------------------------------------------------- running ip
class IpTool:
    """Runs ``ip`` through a :class:`CommandRunner`; ``names()`` gives the index->name map.

    Batch calls never raise per item (one errno per item, 0 = done); dumps
    raise :class:`NetlinkCallError`.
    """

    def __init__(self, runner: CommandRunner, names: Callable[[], dict[int, str]], ip: str = "ip",
                 max_dump_attempts: int = 5, bridge: str = "bridge", tc: str = "tc",
                 names_of: Callable[[Iterable[int]], dict[int, str]] | None = None) -> None:
        self.runner = runner
        self.names = names
        # The names of some interfaces (ifnames.indextonames): what a batch or a one-device dump asks for
        # instead of the whole map, a full link dump in the kernel.
        self.names_of = names_of
        self.ip = ip
        self.bridge = bridge
        self.tc = tc
        self.max_dump_attempts = max_dump_attempts

    def _run(self, args: Sequence[str], stdin: str | None = None) -> CommandResult:
        return self.runner.run([self.ip, *args], stdin)

    def _names_for(self, indexes: Iterable[int]) -> dict[int, str]:
        """index -> name for *indexes* (others may be in it too; a missing interface is absent)."""
        if self.names_of is None:
            return self.names()
        return self.names_of({i for i in indexes if i})

    # -- writes ------------------------------------------------------------------
    def routes_replace(self, routes: Sequence[Route]) -> list[int]:
        return self._write("route replace", routes, route_replace_line,
                           lambda r: r.oif if route_dev_needed(r) else 0)

    def routes_delete(self, routes: Sequence[Route]) -> list[int]:
        return self._write("route del", routes, lambda r, _dev: route_delete_line(r), lambda r: 0)

    def neighs_replace(self, neighs: Sequence[Neigh]) -> list[int]:
        return self._write("neigh replace", neighs, neigh_replace_line, lambda n: n.ifindex, dev_required=True,
                           locate=self._locate_neigh_abort)

    def fdbs_replace(self, entries: Sequence[FDBEntry]) -> list[int]:
        return self._write("fdb replace", entries, fdb_replace_line, lambda e: e.ifindex, dev_required=True,
                           locate=self._locate_fdb_abort, tool=self.bridge)

    def tc_batch(self, items: Sequence[Any], line_of: Callable[[Any, str], str], *,
                 while_running: Callable[[], None] | None = None) -> list[int]:
        """``tc -force -batch -``: one line per item (``line_of(item, dev)``; each item names its
        interface by ``ifindex``), one errno per item.  ``tc`` keeps going after a failed line and
        reports it as ``ip`` does; it has no abort to locate, so a run that stops early marks every
        unreported line failed."""
        return self._write("tc", items, line_of, lambda item: int(item.ifindex), dev_required=True, tool=self.tc,
                           while_running=while_running)

    def _write(self, op: str, items: Sequence[Any], line_of: Callable[[Any, Any], str],
               oif_of: Callable[[Any], int], *, dev_required: bool = False,
               locate: Callable[[Sequence[Any], Sequence[int]], int | None] | None = None,
               tool: str | None = None, while_running: Callable[[], None] | None = None) -> list[int]:
        """One batch per family (``tool``: ``bridge``, whose lines carry no family, instead of ``ip``);
        *while_running* is called while the first child runs."""
        results = [0] * len(items)
        oifs = [oif_of(item) for item in items]
        before = self._names_for(oifs) if any(oifs) else {}
        groups: dict[int, tuple[list[int], list[str]]] = {}
        used: dict[int, str] = {}
        for i, item in enumerate(items):
            dev = None
            if (dev_required and not oifs[i]) or (tool is None and item.family not in FAMILY_FLAG):
                results[i] = _errno.EINVAL
                continue
            if oifs[i]:
                name = before.get(oifs[i])
                if name is None:
                    results[i] = _errno.ENODEV  # no such interface (any more): not sent
                    continue
                dev = quote_name(name)
                if dev is None:
                    results[i] = _errno.EINVAL
                    log.error("interface name cannot be passed to ip -batch", iface=name)
                    continue
                used[i] = name
            try:
                line = line_of(item, dev)
            except KeyError:  # a route type ip has no keyword for
                results[i] = _errno.EINVAL
                continue
            idxs, lines = groups.setdefault(0 if tool is not None else item.family, ([], []))
            idxs.append(i)
            lines.append(line)
        for family, (idxs, lines) in groups.items():
            argv = [tool] if tool is not None else [self.ip, FAMILY_FLAG[family]]
            self._run_batch(op, argv, [items[i] for i in idxs], idxs, lines, results, locate, while_running)
            while_running = None
        if used:
            after = self._names_for(oifs[i] for i in used)
            for i, name in used.items():
                if not results[i] and after.get(oifs[i]) != name:
                    results[i] = _errno.ENODEV  # the interface went away/was renamed during the batch
        return results

    def _run_batch(self, op: str, argv: list[str], batch: Sequence[Any], idxs: list[int], lines: list[str],
                   results: list[int], locate: Callable[[Sequence[Any], Sequence[int]], int | None] | None,
                   while_running: Callable[[], None] | None = None) -> None:
        start = 0
        runner = self.runner
        while start < len(lines):
            cmd = [*argv, "-force", "-batch", "-"]
            if takes_stdin_lines(runner):
                # The lines as they are, written a piece at a time: joined, 15,000 tc lines at the stress
                # profile's start of day were held twice (list and text) at the apply's peak (#17).
                res = runner.run(cmd, itertools.islice(lines, start, None), while_running=while_running)
            else:
                res = runner.run(cmd, "\n".join(lines[start:]) + "\n", while_running=while_running)
            while_running = None
            report = parse_batch_stderr(res.stderr, res.returncode)
            for n, failure in report.failed.items():
                pos = start + n - 1
                if start <= pos < len(lines):
                    results[idxs[pos]] = failure.errno
                    log.debug("ip batch line failed", op=op, line=lines[pos], error=failure.message)
            if report.aborted is None:
                return
            unknown = list(range(start + report.last_reported, len(lines)))
            pos_in_unknown = locate(batch, unknown) if locate is not None and unknown else None
            if pos_in_unknown is None:
                log.warning("ip batch stopped early; marking the unconfirmed lines failed", op=op,
                            error=report.aborted.message, lines=len(unknown))
                for pos in unknown:
                    results[idxs[pos]] = _errno.EIO
                return
            pos = unknown[pos_in_unknown]
            results[idxs[pos]] = report.aborted.errno
            log.debug("ip batch stopped at a failed line; re-running the rest", op=op, line=lines[pos],
                      error=report.aborted.message)
            start = pos + 1

    def _locate_fdb_abort(self, batch: Sequence[FDBEntry], unknown: Sequence[int]) -> int | None:
        """The first of ``unknown`` (positions in ``batch``) whose entry is not in the kernel."""
        present: dict[tuple[int, str], FDBEntry] = {}
        try:
            for ifindex in {batch[pos].ifindex for pos in unknown}:
                present.update({(e.ifindex, e.mac): e for e in self.fdb_list(ifindex)})
        except NetlinkCallError as exc:
            log.warning("FDB dump to locate a failed batch line failed", error=str(exc))
            return None
        for k, pos in enumerate(unknown):
            want = batch[pos]
            got = present.get((want.ifindex, want.mac))
            if got is None or got.dst != want.dst or not got.state & NUD_PERMANENT:
                return k
        return None

    def fdb_list(self, ifindex: int) -> list[FDBEntry]:
        name = self._names_for((ifindex,)).get(ifindex)
        if name is None:
            raise NetlinkCallError("fdb dump", _errno.ENODEV, f"no interface with index {ifindex}")
        res = self.runner.run([self.bridge, "-j", "fdb", "show", "dev", name])
        if res.returncode != 0:
            failure = failure_from_lines([ln.strip() for ln in res.stderr.splitlines() if ln.strip()])
            raise NetlinkCallError("fdb dump", failure.errno, failure.message)
        if self._names_for((ifindex,)).get(ifindex) != name:
            raise NetlinkCallError("fdb dump", _errno.ENODEV, f"interface {name} changed during the dump")
        try:
            return parse_fdb_dump(res.stdout, ifindex)
        except (ValueError, KeyError, TypeError) as exc:
            raise NetlinkCallError("fdb dump", _errno.EIO, f"unparseable bridge output: {exc}") from exc

    def _locate_neigh_abort(self, batch: Sequence[Neigh], unknown: Sequence[int]) -> int | None:
        """The first of ``unknown`` (positions in ``batch``) whose entry is not in the kernel."""
        family = batch[unknown[0]].family
        try:
            present = {(n.ifindex, n.dst): n for n in self.neigh_list(None, family)}
        except NetlinkCallError as exc:
            log.warning("neighbour dump to locate a failed batch line failed", error=str(exc))
            return None
        for k, pos in enumerate(unknown):
            want = batch[pos]
            got = present.get((want.ifindex, want.dst))
            if got is None or got.lladdr != want.lladdr or not (got.state & want.state or got.state == want.state):
                return k
        return None

    # -- dumps -------------------------------------------------------------------
    def _dump(self, op: str, args: list[str], oif: int | None = None, absent_ok: bool = False,
              names: Mapping[int, str] | None = None) -> tuple[str, dict[str, int]] | None:
        """Run one dump; return its stdout and the names that kept their index throughout.

        The output names interfaces, so their names are read before and after it and only the ones
        that did not change are trusted (a route of an interface renamed or made meanwhile is left
        out, as if the dump had missed it).  A caller that has just listed the links passes that
        listing as *names*: it is the "before", and "after" is one lookup per interface the output
        names (``names_of``), not a second whole map -- each whole map is a link dump in the kernel
        (~12 ms at 1,000 interfaces), and a dump that names no interface then asks nothing."""
        for _attempt in range(self.max_dump_attempts):
            # A dump of one interface's objects needs that interface's name alone.
            if oif:
                before: Mapping[int, str] = self._names_for((oif,))
            else:
                before = names if names is not None else self.names()
            argv = list(args)
            name = None
            if oif:
                name = before.get(oif)
                if name is None:
                    raise NetlinkCallError(op, _errno.ENODEV, f"no interface with index {oif}")
                argv += ["dev", name]
            res = self._run(argv)
            if "Dump was interrupted" in res.stderr:
                continue
            if res.returncode != 0:
                if absent_ok and "does not exist" in res.stderr:
                    return None
                failure = failure_from_lines([ln.strip() for ln in res.stderr.splitlines() if ln.strip()])
                raise NetlinkCallError(op, failure.errno, failure.message)
            if oif:
                after = self._names_for((oif,))
                if after.get(oif) != name:
                    raise NetlinkCallError(op, _errno.ENODEV, f"interface {name} changed during the dump")
            elif names is not None and self.names_of is not None:
                index_of = {n: i for i, n in before.items()}
                named = dumped_dev_names(res.stdout)
                after = self.names_of({index_of[n] for n in named if n in index_of})
            else:
                after = self.names()
            return res.stdout, {n: i for i, n in after.items() if before.get(i) == n}
        raise NetlinkCallError(op, _errno.EINTR, "dump kept being interrupted")

    def route_list(self, family: int, table: int, oif: int | None = None, *,
                   names: Mapping[int, str] | None = None) -> list[Route]:
        got = self._dump("route dump", [FAMILY_FLAG[family], "-j", "-d", "-N", "route", "show", "table", str(table)],
                         oif, absent_ok=True, names=names)
        if got is None:
            return []  # the table does not exist (yet): empty
        try:
            return parse_route_dump(got[0], family, table, oif=oif, name_to_index=got[1])
        except (ValueError, KeyError, TypeError) as exc:
            raise NetlinkCallError("route dump", _errno.EIO, f"unparseable ip output: {exc}") from exc

    def link_list(self) -> list[Link]:
        for _attempt in range(self.max_dump_attempts):
            res = self._run(["-j", "-d", "link", "show"])
            if "Dump was interrupted" in res.stderr:
                continue
            if res.returncode != 0:
                failure = failure_from_lines([ln.strip() for ln in res.stderr.splitlines() if ln.strip()])
                raise NetlinkCallError("link dump", failure.errno, failure.message)
            try:
                return parse_link_dump(res.stdout)
            except (ValueError, KeyError, TypeError) as exc:
                raise NetlinkCallError("link dump", _errno.EIO, f"unparseable ip output: {exc}") from exc
        raise NetlinkCallError("link dump", _errno.EINTR, "dump kept being interrupted")

    def neigh_list(self, ifindex: int | None, family: int, *,
                   names: Mapping[int, str] | None = None) -> list[Neigh]:
        got = self._dump("neigh dump", [FAMILY_FLAG[family], "-j", "neigh", "show", "nud", "all"], ifindex,
                         names=names)
        assert got is not None
        try:
            return parse_neigh_dump(got[0], family, ifindex=ifindex, name_to_index=got[1])
        except (ValueError, KeyError, TypeError) as exc:
            raise NetlinkCallError("neigh dump", _errno.EIO, f"unparseable ip output: {exc}") from exc
