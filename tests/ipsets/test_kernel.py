"""The ipset driver against the real kernel, inside throwaway network namespaces.

Every test runs with its thread inside a fresh namespace (the ``in_netns``
fixture), so ``ipset``/``iptables-legacy`` children act there; nothing touches
the root namespace (asserted before each test).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import structlog

from felixpy.drivers import cmdshim
from felixpy.drivers.cmdshim import Output, SubprocessRunner
from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.parse import parse_list
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.testing import netns as _netns

pytestmark = pytest.mark.kernel

IP, NET, IPPORT = IPSetType.HASH_IP, IPSetType.HASH_NET, IPSetType.HASH_IP_PORT


def _netns_inode() -> int:
    return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino


# Read at import (collection), before any fixture moved a thread: the namespace we must not touch.
_ROOT_NETNS = _netns_inode()


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    yield
    structlog.reset_defaults()


def assert_not_in_root_namespace() -> None:
    assert _netns_inode() != _ROOT_NETNS, "refusing to touch the root namespace"


_READ_ONLY = {("ipset", "list"), ("ipset", "test"), ("ipset", "save")}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if tuple(argv[:2]) not in _READ_ONLY:
        assert_not_in_root_namespace()
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


def kernel_sets() -> dict[str, set[str]]:
    return {s.name: set(s.members or []) for s in parse_list(sh("ipset", "list").stdout)}


def kernel_meta(name: str) -> tuple[str, str, int, int | None]:
    (s,) = parse_list(sh("ipset", "list", "-terse", name).stdout)
    return s.type, s.family, s.max_size, s.references


def driver(ip_version: int = 4) -> IPSets:
    assert_not_in_root_namespace()
    return IPSets(ip_version, SubprocessRunner())


class RecordingRunner(SubprocessRunner):
    def __init__(self) -> None:
        super().__init__()
        self.runs: list[list[str]] = []

    def run_output(self, argv: Sequence[str], stdin: str | Sequence[str] | None = None, *,
                   while_running: Callable[[], None] | None = None) -> Output:
        # Every command goes through here (``run`` too), ``ipset save``'s kept output as well.
        self.runs.append(list(argv))
        return super().run_output(argv, stdin, while_running=while_running)


def apply_all(d: IPSets) -> None:
    d.apply_updates()
    n = 0
    while d.apply_deletions():
        d.apply_updates()
        n += 1
        assert n < 200


def meta(set_id: str, t: IPSetType = IP, max_size: int = 1048576) -> IPSetMetadata:
    return IPSetMetadata(set_id, t, max_size)


@dataclass
class Reader:
    """Polls a set from its own thread (inside the namespace) while the test changes it."""

    ns: str
    name: str
    member: str
    seen: list[tuple[str, int]] = field(default_factory=list)  # ("ok"|"missing"|"empty"|"absent-member", n)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        with _netns.entered(self.ns):
            while not self._stop.is_set():
                terse = sh("ipset", "list", "-terse", self.name, check=False)
                if terse.returncode != 0:
                    self.seen.append(("missing", 0))
                    continue
                entries = int(terse.stdout.split("Number of entries:")[1].split()[0])
                if entries == 0:
                    self.seen.append(("empty", 0))
                    continue
                test = sh("ipset", "test", self.name, self.member, check=False)
                self.seen.append(("ok" if test.returncode == 0 else "absent-member", entries))

    def __enter__(self) -> Reader:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        while len(self.seen) < 5:  # make sure it is really polling before the change
            threading.Event().wait(0.005)
        return self

    def __exit__(self, *exc: object) -> None:
        threading.Event().wait(0.05)
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)

    def problems(self) -> list[tuple[str, int]]:
        return [s for s in self.seen if s[0] != "ok"]


# ----------------------------------------------------------------------------- tests
def test_create_update_delta_remove(in_netns: str) -> None:
    d = driver()
    d.add_or_replace_ip_set(meta("s:a", NET), ["10.0.0.0/24", "10.0.1.5/32", "10.2.0.9/16"])
    d.add_or_replace_ip_set(meta("s:p", IPPORT), ["10.0.0.1,tcp:80", "10.0.0.1,UDP:53", "10.0.0.2,sctp:9"])
    d.add_or_replace_ip_set(meta("this-host", IP, 4096), ["192.168.1.1", "bogus"])
    apply_all(d)
    assert kernel_sets() == {"cali40s:a": {"10.0.0.0/24", "10.0.1.5", "10.2.0.0/16"},
                             "cali40s:p": {"10.0.0.1,tcp:80", "10.0.0.1,udp:53", "10.0.0.2,sctp:9"},
                             "cali40this-host": {"192.168.1.1"}}
    assert kernel_meta("cali40this-host")[:3] == ("hash:ip", "inet", 4096)
    d.add_or_replace_ip_set(meta("s:a", NET), ["10.0.0.0/24", "10.3.0.0/16"])
    d.add_members("s:p", ["10.0.0.3,tcp:443"])
    d.remove_members("s:p", ["10.0.0.1,tcp:80"])
    apply_all(d)
    assert kernel_sets()["cali40s:a"] == {"10.0.0.0/24", "10.3.0.0/16"}
    assert kernel_sets()["cali40s:p"] == {"10.0.0.1,udp:53", "10.0.0.2,sctp:9", "10.0.0.3,tcp:443"}
    d.remove_ip_set("s:p")
    d.remove_ip_set("this-host")
    apply_all(d)
    assert set(kernel_sets()) == {"cali40s:a"}
    assert d.in_sync()


def test_ipv6_sets_read_back_unchanged_after_restart(in_netns: str) -> None:
    tricky = ["2001:db8:0:0:1:0:0:1", "2001:0:0:1:0:0:0:1", "0:0:0:1:0:0:0:0", "1:0:0:0:0:0:0:0",
              "::ffff:1.2.3.4", "FD00::A", "fe80::1", "::1", "1::2:0:0:3", "a:b:c:d:e:f:1:2"]
    desired = {
        "s:ip": (IP, tricky),
        "s:net": (NET, ["2001:db8::1/64", "fd00:0:0:0:0:0:0:5/128", "::/0", "2001:db8:0:0:1::/80"]),
        "s:port": (IPPORT, [f"{a},tcp:{i}" for i, a in enumerate(tricky)]),
    }
    first = driver(6)
    for sid, (t, ms) in desired.items():
        first.add_or_replace_ip_set(meta(sid, t), ms)
    apply_all(first)
    got = kernel_sets()
    assert set(got) == {"cali60s:ip", "cali60s:net", "cali60s:port"}
    assert len(got["cali60s:ip"]) == len(tricky) and "::ffff:1.2.3.4" in got["cali60s:ip"]
    assert got["cali60s:net"] == {"2001:db8::/64", "fd00::5", "::/1", "8000::/1", "2001:db8:0:0:1::/80"}
    assert kernel_meta("cali60s:ip")[1] == "inet6"
    # A restarted driver finds the kernel's text equal to its canonical forms: it writes nothing.
    assert_not_in_root_namespace()
    recorder = RecordingRunner()
    second = IPSets(6, recorder)
    for sid, (t, ms) in desired.items():
        second.add_or_replace_ip_set(meta(sid, t), ms)
    apply_all(second)
    assert recorder.runs == [["ipset", "save"]]
    assert second.in_sync()


@pytest.mark.parametrize("ip_version", [4, 6])
def test_restart_finds_every_unchanged_set_in_sync_by_digest(in_netns: str, ip_version: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """What the real kernel prints digests equal to the driver's canonical forms, in both families: a
    restart compares no set key by key (digest.py), and a hand edit still differs and is repaired."""
    from felixpy.deltatracker import MemberTracker

    tricky6 = ["2001:db8:0:0:1:0:0:1", "::ffff:1.2.3.4", "FD00::A", "1::2:0:0:3"]
    desired = {
        4: {"s:ip": (IP, [f"10.0.{i >> 8}.{i & 255}" for i in range(300)]),
            "s:net": (NET, ["10.0.0.0/24", "10.1.0.5/32", "10.2.0.9/16", "0.0.0.0/0"]),
            "s:port": (IPPORT, ["10.0.0.1,tcp:80", "10.0.0.1,UDP:53"])},
        6: {"s:ip": (IP, tricky6),
            "s:net": (NET, ["2001:db8::1/64", "fd00:0:0:0:0:0:0:5/128", "::/0"]),
            "s:port": (IPPORT, [f"{a},tcp:{i}" for i, a in enumerate(tricky6)])},
    }[ip_version]

    def restarted() -> tuple[IPSets, RecordingRunner]:
        assert_not_in_root_namespace()
        recorder = RecordingRunner()
        d = IPSets(ip_version, recorder)
        for sid, (t, ms) in desired.items():
            d.add_or_replace_ip_set(meta(sid, t), ms)
        apply_all(d)
        return d, recorder

    first = driver(ip_version)
    for sid, (t, ms) in desired.items():
        first.add_or_replace_ip_set(meta(sid, t), ms)
    apply_all(first)
    before = kernel_sets()
    with monkeypatch.context() as m:
        def refuse(self: object, keys: object, value: object = True) -> None:
            raise AssertionError("compared key by key")
        m.setattr(MemberTracker, "replace_dataplane_keys", refuse)
        second, recorder = restarted()
    assert recorder.runs == [["ipset", "save"]]
    assert second.in_sync() and kernel_sets() == before
    p = f"cali{ip_version}0s:"
    sh("ipset", "del", p + "ip", sorted(before[p + "ip"])[0])
    sh("ipset", "add", p + "net", "10.9.0.0/16" if ip_version == 4 else "fd09::/16")
    monkeypatch.setattr(cmdshim, "OUTPUT_PIECE", 97)  # the save read in many pieces, cut mid-set and all
    third, recorder = restarted()
    assert third.in_sync() and kernel_sets() == before
    assert [r[:2] for r in recorder.runs] == [["ipset", "save"], ["ipset", "restore"]]


def test_maxelem_change_swaps_without_a_missing_or_empty_moment(in_netns: str) -> None:
    d = driver()
    members = [f"10.0.{i // 250}.{i % 250}" for i in range(2000)]
    d.add_or_replace_ip_set(meta("s:a", IP, 10000), members)
    apply_all(d)
    with Reader(in_netns, "cali40s:a", "10.0.0.7") as reader:
        for size in (20000, 30000, 40000, 50000, 60000, 70000):
            d.add_or_replace_ip_set(meta("s:a", IP, size), members)
            apply_all(d)
    assert kernel_meta("cali40s:a")[2] == 70000
    assert len(kernel_sets()["cali40s:a"]) == 2000
    assert set(kernel_sets()) == {"cali40s:a"}  # temp sets cleaned up
    assert len(reader.seen) > 10
    assert reader.problems() == []


def test_type_change_never_shows_an_empty_set(in_netns: str) -> None:
    d = driver()
    d.add_or_replace_ip_set(meta("s:a", IP), [f"10.0.0.{i}" for i in range(1, 200)])
    apply_all(d)
    with Reader(in_netns, "cali40s:a", "10.0.0.7") as reader:
        d.add_or_replace_ip_set(meta("s:a", NET), ["10.0.0.0/24", "10.9.0.0/16"])
        apply_all(d)
    assert kernel_meta("cali40s:a")[0] == "hash:net"
    assert kernel_sets() == {"cali40s:a": {"10.0.0.0/24", "10.9.0.0/16"}}
    assert len(reader.seen) > 10
    assert ("empty", 0) not in reader.seen and ("absent-member", 0) not in [(k, 0) for k, _ in reader.seen]
    # The kernel cannot swap sets of different types; the two renames that replace
    # it run back to back in one ipset session, microseconds apart.  A poller that
    # lands exactly between them sees the name absent once.
    assert sum(1 for k, _ in reader.seen if k == "missing") <= 1


def test_type_change_of_a_referenced_set_waits_for_the_rule_to_go(in_netns: str) -> None:
    d = driver()
    d.add_or_replace_ip_set(meta("s:a", IP), ["10.0.0.1"])
    apply_all(d)
    sh("iptables-legacy", "-w", "-A", "INPUT", "-m", "set", "--match-set", "cali40s:a", "src", "-j", "ACCEPT")
    d.add_or_replace_ip_set(meta("s:a", NET), ["10.0.0.0/24"])
    apply_all(d)
    assert kernel_meta("cali40s:a")[0] == "hash:ip" and kernel_sets()["cali40s:a"] == {"10.0.0.1"}
    sh("iptables-legacy", "-w", "-D", "INPUT", "-m", "set", "--match-set", "cali40s:a", "src", "-j", "ACCEPT")
    apply_all(d)
    assert kernel_meta("cali40s:a")[0] == "hash:net"
    assert kernel_sets() == {"cali40s:a": {"10.0.0.0/24"}}


def test_delete_of_a_referenced_set_is_deferred_until_the_rule_is_gone(in_netns: str) -> None:
    d = driver()
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])
    d.add_or_replace_ip_set(meta("s:b"), ["10.0.0.2"])
    apply_all(d)
    rule = ["INPUT", "-m", "set", "--match-set", "cali40s:a", "src", "-j", "DROP"]
    sh("iptables-legacy", "-w", "-A", *rule)
    assert kernel_meta("cali40s:a")[3] == 1
    d.remove_ip_set("s:a")
    d.remove_ip_set("s:b")
    apply_all(d)  # no exception; the other deletion went through
    assert set(kernel_sets()) == {"cali40s:a"}
    sh("iptables-legacy", "-w", "-D", *rule)
    d.queue_resync()  # the periodic refresh re-reads it and retries
    apply_all(d)
    assert kernel_sets() == {}


def test_restart_with_a_different_desired_state_sweeps_exactly_the_orphans(in_netns: str) -> None:
    old = driver()
    for sid in ("s:keep", "s:orphan1", "s:orphan2"):
        old.add_or_replace_ip_set(meta(sid), ["10.0.0.1", "10.0.0.2"])
    apply_all(old)
    old6 = driver(6)
    old6.add_or_replace_ip_set(meta("s:v6"), ["fd00::1"])
    apply_all(old6)
    sh("ipset", "create", "KUBE-FOREIGN", "hash:ip")
    sh("ipset", "add", "KUBE-FOREIGN", "1.2.3.4")
    sh("ipset", "create", "felix-4legacy", "hash:ip")
    sh("ipset", "create", "cali4t3", "hash:ip")

    new = driver()
    new.add_or_replace_ip_set(meta("s:keep"), ["10.0.0.2", "10.0.0.3"])
    new.add_or_replace_ip_set(meta("s:fresh", NET), ["10.8.0.0/16"])
    apply_all(new)
    assert kernel_sets() == {"cali40s:keep": {"10.0.0.2", "10.0.0.3"}, "cali40s:fresh": {"10.8.0.0/16"},
                             "cali60s:v6": {"fd00::1"}, "KUBE-FOREIGN": {"1.2.3.4"}}


def test_refresh_restores_a_member_removed_by_hand_and_a_destroyed_set(in_netns: str) -> None:
    d = driver()
    for i in range(5):
        d.add_or_replace_ip_set(meta(f"s:{i}"), [f"10.0.{i}.1", f"10.0.{i}.2"])
    apply_all(d)
    sh("ipset", "del", "cali40s:3", "10.0.3.2")
    sh("ipset", "add", "cali40s:1", "6.6.6.6")
    sh("ipset", "destroy", "cali40s:4")
    d.queue_resync()
    d.apply_updates()
    assert kernel_sets()["cali40s:4"] == {"10.0.4.1", "10.0.4.2"}  # repaired in the same apply
    while d.apply_deletions():  # the background re-check is paced by the loop
        d.apply_updates()
    assert kernel_sets() == {f"cali40s:{i}": {f"10.0.{i}.1", f"10.0.{i}.2"} for i in range(5)}
    assert d.in_sync()


def test_runner_can_target_a_namespace_without_entering_it(netns: str) -> None:
    d = IPSets(4, SubprocessRunner(netns=netns))
    d.add_or_replace_ip_set(meta("s:a"), ["10.0.0.1"])
    apply_all(d)
    listed = _netns.run_in(netns, "ipset", "list", "-name").stdout.split()
    assert listed == ["cali40s:a"]
    assert "cali40s:a" not in sh("ipset", "list", "-name").stdout.split()
