"""Drift on a running node, per mode, IPv4 and IPv6 (see :mod:`fv.chaos.drift`).

With every refresh interval at ``DRIFT_REFRESH`` seconds (IptablesRefreshInterval, NftablesRefreshInterval,
IpsetsRefreshInterval, RouteRefreshInterval), a foreign hand deletes one of our chains, alters one of our
rules, removes a set member, deletes our VXLAN route, FDB and ARP/NDP entries and inserts a rule above our
jump in FORWARD, in both families at once; then deletes the VXLAN device. The kernel must come back to what it
was (the foreign rule above our jump stays in iptables modes, below our jump now), foreign chains, rules,
tables and routes untouched, and every repair reported: ``felixpy_drift_repairs{kind}`` on the metrics
endpoint moved by exactly what was done, one ``drift repaired`` log line per table and refresh that found
something, none while nothing drifted, and ``felixpy status`` shows the total.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from felixpy.nodestatus import query
from fv.chaos.drift import FOREIGN_ROUTE, FOREIGN_SRC, Hand, without_foreign_insert
from fv.chaos.worlds import WorldNode, drift_repairs, full_dump, full_world, remote, settled_dump, world_config
from fv.chaos.kill9 import dump_diff
from fv.expect import ICMP, TCP, Expect
from fv.harness import HOST, MODES

pytestmark = pytest.mark.fv

REFRESH = os.environ.get("DRIFT_REFRESH", "2")
REPAIR_WAIT = 60.0  # seconds: a generous bound on a shared machine (the measured time is printed)


def refresh_config() -> dict[str, str]:
    return world_config("x", IptablesRefreshInterval=REFRESH, NftablesRefreshInterval=REFRESH,
                        IpsetsRefreshInterval=REFRESH, RouteRefreshInterval=REFRESH)


def drift_log_lines(node: WorldNode) -> list[str]:
    assert node.daemon is not None
    return [ln for ln in node.daemon.logs().splitlines() if "drift repaired" in ln]


@pytest.mark.parametrize("mode", list(MODES))
def test_drift_is_repaired_reported_and_foreign_objects_survive(mode: str) -> None:
    node = WorldNode.create(mode)
    hand = Hand(node.netns, mode)
    try:
        node.apply(full_world("x", 10), config=refresh_config())
        clean = settled_dump(node)
        for v in (4, 6):
            hand.add_foreign(v)
        # Foreign objects are not drift: they stay, and nothing is counted or logged for them.
        time.sleep(3 * float(REFRESH))
        reference = settled_dump(node)
        added = dump_diff(clean, reference, limit=100)
        assert all(ln.startswith(("---", "+++", "@@", " ", "+")) for ln in added), \
            f"[{mode}] the daemon removed something after foreign objects were added:\n" + "\n".join(added)
        for v in (4, 6):
            assert FOREIGN_ROUTE[v] in " ".join(reference[f"routes v{v}"])
        before = drift_repairs(node.scrape())
        assert sum(before.values()) == 0 and not drift_log_lines(node), (before, drift_log_lines(node))

        vxlan_routes = remote("x")["blocks"]
        for v in (4, 6):
            chain = hand.delete_policy_chain(v)
            hand.alter_policy_rule(v, not_chain=chain)
            hand.remove_set_member(v)
            hand.delete_route(v, vxlan_routes[0 if v == 4 else 1])
            hand.delete_fdb(v, remote("x"))
            hand.delete_neighbour(v, remote("x"))
            hand.insert_above_our_jump(v)
        diff, took = _wait_repaired(node, reference, mode)
        got = full_dump(node)
        assert not diff, f"[{mode}] not repaired within {REPAIR_WAIT}s of:\n" + "\n".join(hand.done) + \
            "\nstill different:\n" + "\n".join(diff)
        if mode != "nftables":
            for v in (4, 6):
                fwd = [ln for ln in got[f"v{v} filter"] if ln.startswith("-A FORWARD")]
                ours = next(i for i, ln in enumerate(fwd) if "cali-FORWARD" in ln)
                foreign = next((i for i, ln in enumerate(fwd) if f"-s {FOREIGN_SRC[v]}" in ln), None)
                assert foreign is not None, f"[{mode}] v{v}: the foreign rule above our jump was removed: {fwd}"
                assert ours < foreign, f"[{mode}] v{v}: our jump is not back on top of FORWARD: {fwd}"
        # Reported: the counter (scraped), the log, the status.
        deadline = time.monotonic() + 10
        want = {"chain": 2, "rule": 6, "set_member": 2, "route": 2, "fdb": 2, "neighbour": 2}
        while (after := drift_repairs(node.scrape())) != want and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"[{mode}] drift repaired {took:.2f}s after the foreign edits (refresh {REFRESH}s); counter {after}")
        assert after == want, f"[{mode}] felixpy_drift_repairs moved by {after}, want {want} for:\n" + \
            "\n".join(hand.done)
        lines = drift_log_lines(node)
        assert lines and all("drift repaired" in ln for ln in lines), lines
        assert node.daemon is not None and node.daemon.status_socket
        assert query(node.daemon.status_socket)["drift_repairs"] == sum(want.values())
        # Quiet again: another few refreshes find nothing, count nothing, log nothing.
        time.sleep(3 * float(REFRESH))
        assert drift_repairs(node.scrape()) == want and drift_log_lines(node) == lines
        # Round two: the VXLAN device itself.  Deleting it takes its FDB/ARP entries and the route via it
        # with it: all come back, and only the device counts — the entries and the route are rewritten
        # because the device (its ifindex) is new, an ordinary consequence of the one repair.
        hand.delete_device("vxlan.calico")
        t0 = time.monotonic()
        while (diff := dump_diff(reference, without_foreign_insert(full_dump(node)), limit=60)) and \
                time.monotonic() - t0 < REPAIR_WAIT:
            time.sleep(0.2)
        took = time.monotonic() - t0
        assert not diff, f"[{mode}] the VXLAN device and what went with it not back within {REPAIR_WAIT}s:\n" + \
            "\n".join(diff)
        want2 = {**want, "device": 1}
        deadline = time.monotonic() + 10
        while (after := drift_repairs(node.scrape())) != want2 and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"[{mode}] deleted vxlan.calico back {took:.2f}s later; counter {after}")
        assert after == want2, f"[{mode}] after the device deletion felixpy_drift_repairs is {after}, want {want2}"
        for v in (4, 6):
            node.check(v, Expect(True).block(src="a", dst="b"), (TCP, ICMP), names=[HOST, "a", "b", "c"],
                       what="after the drift repairs")
    finally:
        node.close()


def _foreign_above_our_jump(got: dict[str, list[str]]) -> list[str]:
    """iptables modes: FORWARD chains where the foreign rule is (still) above our jump."""
    out = []
    for v in (4, 6):
        fwd = [ln for ln in got[f"v{v} filter"] if ln.startswith("-A FORWARD")]
        ours = next((i for i, ln in enumerate(fwd) if "cali-FORWARD" in ln), len(fwd))
        foreign = next((i for i, ln in enumerate(fwd) if f"-s {FOREIGN_SRC[v]}" in ln), None)
        if foreign is not None and foreign < ours:
            out.append(f"v{v} FORWARD: the foreign rule is above our jump: {fwd}")
    return out


def _wait_repaired(node: WorldNode, reference: dict[str, list[str]], mode: str) -> tuple[list[str], float]:
    t0 = time.monotonic()
    while True:
        got = full_dump(node)
        diff = dump_diff(reference, without_foreign_insert(got) if mode != "nftables" else got, limit=60)
        if mode != "nftables":
            diff += _foreign_above_our_jump(got)
        if not diff or time.monotonic() - t0 > REPAIR_WAIT:
            return diff, time.monotonic() - t0
        time.sleep(0.1)


@pytest.mark.parametrize("mode", list(MODES))
def test_each_drift_kind_alone_is_repaired_and_counted_as_itself(mode: str) -> None:
    """One kind at a time (both families): the counter moves by exactly that kind; the recovery time
    (foreign edit → dump equal again, polled every 0.1 s) is printed for docs/benchmarks.md."""
    node = WorldNode.create(mode)
    hand = Hand(node.netns, mode)
    vx = remote("x")
    kinds: dict[str, tuple[Callable[[int], object], dict[str, float]]] = {
        "chain deleted": (lambda v: hand.delete_policy_chain(v), {"chain": 2, "rule": 2}),
        "rule altered": (lambda v: hand.alter_policy_rule(v, not_chain=""), {"rule": 2}),
        "set member removed": (lambda v: hand.remove_set_member(v), {"set_member": 2}),
        "route deleted": (lambda v: hand.delete_route(v, vx["blocks"][0 if v == 4 else 1]), {"route": 2}),
        "FDB entry deleted": (lambda v: hand.delete_fdb(v, vx), {"fdb": 2}),
        "neighbour deleted": (lambda v: hand.delete_neighbour(v, vx), {"neighbour": 2}),
        "rule above our jump": (lambda v: hand.insert_above_our_jump(v), {"rule": 2}),
        "device deleted": (lambda v: hand.delete_device("vxlan.calico") if v == 4 else None, {"device": 1}),
    }
    times: dict[str, float] = {}
    try:
        node.apply(full_world("x", 10), config=refresh_config())
        reference = settled_dump(node)
        for name, (edit, want) in kinds.items():
            before = drift_repairs(node.scrape())
            for v in (4, 6):
                edit(v)
            diff, times[name] = _wait_repaired(node, reference, mode)
            assert not diff, f"[{mode}] {name}: not repaired within {REPAIR_WAIT}s:\n" + "\n".join(diff)
            if name == "rule above our jump" and mode != "nftables":
                # The foreign rule stays (below our jump): take it away again for the next kinds.
                for v in (4, 6):
                    hand._run(hand._ipt(v, ""), "-w", "-D", "FORWARD", "-s", FOREIGN_SRC[v], "-j", "ACCEPT")
            deadline = time.monotonic() + 10
            while True:
                after = drift_repairs(node.scrape())
                delta = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
                if delta == want or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert delta == want, f"[{mode}] {name}: felixpy_drift_repairs moved by {delta}, want {want}"
    finally:
        node.close()
    print(f"[{mode}] recovery (refresh {REFRESH}s): " + ", ".join(f"{k} {t:.2f}s" for k, t in times.items()))
