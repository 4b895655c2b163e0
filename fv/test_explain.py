"""``felixpy explain`` as an operator runs it: the CLI against the node's kernel, daemon running and stopped.

(Every connectivity assertion of every FV test also cross-checks explain's verdict per
matrix cell, in-process: fv/explaincheck.py.  This file checks the CLI's own answer —
what decided, in which tier, through which IP set — and that it reads the kernel, not
the daemon.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from felixpy.testing import netns as nsmod
from felixpy.testing.daemon import REPO
from fv.datastore import addr, datastore, nets, policy, tier, workload
from fv.expect import ICMP, TCP, Expect
from fv.harness import FamilyView, FvNode

pytestmark = [pytest.mark.fv,
              pytest.mark.tables_only("the explain CLI reads *tables state; its BPF-map reader is still to come")]


def explain(netns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "felixpy", "explain", "--netns", netns, *args],
                          capture_output=True, text=True, timeout=60, cwd=str(REPO))


def answer(fv: FamilyView, src: str, dst: str, *args: str) -> dict[str, Any]:
    res = explain(fv.node.netns, "--src", fv.addr(src), "--dst", fv.addr(dst), *args, "--json")
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_cli_names_tier_policy_and_ip_set_with_daemon_running_and_stopped(fv: FamilyView) -> None:
    """b, tier1: pass a and c; tier2: deny a, allow members of s:clients (c).  a → b is denied by
    tier2 (after tier1's pass), c → b allowed by tier2 through the IP set."""
    fv.apply(datastore(
        ipsets=[{"id": "s:clients", "type": "net", "members": nets("c")}],
        policies=[policy("t1-pass", tier="tier1", inbound=[{"action": "pass", "src_net": nets("a", "c")}]),
                  policy("t2", tier="tier2", inbound=[{"action": "deny", "src_net": nets("a")},
                                                      {"action": "allow", "src_ip_set_ids": ["s:clients"]}])],
        workloads=[workload("a"), workload("c"),
                   workload("b", tiers=[tier("tier1", ingress=["t1-pass"]), tier("tier2", ingress=["t2"])])]))
    fv.check(Expect(True).block(src="a", dst="b"), (TCP, ICMP))

    def check_answers() -> None:
        denied = answer(fv, "a", "b", "--proto", "tcp", "--dport", "8080")
        assert denied["verdict"] == "deny"
        assert denied["mode"] == fv.mode and denied["ip_version"] == fv.v
        assert [(p["name"], p["tier"], p["outcome"]) for p in denied["policies"] if p["kind"] == "policy"] == [
            ("GlobalNetworkPolicy t1-pass", "tier1", "pass"), ("GlobalNetworkPolicy t2", "tier2", "deny")]
        assert denied["decided_by"]["name"] == "GlobalNetworkPolicy t2"
        assert denied["decided_by"]["rule_index"] == 0
        assert denied["tiers"] == ["tier1", "tier2"]

        allowed = answer(fv, "c", "b", "--proto", "tcp", "--dport", "8080")
        assert allowed["verdict"] == "allow"
        assert allowed["decided_by"]["name"] == "GlobalNetworkPolicy t2"
        assert allowed["decided_by"]["rule_index"] == 1
        assert [(s["set"].replace(":", "-"), s["member"]) for s in allowed["ip_sets"]] == \
            [(f"cali{fv.v}0s-clients", addr("c", fv.v))]

    check_answers()
    fv.node.stop_daemon()
    check_answers()   # the kernel, not the daemon, is read

    text = explain(fv.node.netns, "--src", fv.addr("a"), "--dst", fv.addr("b"), "--proto", "tcp", "--dport", "80")
    assert text.returncode == 0 and "verdict:  DENY" in text.stdout and "tier tier2" in text.stdout


def test_cli_says_when_the_state_is_not_felixpys(fv: FamilyView) -> None:
    with nsmod.netns("fpyfvx") as empty:
        res = explain(empty, "--src", fv.addr("a"), "--dst", fv.addr("b"), "--proto", "tcp", "--dport", "80")
    assert res.returncode == 3
    assert "no felixpy state" in res.stderr and "Traceback" not in res.stderr


def test_cli_rejects_bad_input(fv: FamilyView) -> None:
    res = explain(fv.node.netns, "--src", "10.0.0.1", "--dst", "fd00::1", "--proto", "tcp")
    assert res.returncode == 2 and "different IP versions" in res.stderr and "Traceback" not in res.stderr


@pytest.fixture(scope="module")
def bpfnode() -> Iterator[FvNode]:
    pytest.importorskip("bcc")
    node = FvNode.create("bpf-legacy")
    try:
        yield node
    finally:
        node.close()


@pytest.mark.bpf
@pytest.mark.parametrize("v", [4, 6])
def test_cli_says_bpf_mode_is_not_readable_yet(bpfnode: FvNode, v: int) -> None:
    """In BPF mode policy runs in the programs; the *tables hold only the guards around them, which
    alone would deny every workload packet.  explain says so (exit 3) rather than answer wrongly."""
    fv = FamilyView(bpfnode, v)
    fv.apply(datastore(workloads=[workload("a"), workload("b")]))
    fv.check(Expect(True), (TCP,), names=["a", "b"])
    res = explain(bpfnode.netns, "--src", fv.addr("a"), "--dst", fv.addr("b"), "--proto", "tcp", "--dport", "8080")
    assert res.returncode == 3, res.stdout
    assert "BPF mode" in res.stderr and "Traceback" not in res.stderr
