"""Run a hostile stream through the daemon's own manager graph over stateful fakes, and judge it.

:func:`run` builds a :class:`managers.harness.Node` (``wiring.build`` over fakes, dual-stack) in a mode,
brings the sentinel interface up, sends the stream with the sentinels interleaved, applies every few
messages (the daemon's batches) and at the end, capturing every structlog event at warning and above.
:func:`problems` then lists what went wrong, empty when the run is clean:

* an exception escaped a manager or a driver (a ``log.exception`` line, or an apply step that failed);
* a known-bad object was not rejected with a logged reason naming it;
* a sentinel is not programmed in the fake kernel (its endpoint chains, policy and profile chains, IP set
  with its members, local route), per family;
* something programmed that no kernel would take: a chain name that ``iptables-restore``/``nft`` cannot
  parse (whitespace, quotes, control characters, over the length limit), a rule rendering with a line
  break, an IP set name with whitespace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from structlog.testing import LogCapture

from felixpy.config import Config
from felixpy.drivers.generictables.model import Goto, Jump
from felixpy.drivers.iptables.detect import Features
from felixpy.drivers.iptables.render import render_body
from felixpy.drivers.nftables.render import rule_expr, rule_text
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules.ipset_names import main_ipset_name
from managers.harness import Node

from .feedfuzz import GOOD_IFACE, GOOD_POLICY, GOOD_PROFILE, GOOD_SET, Bad, sentinels

MODES = {"iptables": Config(NFTablesMode="Disabled"), "nftables": Config(NFTablesMode="Enabled")}

# What iptables-restore and nft can take as a chain name: printable, no blank or quote (nft quotes nothing).
_CHAIN_NAME = re.compile(r"^[A-Za-z0-9_.:/+@%=,#-]+$")
_IPSET_NAME = re.compile(r"^[A-Za-z0-9_.:/+@%=,-]{1,31}$")
_FEATURES = Features()
CRASH_EVENTS = ("Manager failed to handle update; skipped", "Failed to render policy; keeping its previous chains",
                "Failed to render profile; keeping its previous chains", "Syncer failed to take interface update")


@contextmanager
def captured_logs() -> Iterator[LogCapture]:
    cap = LogCapture()
    structlog.configure(processors=[cap], wrapper_class=structlog.make_filtering_bound_logger(30))
    try:
        yield cap
    finally:
        structlog.reset_defaults()


@dataclass
class Outcome:
    mode: str
    events: list[dict[str, Any]]
    failed_applies: list[tuple[list[str], list[str]]]
    bad: list[Bad]
    node: Node
    messages: int = 0
    notes: list[str] = field(default_factory=list)


def run(mode: str, items: Sequence[Any], *, positions: Sequence[int] = (), apply_every: int = 10) -> Outcome:
    """Feed *items* (payloads and :class:`Bad`) with the sentinels inserted at *positions*."""
    stream: list[Any] = list(items)
    goods = sentinels()
    for k, msg in enumerate(goods):
        at = positions[k] % (len(stream) + 1) if k < len(positions) else 0
        stream.insert(at, msg)
    failed: list[tuple[list[str], list[str]]] = []
    bad: list[Bad] = []
    with captured_logs() as cap:
        node = Node(families=(4, 6), config=replace(MODES[mode], Ipv6Support=True))
        node.link_up(GOOD_IFACE, mac="ee:ee:ee:ee:ee:ee")
        node.send(pb.InSync())
        node.dp.set_iface_in_sync()
        node._started = True  # noqa: SLF001  (the harness's own start-of-day, done here)
        for i, item in enumerate(stream):
            if isinstance(item, Bad):
                bad.append(item)
                item = item.msg
            node.send(item)
            if (i + 1) % max(apply_every, 1) == 0:
                _apply(node, failed)
        # The sentinels, once more, after everything (a later hostile update of a good id is not ours to judge:
        # the pools never produce the good ids, so these must be no-ops for the kernel).
        _apply(node, failed)
        _apply(node, failed)  # a second apply converges anything rescheduled
    return Outcome(mode, list(cap.entries), failed, bad, node, messages=len(stream))


def _apply(node: Node, failed: list[tuple[list[str], list[str]]]) -> None:
    report = node.dp.apply()
    if not report.ok or report.held_back:
        failed.append((list(report.failed_steps), list(report.held_back)))


def _text(event: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in event.items())


def problems(out: Outcome) -> list[str]:
    found: list[str] = []
    for ev in out.events:
        if ev.get("event") in CRASH_EVENTS or ev.get("exc_info"):
            found.append(f"exception escaped: {ev.get('event')} {str(ev)[:600]}")
    for steps, held in out.failed_applies:
        found.append(f"apply failed: steps={steps} held_back={held}")
    texts = [_text(ev) for ev in out.events if ev.get("log_level") in ("warning", "error", "critical")]
    for b in out.bad:
        if not any(b.ident in t for t in texts):
            found.append(f"bad object not rejected with a log naming it: {b.ident} ({b.what[:200]})")
    found += sentinel_problems(out.node)
    found += kernel_acceptance(out.node, out.mode)
    return found


def sentinel_problems(node: Node) -> list[str]:
    found: list[str] = []
    for v, fam in node.fam.items():
        flt = fam.filter
        for chain in (f"cali-tw-{GOOD_IFACE}", f"cali-fw-{GOOD_IFACE}", f"cali-pi-gnp/{GOOD_POLICY}",
                      f"cali-po-gnp/{GOOD_POLICY}", f"cali-pri-{GOOD_PROFILE}", f"cali-pro-{GOOD_PROFILE}"):
            if not flt.is_programmed(chain):
                found.append(f"v{v}: sentinel chain {chain} not programmed")
        set_name = main_ipset_name(GOOD_SET, v)
        if set_name not in node.ipset_kernel.sets:
            found.append(f"v{v}: sentinel IP set {set_name} missing")
        else:
            want = "198.51.100.50" if v == 4 else "2001:db8:ffff::50"
            if want not in node.ipset_kernel.members(set_name):
                found.append(f"v{v}: sentinel IP set {set_name} lost member {want}")
        dst = "198.51.100.7/32" if v == 4 else "2001:db8:ffff::7/128"
        routes = node.routes(v)
        if dst not in routes or routes[dst].oif != node.ifindex(GOOD_IFACE):
            found.append(f"v{v}: sentinel route {dst} via {GOOD_IFACE} missing: {routes.get(dst)}")
        if node.status.get(("k8s", "fuzz/good", "eth0")) != "up":
            found.append(f"sentinel endpoint status {node.status.get(('k8s', 'fuzz/good', 'eth0'))!r}")
    return found


def kernel_acceptance(node: Node, mode: str) -> list[str]:
    """What a real kernel's tools would refuse, in what the fakes hold as programmed."""
    limit = 28 if mode == "iptables" else 255
    found: list[str] = []
    for t in node.tables():
        for name in sorted(t.programmed_names()):
            if not _CHAIN_NAME.match(name) or len(name) > limit:
                found.append(f"{t.name}/v{t.ip_version}: unusable chain name {name[:80]!r} (len {len(name)})")
            for i, r in enumerate(t.programmed_chain(name).rules):
                if isinstance(r.action, (Jump, Goto)) and not _CHAIN_NAME.match(r.action.target):
                    found.append(f"{t.name}/v{t.ip_version}: {name[:40]} rule {i} targets {r.action.target[:80]!r}")
                try:
                    if mode == "iptables":
                        body = render_body(r, _FEATURES)
                    else:
                        body = rule_text(r, t.ip_version)
                        json.dumps(rule_expr(r, t.ip_version))
                except Exception as exc:  # noqa: BLE001 — a rule the renderer cannot take is a finding
                    found.append(f"{t.name}/v{t.ip_version}: {name[:40]} rule {i} does not render: {exc!r}")
                    continue
                if "\n" in body or "\r" in body or "\x00" in body:
                    found.append(f"{t.name}/v{t.ip_version}: {name[:40]} rule {i} renders a line break: {body[:120]!r}")
    for t in node.tables():
        missing = t.referenced_ip_sets() - set(node.ipset_kernel.sets)
        if missing:
            found.append(f"{t.name}/v{t.ip_version}: rules reference missing IP sets {sorted(missing)[:5]}")
    for set_name in node.ipset_kernel.sets:
        if not _IPSET_NAME.match(set_name):
            found.append(f"unusable IP set name {set_name!r}")
    return found

