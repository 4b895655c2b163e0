"""Persistent kernel failure with the real daemon in a throwaway namespace (iptables-nft mode).

The failing tool is a stand-in script first on the daemon's ``PATH`` (the real one stays for every other
command):

* ``iptables-restore`` or ``ipset`` that always fails: the daemon never reports ready, retries as Felix
  does (10 attempts, then fatal), and exits 1; the kernel keeps what the previous run programmed, which
  still fails closed for unknown ``cali*`` interfaces;
* an ``iptables-restore`` that hangs: liveness fails within ``DataplaneWatchdogTimeout``.

A netlink failure on one route (others programmed, that one retried) is covered at the driver level by
``tests/routing/test_routetable_fake.py::test_one_failed_route_stays_dirty_and_does_not_block_others``;
a ``nft`` transaction that always fails (libnftables is in-process, so no stand-in script) by
``tests/nftables/test_nft_kernel.py::test_write_that_always_fails_is_fatal``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest

from felixpy.feed.client import connect
from daemon_feeds import datastore, feed_until_in_sync, kernel, rules
from felixpy.testing.daemon import http_status, start_daemon

pytestmark = pytest.mark.kernel

if os.geteuid() != 0:  # pragma: no cover
    pytest.skip("needs root", allow_module_level=True)

HEALTH = {"FELIX_HEALTHENABLED": "true", "FELIX_HEALTHHOST": "127.0.0.1", "FELIX_HEALTHPORT": "9099"}
ENV = {"FELIX_IPTABLESBACKEND": "nft", **HEALTH}


def health(ns: str, what: str) -> int | None:
    return http_status(ns, 9099, what)


def stand_in(script: str, *names: str) -> str:
    d = tempfile.mkdtemp(prefix="fpybin-")
    for n in names:
        path = os.path.join(d, n)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + script + "\n")
        os.chmod(path, 0o755)
    return d


def programmed_node(ns: str) -> str:
    """A first, healthy run programs the node; returns the kernel it left."""
    d = start_daemon(ns, iface_monitor=False, env=ENV)
    try:
        feed_until_in_sync(d, datastore(["10.65.0.9/32"], port=80))
    finally:
        d.stop()
    state = kernel(ns)
    assert '"Unknown interface" -j DROP' in state  # the dispatch chains fail closed for unknown cali*
    return state


@pytest.mark.parametrize("tool", ["iptables-restore", "ipset"])
def test_a_tool_that_always_fails_ends_in_exit_1_never_ready_kernel_kept(netns: str, tool: str) -> None:
    before = programmed_node(netns)
    rules_before = rules(netns)
    names = ("iptables-nft-restore", "ip6tables-nft-restore") if tool == "iptables-restore" else ("ipset",)
    real_ipset = "/usr/sbin/ipset"
    script = ('cat >/dev/null; echo "stand-in: line 2 failed" >&2; exit 1' if tool == "iptables-restore" else
              # Reads pass (the driver must see the kernel), every write fails.
              f'case "$1" in list|save) exec {real_ipset} "$@";; esac; cat >/dev/null; '
              'echo "stand-in: write refused" >&2; exit 1')
    bindir = stand_in(script, *names)
    d = start_daemon(netns, iface_monitor=False, env={**ENV, "PATH": f"{bindir}:{os.environ['PATH']}"})
    try:
        c = connect(d.target)
        c.send(datastore(["10.65.0.10/32"], port=81))  # a change of rules and members: the daemon must write
        ready_seen = []
        deadline = time.monotonic() + 60
        while d.alive() and time.monotonic() < deadline:
            ready_seen.append(health(netns, "readiness"))
            time.sleep(0.05)
        assert not d.alive(), "the daemon limped on instead of exiting"
        rc = d.proc.wait(5)
        logs = d.logs()
        assert rc == 1, f"exit code {rc}; log ends:\n{logs[-3000:]}"
        assert 200 not in ready_seen, "the daemon reported ready while its writes were failing"
        assert 503 in ready_seen, "readiness was never served: the check above proves nothing"
        assert "failed persistently" in logs
        attempts = [json.loads(ln) for ln in logs.splitlines() if ln.startswith("{") and "attempt" in ln]
        assert attempts, "no retry was logged"
        assert not c.received or all(not m.HasField("dataplane_in_sync") for m in c.received)
    finally:
        d.stop()
    after = kernel(netns)
    # The rules are the previous run's (IP-set contents may have moved on: sets are written before the
    # tables, and a set the old rules use only ever holds what the new datastore says).
    assert rules(netns) == rules_before, "the failed run changed the rules"
    if tool == "ipset":
        assert after == before, "the failed run changed the kernel"
    assert '"Unknown interface" -j DROP' in after  # still fails closed for unknown cali* interfaces


def test_a_hung_restore_fails_liveness_within_the_watchdog_timeout(netns: str) -> None:
    programmed_node(netns)
    bindir = stand_in("exec sleep 600", "iptables-nft-restore", "ip6tables-nft-restore")
    env = {**ENV, "FELIX_DATAPLANEWATCHDOGTIMEOUT": "20", "PATH": f"{bindir}:{os.environ['PATH']}"}
    d = start_daemon(netns, iface_monitor=False, env=env)
    try:
        c = connect(d.target)
        c.send(datastore(["10.65.0.10/32"], port=81))
        deadline = time.monotonic() + 10
        while health(netns, "liveness") != 200:
            assert time.monotonic() < deadline, "liveness never came up"
            time.sleep(0.1)
        t0 = time.monotonic()
        while health(netns, "liveness") == 200:
            # 20 s watchdog + one 10 s health tick of slack: a hang must be noticed, not waited out.
            assert time.monotonic() - t0 < 35, "liveness still OK while the restore hangs"
            time.sleep(0.5)
        assert health(netns, "liveness") == 503
        assert d.alive()  # hung, not crashed: the supervisor's liveness probe is what restarts it
    finally:
        d.stop()
