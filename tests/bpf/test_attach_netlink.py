"""The attach layer's netlink socket (:class:`felixpy.bpf.attach.RouteSocket`): one socket serves
every interface, the link kind (what decides netkit versus TCX/TC) is still read right, and a
socket that may be out of step is replaced.

The first tests run against a stateful fake of pyroute2's ``IPRoute`` that answers link queries from
a table of interfaces (with failure injection); the kernel tests run in throwaway namespaces and
compare with a dump of the same links.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from felixpy.bpf import attach, defs
from felixpy.bpf import syscall as sc
from felixpy.drivers.bpfendpoints.attacher import HOOKS, KernelAttacher
from felixpy.testing import netns as nsutil

RET0 = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])


class _Attrs:
    def __init__(self, attrs: dict[str, object]) -> None:
        self.attrs = attrs

    def get_attr(self, name: str) -> object:
        return self.attrs.get(name)


class FakeIPRoute:
    """Answers ``link("get", ifname=…)`` from ``links`` (name -> kind) as pyroute2 does, raising
    pyroute2's NetlinkError (ENODEV for an unknown name, EPERM for "eperm"); ``fail_next`` raises a
    socket error once (the socket may then be out of step)."""

    def __init__(self, links: dict[str, str | None]) -> None:
        self.links = links
        self.fail_next = False
        self.closed = False
        self.calls = 0

    def link(self, cmd: str, *, ifname: str) -> list[_Attrs]:
        from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]

        assert cmd == "get" and not self.closed
        self.calls += 1
        if self.fail_next:
            self.fail_next = False
            raise TimeoutError("timed out")
        if ifname == "eperm":
            raise NetlinkError(errno.EPERM)
        if ifname not in self.links:
            raise NetlinkError(errno.ENODEV)
        kind = self.links[ifname]
        info = _Attrs({"IFLA_INFO_KIND": kind}) if kind else None
        return [_Attrs({"IFLA_IFNAME": ifname, "IFLA_LINKINFO": info})]

    def close(self) -> None:
        self.closed = True


class Opener:
    def __init__(self, links: dict[str, str | None]) -> None:
        self.links = links
        self.made: list[FakeIPRoute] = []

    def __call__(self) -> FakeIPRoute:
        s = FakeIPRoute(self.links)
        self.made.append(s)
        return s


def _nl(links: dict[str, str | None], ns: list[tuple[int, int]] | None = None) -> tuple[attach.RouteSocket, Opener]:
    op = Opener(links)
    where = ns if ns is not None else [(1, 1)]
    return attach.RouteSocket(opener=op, netns_id=lambda: where[0]), op


def test_one_socket_answers_the_kind_of_every_interface() -> None:
    links: dict[str, str | None] = {f"cali{i}": "veth" for i in range(100)}
    links["nk0"] = "netkit"
    links["lo"] = None
    nl, op = _nl(links)
    assert all(attach.iface_kind(f"cali{i}", nl=nl) == "veth" for i in range(100))
    assert attach.iface_kind("nk0", nl=nl) == "netkit"
    assert attach.iface_kind("lo", nl=nl) is None
    assert attach.iface_kind("gone", nl=nl) is None  # ENODEV: the monitor's view lags a deletion
    assert len(op.made) == 1 and nl.opened == 1


def test_a_kernel_error_keeps_the_socket_and_a_socket_error_replaces_it() -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    nl, op = _nl({"cali1": "veth"})
    with pytest.raises(NetlinkError) as exc:
        attach.iface_kind("eperm", nl=nl)
    assert exc.value.code == errno.EPERM
    assert attach.iface_kind("cali1", nl=nl) == "veth" and len(op.made) == 1
    op.made[0].fail_next = True
    with pytest.raises(TimeoutError):
        attach.iface_kind("cali1", nl=nl)
    assert op.made[0].closed
    assert attach.iface_kind("cali1", nl=nl) == "veth"
    assert len(op.made) == 2 and not op.made[1].closed


def test_another_namespace_gets_another_socket() -> None:
    where = [(1, 1)]
    nl, op = _nl({"cali1": "veth"}, where)
    attach.iface_kind("cali1", nl=nl)
    where[0] = (1, 2)
    attach.iface_kind("cali1", nl=nl)
    assert len(op.made) == 2 and op.made[0].closed


def test_the_attacher_asks_the_kind_once_per_interface() -> None:
    nl, op = _nl({"cali1": "veth", "cali2": "veth"})
    a = KernelAttacher("TC", "/nonexistent", nl=nl)
    for _ in range(3):
        assert a.mode("cali1") == "tc" and a.mode("cali2") == "tc"
    assert op.made[0].calls == 2


def test_netkit_is_still_refused_through_the_shared_socket() -> None:
    from felixpy.errors import UnsupportedFeature

    nl, _op = _nl({"nk0": "netkit"})
    a = KernelAttacher("Netkit", "/nonexistent", nl=nl)
    with pytest.raises(UnsupportedFeature):
        a.mode("nk0")


def test_a_kind_the_monitor_reported_chooses_the_mode_without_any_link_query() -> None:
    """The interface monitor already decoded every link's kind: with it, netkit is refused and
    everything else resolved without opening a socket; forgotten, the kind is asked again."""
    from felixpy.errors import UnsupportedFeature

    nl, op = _nl({"nk0": "netkit"})
    a = KernelAttacher("Netkit", "/nonexistent", nl=nl)
    a.learn_kind("nk0", "netkit")
    a.learn_kind("cali1", "veth")
    a.learn_kind("eth0", "")  # no kind (a physical device)
    with pytest.raises(UnsupportedFeature):
        a.mode("nk0")
    assert a.mode("cali1") == a.mode("eth0") == ("tcx" if attach.tcx_supported() else "tc")
    assert op.made == []
    a.learn_kind("cali1", "netkit")  # the name now belongs to a netkit device: decided again
    with pytest.raises(UnsupportedFeature):
        a.mode("cali1")
    a.learn_kind("nk0", None)  # gone: its kind is not trusted any more
    with pytest.raises(UnsupportedFeature):
        a.mode("nk0")
    assert len(op.made) == 1 and op.made[0].calls == 1


def test_the_qdisc_listing_names_the_devices_whose_hooks_can_carry_filters() -> None:
    text = ('[{"kind":"noqueue","handle":"0:","dev":"lo","root":true,"refcnt":2,"options":{}},'
            '{"kind":"clsact","handle":"ffff:","dev":"cali0","parent":"ffff:fff1","options":{}},'
            '{"kind":"ingress","handle":"ffff:","dev":"eth0","parent":"ffff:fff1","options":{}},'
            '{"kind":"fq_codel","handle":"0:","dev":"eth0","root":true,"options":{}}]\n')
    assert attach.parse_qdisc_dump(text) == {"cali0", "eth0"}
    assert attach.parse_qdisc_dump("") == set() and attach.parse_qdisc_dump("[]\n") == set()
    with pytest.raises(ValueError):
        attach.parse_qdisc_dump("{}")


# ------------------------------------------------------------------------------ kernel


@pytest.fixture
def ns() -> Iterator[str]:
    with nsutil.netns("fpyn") as name:
        for cmd in (["link", "add", "cali0", "type", "veth", "peer", "name", "p0"],
                    ["link", "add", "vx0", "type", "vxlan", "id", "5", "dstport", "4789"], ["link", "add", "br0", "type", "bridge"]):
            nsutil.run_in(name, "ip", *cmd)
        for i in range(1, 20):
            nsutil.run_in(name, "ip", "link", "add", f"cali{i}", "type", "veth", "peer", "name", f"p{i}")
        yield name


@pytest.mark.bpf
@pytest.mark.kernel
def test_kernel_kinds_match_pyroute2_over_one_socket(ns: str) -> None:
    with nsutil.entered(ns):
        with attach._ipr() as ipr:
            want = {}
            for link in ipr.get_links():
                info = link.get_attr("IFLA_LINKINFO")
                kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
                want[str(link.get_attr("IFLA_IFNAME"))] = kind or None
        nl = attach.RouteSocket()
        got = {n: attach.iface_kind(n, nl=nl) for n in want}
        assert got == want
        assert got["cali0"] == "veth" and got["vx0"] == "vxlan" and got["br0"] == "bridge" and got["lo"] is None
        assert attach.iface_kind("nosuch0", nl=nl) is None
        assert attach.iface_kind("cali3") == "veth"  # without a RouteSocket: a socket of the call alone
        assert nl.opened == 1
    nl.close()


@pytest.mark.bpf
@pytest.mark.kernel
@pytest.mark.parametrize("attach_type", ["TC", "TCX"])
def test_attacher_programs_twenty_interfaces_over_one_socket_per_kind(ns: str, attach_type: str) -> None:
    if attach_type == "TCX" and not attach.tcx_supported():
        pytest.skip("kernel without TCX")
    from felixpy.bpf import maps

    prog = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name=attach.PREAMBLE_NAME)
    try:
        with maps.private_bpffs() as root, nsutil.entered(ns):
            a = KernelAttacher(attach_type, os.path.join(root, "tcx"))
            names = [f"cali{i}" for i in range(20)]
            for n in names:
                nsutil.run_in(ns, "ip", "link", "set", n, "up")
                for hook in HOOKS:
                    a.attach(n, socket.if_nametoindex(n), hook, prog)
                    a.attach(n, socket.if_nametoindex(n), hook, prog)  # again: replace / link update
            for n in names:
                idx = socket.if_nametoindex(n)
                assert all(a.is_attached(n, idx, hook) for hook in HOOKS)
                assert all(a.is_current(n, idx, hook, prog) for hook in HOOKS)
            # The link kind and (TC) the clsact/filter calls: one socket for all 20 interfaces.
            assert a.nl.opened == 1
            for n in names:
                a.detach(n, socket.if_nametoindex(n))
                idx = socket.if_nametoindex(n)
                assert not any(a.is_attached(n, idx, hook) for hook in HOOKS)
            if attach_type == "TC":
                assert attach.tc_filters(socket.if_nametoindex("cali0"), defs.HOOK_TC_INGRESS) == []
            a.nl.close()
    finally:
        os.close(prog)


@pytest.mark.bpf
@pytest.mark.kernel
def test_tc_attach_adds_clsact_back_when_it_was_removed_under_the_attacher(ns: str) -> None:
    from felixpy.bpf import maps

    prog = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name=attach.PREAMBLE_NAME)
    try:
        with maps.private_bpffs() as root, nsutil.entered(ns):
            a = KernelAttacher("TC", os.path.join(root, "tcx"))
            nsutil.run_in(ns, "ip", "link", "set", "cali0", "up")
            idx = socket.if_nametoindex("cali0")
            for hook in HOOKS:
                a.attach("cali0", idx, hook, prog)
            nsutil.run_in(ns, "tc", "qdisc", "del", "dev", "cali0", "clsact")  # someone else's doing
            assert not any(a.is_attached("cali0", idx, hook) for hook in HOOKS)
            for hook in HOOKS:
                a.attach("cali0", idx, hook, prog)
            assert all(a.is_attached("cali0", idx, hook) for hook in HOOKS)
            assert all(a.is_current("cali0", idx, hook, prog) for hook in HOOKS)
            a.nl.close()
    finally:
        os.close(prog)


@pytest.mark.bpf
@pytest.mark.kernel
@pytest.mark.parametrize("attach_type", ["TC", "TCX"])
def test_attach_many_attaches_like_attach_and_names_only_the_interfaces_that_failed(ns: str,
                                                                                     attach_type: str) -> None:
    """The batched attach (TC: clsact and filters in chunked netlink batches, acks read back per
    request) leaves the kernel as per-call attach does, replaces atomically when repeated, refuses
    just the interface that is gone, and re-adds a clsact removed under it."""
    if attach_type == "TCX" and not attach.tcx_supported():
        pytest.skip("kernel without TCX")
    from felixpy.bpf import maps
    from felixpy.drivers.bpfendpoints.attacher import AttachRequest

    prog = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name=attach.PREAMBLE_NAME)
    other = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0[:8] * 2 + RET0[8:], name=attach.PREAMBLE_NAME)
    try:
        with maps.private_bpffs() as root, nsutil.entered(ns):
            a = KernelAttacher(attach_type, os.path.join(root, "tcx"))
            names = [f"cali{i}" for i in range(20)]
            idx = {n: socket.if_nametoindex(n) for n in names}
            for n in names:
                nsutil.run_in(ns, "ip", "link", "set", n, "up")
            reqs = [AttachRequest(n, idx[n], hook, prog) for n in names for hook in HOOKS]
            gone = AttachRequest("cali99", 99999, defs.HOOK_TC_INGRESS, prog)  # no such interface
            if attach_type == "TC":
                a._modes["cali99"] = attach.AttachMode.TC  # a kind asked before it vanished
            failed = a.attach_many(reqs[:10] + [gone] + reqs[10:])
            assert set(failed) == {"cali99"}
            for n in names:
                assert all(a.is_attached(n, idx[n], hook) for hook in HOOKS)
                assert all(a.is_current(n, idx[n], hook, prog) for hook in HOOKS)
            # Again with another program: an atomic replace, nothing failed.
            if attach_type == "TC":
                nsutil.run_in(ns, "tc", "qdisc", "del", "dev", "cali3", "clsact")  # someone else's doing
            assert a.attach_many([AttachRequest(n, idx[n], hook, other) for n in names for hook in HOOKS]) == {}
            for n in names:
                assert all(a.is_current(n, idx[n], hook, other) for hook in HOOKS)
                assert not any(a.is_current(n, idx[n], hook, prog) for hook in HOOKS)
                if attach_type == "TC":
                    for hook in HOOKS:
                        assert attach.tc_filters(idx[n], hook, nl=a.nl) == [f"{attach.PREAMBLE_NAME}:[*fsobj]"]
            assert a.nl.opened == 1
            a.nl.close()
    finally:
        os.close(prog)
        os.close(other)


@pytest.mark.bpf
@pytest.mark.kernel
@pytest.mark.parametrize("attach_type", ["TC", "TCX"])
def test_a_fresh_attacher_sees_attachments_without_asking_any_link_kind(ns: str, attach_type: str) -> None:
    """The restart sweep asks a new process's attacher about every interface of the namespace: it
    must see what an earlier attacher attached (and what it did not) without a link-kind query for
    each interface that carries nothing of ours (the kind cache stays empty for them)."""
    if attach_type == "TCX" and not attach.tcx_supported():
        pytest.skip("kernel without TCX")
    from felixpy.bpf import maps

    prog = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name=attach.PREAMBLE_NAME)
    try:
        with maps.private_bpffs() as root, nsutil.entered(ns):
            pins = os.path.join(root, "tcx")
            first = KernelAttacher(attach_type, pins)
            for n in ("cali1", "cali2"):
                nsutil.run_in(ns, "ip", "link", "set", n, "up")
                for hook in HOOKS:
                    first.attach(n, socket.if_nametoindex(n), hook, prog)
            first.nl.close()
            fresh = KernelAttacher(attach_type, pins)
            for n in ("cali1", "cali2", "cali3", "p1", "vx0", "br0", "lo"):
                want = n in ("cali1", "cali2")
                assert [fresh.is_attached(n, socket.if_nametoindex(n), hook) for hook in HOOKS] == [want, want], n
            # TC: no kind asked at all; TCX: only where a link pin of ours exists.
            assert set(fresh._modes) <= ({"cali1", "cali2"} if attach_type == "TCX" else set())
            # The sweep looks closer only at interfaces with a clsact qdisc (TC: one qdisc listing).
            everyone = {n: socket.if_nametoindex(n) for _i, n in socket.if_nameindex()}
            nsutil.run_in(ns, "tc", "qdisc", "add", "dev", "cali3", "clsact")  # someone's, empty
            assert fresh.sweep_candidates(everyone) == (
                {"cali1", "cali2", "cali3"} if attach_type == "TC" else set(everyone))
            fresh.nl.close()
    finally:
        os.close(prog)


def _filters_json(dev: str, hook: int) -> list[dict[str, Any]]:
    import json
    import subprocess

    out = subprocess.run(["tc", "-j", "filter", "show", "dev", dev, attach.HOOK_NAMES[hook]],
                         check=True, capture_output=True, text=True).stdout
    return list(json.loads(out or "[]"))


@pytest.mark.bpf
@pytest.mark.kernel
def test_the_tc_batch_makes_the_filter_the_per_call_attach_made_and_a_restart_recognises_both(ns: str) -> None:
    """``tc -batch`` (the bulk path) and pyroute2 (earlier versions) leave the same filter: same
    priority, handle, protocol, class id, direct action and program; only the name differs
    (``tc`` names a pinned program ``<pin file>:[*fsobj]``), and a fresh attacher recognises
    either as the preamble, detaches either, and replaces the old one in place."""
    from felixpy.bpf import maps
    from felixpy.drivers.bpfendpoints.attacher import AttachRequest

    prog = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name=attach.PREAMBLE_NAME)
    try:
        with maps.private_bpffs() as root, nsutil.entered(ns):
            old, new = socket.if_nametoindex("cali1"), socket.if_nametoindex("cali2")
            for hook in HOOKS:
                attach.attach_tc(old, hook, prog)  # what earlier versions left
            a = KernelAttacher("TC", os.path.join(root, "tcx"))
            during: list[int] = []  # the loop's later device steps run while the child attaches: once
            assert a.attach_many([AttachRequest("cali2", new, hook, prog) for hook in HOOKS],
                                 while_running=lambda: during.append(1)) == {}
            assert during == [1]
            for hook in HOOKS:
                got_old, got_new = _filters_json("cali1", hook), _filters_json("cali2", hook)
                names = [f["options"].pop("bpf_name") for f in (*got_old, *got_new) if "options" in f]
                assert names == [attach.PREAMBLE_NAME, f"{attach.PREAMBLE_NAME}:[*fsobj]"]
                assert got_old == got_new and len(got_new) == 2  # (tc lists the priority's head first)
                opts = got_new[1]["options"]
                assert opts["handle"] == "0x1" and opts["flowid"] == ":1" and opts["direct-action"] is True
                assert got_new[1]["pref"] == attach.TC_PRIO and got_new[1]["protocol"] == "all"
            fresh = KernelAttacher("TC", os.path.join(root, "tcx"))
            assert all(fresh.is_attached(n, i, hook) for n, i in (("cali1", old), ("cali2", new)) for hook in HOOKS)
            assert all(fresh.is_current(n, i, hook, prog) for n, i in (("cali1", old), ("cali2", new)) for hook in HOOKS)
            # The new process replaces the old filter in place (the same priority and handle: one filter).
            assert fresh.attach_many([AttachRequest("cali1", old, hook, prog) for hook in HOOKS]) == {}
            assert [attach.tc_filters(old, hook) for hook in HOOKS] == [[f"{attach.PREAMBLE_NAME}:[*fsobj]"]] * 2
            for n, i in (("cali1", old), ("cali2", new)):
                fresh.detach(n, i)
                assert [attach.tc_filters(i, hook) for hook in HOOKS] == [[], []]
            fresh.nl.close()
            a.nl.close()
    finally:
        os.close(prog)


@pytest.mark.bpf
@pytest.mark.kernel
def test_a_line_the_kernel_refuses_fails_only_its_own_interface(ns: str) -> None:
    """One ``tc -batch`` run for twenty interfaces where the kernel refuses one line in the middle
    (cali5 carries someone's IPv4-only filter at our priority on its ingress hook, and a priority
    holds one protocol): cali5 alone is reported, with its hook, and every other interface is attached."""
    from felixpy.bpf import maps
    from felixpy.drivers.bpfendpoints.attacher import AttachRequest

    prog = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name=attach.PREAMBLE_NAME)
    foreign = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name="foreign_prog")
    try:
        with maps.private_bpffs() as root, nsutil.entered(ns):
            sc.obj_pin(foreign, os.path.join(root, "foreign"))
            nsutil.run_in(ns, "tc", "qdisc", "add", "dev", "cali5", "clsact")
            nsutil.run_in(ns, "tc", "filter", "add", "dev", "cali5", "ingress", "prio", "1", "protocol", "ip",
                          "bpf", "da", "pinned", os.path.join(root, "foreign"))
            a = KernelAttacher("TC", os.path.join(root, "tcx"))
            names = [f"cali{i}" for i in range(20)]
            idx = {n: socket.if_nametoindex(n) for n in names}
            failed = a.attach_many([AttachRequest(n, idx[n], hook, prog) for n in names for hook in HOOKS])
            assert set(failed) == {"cali5"}
            assert isinstance(failed["cali5"], OSError) and "cali5 ingress" in str(failed["cali5"])
            for n in names:
                assert [a.is_current(n, idx[n], hook, prog) for hook in HOOKS] == \
                    ([False, True] if n == "cali5" else [True, True])
            a.nl.close()
    finally:
        os.close(prog)
        os.close(foreign)
