"""``felixpy explain`` as an operator runs it: the CLI against the node's kernel, daemon running and stopped.

(Every connectivity assertion of every FV test also cross-checks explain's verdict per
matrix cell, in-process: fv/explaincheck.py, in the BPF modes from the node's pins.  This
file checks the CLI's own answer — what decided, in which tier, through which IP set — and
that it reads the kernel, not the daemon, in every mode; in the BPF modes it also
cross-checks every cell of its matrices with the daemon stopped (:func:`bpf_cross_check`).)

BPF modes: the FV node pins to its own bpffs, mounted by the test process on a temp dir
before the daemon starts (fv.harness), so ``ip netns exec``'s private mount namespace
inherits the mount and the test sees the same pins at the same path; explain is pointed
there with ``--bpf-pin-root`` (as an operator would point it at ``FELIXPY_BPF_PIN_ROOT``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from felixpy.testing import netns as nsmod
from felixpy.testing.daemon import REPO
from felixpy.drivers.cmdshim import SubprocessRunner
from felixpy.explain.readers import read_kernel
from fv.datastore import addr, datastore, nets, policy, tier, workload
from fv.explaincheck import explain_cell
from fv.expect import ICMP, TCP, Expect
from fv.harness import BPF_MODES, FamilyView

pytestmark = [pytest.mark.fv]


def pin_root(fv: FamilyView) -> str | None:
    return f"{fv.node.bpffs}/tc/globals" if fv.mode in BPF_MODES and fv.node.bpffs else None


def explain(fv: FamilyView, *args: str, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    root = pin_root(fv)
    extra = ["--bpf-pin-root", root] if root is not None and "--bpf-pin-root" not in args else []
    return subprocess.run([sys.executable, "-m", "felixpy", "explain", "--netns", netns or fv.node.netns,
                           *extra, *args], capture_output=True, text=True, timeout=60, cwd=str(REPO))


def bpf_cross_check(fv: FamilyView, probes: Any) -> None:
    """BPF modes: explain's verdict (read from the pins, in-process) = what the packets did, every cell
    (every fv.check does the same, fv/explaincheck.py; this one also runs with the daemon stopped)."""
    if fv.mode not in BPF_MODES:
        return
    actual = fv.node.probe(fv.v, probes)
    state = read_kernel(SubprocessRunner(netns=fv.node.netns), fv.v, full=True, bpf_pin_root=pin_root(fv))
    assert state.bpf is not None, state.bpf_problem
    wrong = []
    for (probe, s, d), got in sorted(actual.items(), key=str):
        ok, ex_req, ex_reply = explain_cell(state, probe, fv.node.endpoints[s].ip(fv.v), fv.node.endpoints[d].ip(fv.v))
        if ok != got:
            wrong.append(f"{probe} {s}->{d}: packet {'passed' if got else 'blocked'}, explain says "
                         f"{ex_req.verdict}/{ex_reply.verdict} ({ex_req.decided_by}; {ex_req.notes})")
    assert not wrong, f"[{fv.mode} IPv{fv.v}] explain disagrees with the packets:\n" + "\n".join(wrong)


def answer(fv: FamilyView, src: str, dst: str, *args: str) -> dict[str, Any]:
    res = explain(fv, "--src", fv.addr(src), "--dst", fv.addr(dst), *args, "--json")
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
    bpf_cross_check(fv, (TCP, ICMP))

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
        # BPF mode's IP sets are keyed by the feed's id (cali_v<n>_ip_sets), the *tables' by the ipset name.
        want_set = "s:clients" if fv.mode in BPF_MODES else f"cali{fv.v}0s-clients"
        assert [(s["set"].replace(":", "-") if fv.mode not in BPF_MODES else s["set"], s["member"])
                for s in allowed["ip_sets"]] == [(want_set, addr("c", fv.v))]

    check_answers()
    fv.node.stop_daemon()
    check_answers()   # the kernel, not the daemon, is read
    if fv.mode in BPF_MODES:
        bpf_cross_check(fv, (TCP, ICMP))   # the pins, daemon stopped

    text = explain(fv, "--src", fv.addr("a"), "--dst", fv.addr("b"), "--proto", "tcp", "--dport", "80")
    assert text.returncode == 0 and "verdict:  DENY" in text.stdout and "tier tier2" in text.stdout


def test_cli_says_when_the_state_is_not_felixpys(fv: FamilyView) -> None:
    with nsmod.netns("fpyfvx") as empty:
        res = explain(fv, "--src", fv.addr("a"), "--dst", fv.addr("b"), "--proto", "tcp", "--dport", "80",
                      netns=empty)
    assert res.returncode == 3
    assert "no felixpy state" in res.stderr and "Traceback" not in res.stderr


def test_cli_rejects_bad_input(fv: FamilyView) -> None:
    res = explain(fv, "--src", "10.0.0.1", "--dst", "fd00::1", "--proto", "tcp")
    assert res.returncode == 2 and "different IP versions" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.bpf_only
def test_cli_in_bpf_mode_says_when_the_pins_are_not_felixpys(fv: FamilyView, tmp_path: Any) -> None:
    """BPF mode with no felixpy pins where explain looks: exit 3, saying where it looked; it never
    falls back to evaluating the *tables guards alone (which would deny every workload packet)."""
    fv.apply(datastore(workloads=[workload("a"), workload("b")]))
    fv.check(Expect(True), (TCP,), names=["a", "b"])
    res = explain(fv, "--bpf-pin-root", str(tmp_path), "--src", fv.addr("a"), "--dst", fv.addr("b"),
                  "--proto", "tcp", "--dport", "8080")
    assert res.returncode == 3, res.stdout
    assert "BPF mode" in res.stderr and "no felixpy BPF pins" in res.stderr and str(tmp_path) in res.stderr
    assert "Traceback" not in res.stderr
