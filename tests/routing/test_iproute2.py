"""The ``ip`` shim: batch lines, stderr -> per-item errnos, ``ip -j`` dumps -> values.

All captured from iproute2 6.1 on kernel 6.18 (``LC_ALL=C``); no kernel needed.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from felixpy.drivers.cmdshim import EXIT_TIMED_OUT, CommandResult, stdin_text
from felixpy.drivers.netlink.errors import NetlinkCallError
from felixpy.drivers.netlink.iproute2 import (
    BatchFailure,
    IpTool,
    dumped_dev_names,
    errno_from_message,
    neigh_replace_line,
    parse_batch_stderr,
    parse_link_dump,
    parse_neigh_dump,
    parse_route_dump,
    quote_name,
    route_delete_line,
    route_replace_line,
)
from felixpy.drivers.netlink.types import AF_INET, AF_INET6, Link, Neigh, Route, VXLANInfo

# --------------------------------------------------------------------------- lines


def test_route_lines() -> None:
    r = Route(AF_INET, "10.65.0.1/32", protocol=3, scope=253, oif=7)
    assert route_replace_line(r, "cali1") == \
        "route replace unicast 10.65.0.1/32 table 254 proto 3 scope 253 dev cali1"
    r = Route(AF_INET, "10.70.1.0/26", table=1000, tos=0x10, priority=7, protocol=80, oif=3, gateway="10.70.1.0",
              src="192.168.0.1", onlink=True, mtu=1400)
    assert route_replace_line(r, "vxlan.calico") == (
        "route replace unicast 10.70.1.0/26 table 1000 proto 80 scope 0 tos 0x10 metric 7 dev vxlan.calico "
        "via 10.70.1.0 src 192.168.0.1 onlink mtu 1400")
    bh = Route(AF_INET6, "fd77::/64", priority=1024, type=6, protocol=80, oif=1)
    assert route_replace_line(bh, None) == "route replace blackhole fd77::/64 table 254 proto 80 scope 0 metric 1024"
    assert route_delete_line(r) == "route del 10.70.1.0/26 table 1000 tos 0x10 metric 7"
    assert route_delete_line(bh) == "route del fd77::/64 table 254 metric 1024"


def test_neigh_line_and_name_quoting() -> None:
    n = Neigh(AF_INET, 5, "10.65.0.1", "ee:ee:ee:ee:ee:01")
    assert neigh_replace_line(n, "cali1") == "neigh replace 10.65.0.1 lladdr ee:ee:ee:ee:ee:01 nud permanent dev cali1"
    assert quote_name("cali1234567890a") == "cali1234567890a"
    assert quote_name("vxlan-v6.calico") == "vxlan-v6.calico"
    assert quote_name("we#ird") == '"we#ird"'
    assert quote_name('a"b') == "'a\"b'"
    assert quote_name("a\"b'c") is None


# --------------------------------------------------------------------------- batch stderr

# `ip -4 -force -batch -`: lines 2, 3, 5, 6, 7, 8 failed, then `neigh replace` on line 10 made ip exit (status 2).
V4_STDERR = """RTNETLINK answers: No such device
Command failed -:2
Error: Device for nexthop is not up.
Command failed -:3
RTNETLINK answers: No such process
Command failed -:5
Cannot find device "nosuch"
Command failed -:6
Error: Nexthop has invalid gateway.
Command failed -:7
Error: Invalid prefsrc address.
Command failed -:8
RTNETLINK answers: No such device
"""

V6_STDERR = """Error: Nexthop device is not up.
Command failed -:2
RTNETLINK answers: No such device
Command failed -:3
RTNETLINK answers: No such process
Command failed -:5
RTNETLINK answers: No route to host
Command failed -:7
"""


def test_batch_stderr_maps_failures_to_lines() -> None:
    rep = parse_batch_stderr(V6_STDERR, 1)
    assert {n: f.errno for n, f in rep.failed.items()} == {
        2: errno.ENETDOWN, 3: errno.ENODEV, 5: errno.ESRCH, 7: errno.EHOSTUNREACH}
    assert rep.aborted is None and rep.last_reported == 7
    assert "Nexthop device is not up" in rep.failed[2].message


def test_batch_stderr_detects_an_abort() -> None:
    rep = parse_batch_stderr(V4_STDERR, 2)
    assert {n: f.errno for n, f in rep.failed.items()} == {
        2: errno.ENODEV, 3: errno.ENETDOWN, 5: errno.ESRCH, 6: errno.ENODEV, 7: errno.EINVAL, 8: errno.EINVAL}
    assert rep.aborted == BatchFailure(errno.ENODEV, "RTNETLINK answers: No such device")
    assert rep.last_reported == 8
    # ip neigh exits on the first kernel error even with -force:
    rep = parse_batch_stderr("Error: IPv6 is disabled on this device.\n", 2)
    assert rep.failed == {} and rep.aborted is not None and rep.aborted.errno == errno.EINVAL


def test_batch_stderr_edge_cases() -> None:
    assert parse_batch_stderr("", 0) == parse_batch_stderr("Warning: something harmless.\n", 0)
    assert parse_batch_stderr("", 0).aborted is None
    killed = parse_batch_stderr("", -9)
    assert killed.aborted is not None and killed.aborted.errno == errno.EIO
    odd = parse_batch_stderr("", 1)  # failed, but said nothing: trust nothing
    assert odd.aborted is not None
    warned = parse_batch_stderr("Warning: x.\nRTNETLINK answers: File exists\nCommand failed -:1\n", 1)
    assert warned.failed[1].errno == errno.EEXIST and warned.aborted is None


def test_errno_from_message() -> None:
    assert errno_from_message("RTNETLINK answers: No such process") == errno.ESRCH
    assert errno_from_message("RTNETLINK answers: Network is down") == errno.ENETDOWN
    assert errno_from_message("RTNETLINK answers: No buffer space available") == errno.ENOBUFS
    assert errno_from_message('Cannot find device "cali9"') == errno.ENODEV
    assert errno_from_message("Error: ipv4: FIB table does not exist.") == errno.ENOENT
    assert errno_from_message("Error: Invalid prefsrc address.") is None  # -> EINVAL by failure_from_lines


# --------------------------------------------------------------------------- route dumps

# `ip -4 -j -d -N route show table main` (cali1 = 3).
V4_ROUTES = """[{"type":"1","dst":"default","gateway":"192.168.5.9","dev":"cali1","protocol":"3","scope":"0","flags":[]},
{"type":"1","dst":"10.65.0.1","dev":"cali1","protocol":"3","scope":"253","flags":[]},
{"type":"1","dst":"10.65.0.2","gateway":"192.168.5.9","dev":"cali1","protocol":"80","scope":"0",
 "prefsrc":"192.168.5.1","metric":7,"flags":["onlink"],"metrics":[{"mtu":1400}]},
{"type":"1","dst":"10.66.0.0/24","protocol":"3","scope":"0","flags":[],"nexthops":[
 {"gateway":"192.168.5.9","dev":"cali1","weight":1,"flags":[]},{"gateway":"192.168.5.8","dev":"cali1","weight":1,"flags":[]}]},
{"type":"6","dst":"10.77.0.0/16","protocol":"4","scope":"0","flags":[]},
{"type":"7","dst":"10.78.0.0/16","protocol":"12","scope":"0","flags":[]},
{"type":"1","dst":"10.79.0.0/16","via":{"family":"inet6","host":"fe80::1"},"dev":"cali1","protocol":"3","scope":"0","flags":[]},
{"type":"1","dst":"10.80.0.0/16","tos":"0x10","dev":"cali1","protocol":"3","scope":"253","flags":[]},
{"type":"1","dst":"10.81.0.0/16","dev":"if42","protocol":"3","scope":"253","flags":[]},
{"type":"1","dst":"192.168.5.0/24","dev":"cali1","protocol":"2","scope":"253","prefsrc":"192.168.5.1","flags":[]}]
"""


def test_parse_v4_route_dump() -> None:
    got = {r.dst: r for r in parse_route_dump(V4_ROUTES, AF_INET, 254, name_to_index={"cali1": 3, "lo": 1})}
    assert got["0.0.0.0/0"] == Route(AF_INET, "0.0.0.0/0", protocol=3, oif=3, gateway="192.168.5.9")
    assert got["10.65.0.1/32"] == Route(AF_INET, "10.65.0.1/32", protocol=3, scope=253, oif=3)
    assert got["10.65.0.2/32"] == Route(AF_INET, "10.65.0.2/32", priority=7, protocol=80, oif=3,
                                        gateway="192.168.5.9", src="192.168.5.1", onlink=True, mtu=1400)
    assert got["10.66.0.0/24"] == Route(AF_INET, "10.66.0.0/24", protocol=3)  # multipath: no single oif
    assert got["10.77.0.0/16"] == Route(AF_INET, "10.77.0.0/16", type=6, protocol=4)
    assert got["10.78.0.0/16"].type == 7 and got["10.78.0.0/16"].protocol == 12
    assert got["10.79.0.0/16"].gateway is None  # RTA_VIA is not a gateway we program
    assert got["10.80.0.0/16"].tos == 0x10
    assert "10.81.0.0/16" not in got  # via an interface ip could not name: left out
    assert got["192.168.5.0/24"] == Route(AF_INET, "192.168.5.0/24", protocol=2, scope=253, oif=3,
                                          src="192.168.5.1")


# `ip -6 -j -d -N route show table main` (cali1 = 3, p1 = 2).
V6_ROUTES = """[{"type":"1","dst":"::ffff:1.2.3.0/120","dev":"cali1","protocol":"3","scope":"0","metric":1024,"flags":[],"pref":"medium"},
{"type":"1","dst":"fd65::1","dev":"cali1","protocol":"3","scope":"0","metric":1024,"flags":[],"pref":"medium"},
{"type":"6","dst":"fd77::/64","dev":"lo","protocol":"80","scope":"0","metric":1024,"flags":[],"pref":"medium"},
{"type":"1","dst":"fd78::/64","gateway":"fd50::9","dev":"cali1","protocol":"3","scope":"0","metric":1024,"flags":[],
 "metrics":[{"mtu":1300}],"pref":"medium"},
{"type":"1","dst":"fe80::/64","dev":"p1","protocol":"2","scope":"0","metric":256,"flags":[],"pref":"medium"}]
"""


def test_parse_v6_route_dump() -> None:
    got = {r.dst: r for r in parse_route_dump(V6_ROUTES, AF_INET6, 254, name_to_index={"cali1": 3, "lo": 1, "p1": 2})}
    assert set(got) == {"::ffff:102:300/120", "fd65::1/128", "fd77::/64", "fd78::/64", "fe80::/64"}
    assert got["fd65::1/128"] == Route(AF_INET6, "fd65::1/128", priority=1024, protocol=3, oif=3)
    assert got["fd77::/64"] == Route(AF_INET6, "fd77::/64", priority=1024, type=6, protocol=80, oif=1)
    assert got["fd78::/64"] == Route(AF_INET6, "fd78::/64", priority=1024, protocol=3, oif=3, gateway="fd50::9",
                                     mtu=1300)


def test_parse_filtered_and_foreign_table_dumps() -> None:
    # `... route show table 254 dev cali1`: ip leaves `dev` out.
    text = '[{"type":"1","dst":"10.65.0.1","protocol":"3","scope":"253","flags":[]}]'
    assert parse_route_dump(text, AF_INET, 254, oif=3, name_to_index={}) == [
        Route(AF_INET, "10.65.0.1/32", protocol=3, scope=253, oif=3)]
    # A route printed with another table (e.g. from `table all`) is not this table's.
    text = '[{"type":"9","dst":"10.79.0.0/16","table":"100","protocol":"3","scope":"0","flags":[]}]'
    assert parse_route_dump(text, AF_INET, 254, name_to_index={}) == []
    assert parse_route_dump(text, AF_INET, 100, name_to_index={}) == [
        Route(AF_INET, "10.79.0.0/16", table=100, type=9, protocol=3)]
    assert parse_route_dump("", AF_INET, 254, name_to_index={}) == []
    # Without -d/-N ip omits defaults; the parser fills iproute2's defaults.
    assert parse_route_dump('[{"dst":"10.65.0.1","dev":"cali1","scope":"253","flags":[]}]', AF_INET, 254,
                            name_to_index={"cali1": 3}) == [Route(AF_INET, "10.65.0.1/32", scope=253, oif=3)]


# --------------------------------------------------------------------------- link dumps

# `ip -j -d link show`, trimmed to the fields that matter.
LINKS = """[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"mtu":65536,"operstate":"UNKNOWN",
  "link_type":"loopback","address":"00:00:00:00:00:00"},
 {"ifindex":2,"link":"cali1","ifname":"p1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":1500,
  "operstate":"UP","link_type":"ether","address":"AA:BB:CC:00:00:02","linkinfo":{"info_kind":"veth"}},
 {"ifindex":3,"link":"p1","ifname":"cali1","flags":["NO-CARRIER","BROADCAST","MULTICAST","UP"],"mtu":1500,
  "operstate":"LOWERLAYERDOWN","link_type":"ether","address":"aa:bb:cc:00:00:03","linkinfo":{"info_kind":"veth"}},
 {"ifindex":4,"ifname":"vxlan.calico","flags":["BROADCAST","MULTICAST"],"mtu":1450,"operstate":"DOWN",
  "link_type":"ether","address":"66:00:00:00:00:07","linkinfo":{"info_kind":"vxlan","info_data":{"id":4096,
  "local":"192.168.5.1","link":"cali1","port_range":{"low":0,"high":0},"port":4789,"learning":false,"ttl":0}}},
 {"ifindex":5,"ifname":"vxlan-v6.calico","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":1430,
  "operstate":"UNKNOWN","link_type":"ether","address":"66:00:00:00:01:01","linkinfo":{"info_kind":"vxlan",
  "info_data":{"id":4097,"local6":"fd70::1","link":"if77","port":4790,"learning":true,"l2miss":true,"gbp":true}}},
 {"ifindex":6,"ifname":"tunl0","flags":["NOARP"],"mtu":1480,"operstate":"DOWN","link_type":"ipip",
  "address":"0.0.0.0","linkinfo":{"info_kind":"ipip","info_data":{"remote":"any","local":"any"}}}]
"""


def test_parse_link_dump() -> None:
    got = {link.name: link for link in parse_link_dump(LINKS)}
    assert got["lo"] == Link(1, "lo", mtu=65536, mac="00:00:00:00:00:00", admin_up=True, oper_up=True)
    assert got["p1"] == Link(2, "p1", kind="veth", mac="aa:bb:cc:00:00:02", admin_up=True, oper_up=True)
    assert got["cali1"] == Link(3, "cali1", kind="veth", mac="aa:bb:cc:00:00:03", admin_up=True, oper_up=False)
    assert got["vxlan.calico"] == Link(4, "vxlan.calico", kind="vxlan", mtu=1450, mac="66:00:00:00:00:07",
                                       vxlan=VXLANInfo(vni=4096, port=4789, local="192.168.5.1", parent_index=3))
    assert got["vxlan-v6.calico"].vxlan == VXLANInfo(vni=4097, port=4790, local="fd70::1", parent_index=77,
                                                     learning=True, gbp=True, l2miss=True)
    assert got["tunl0"] == Link(6, "tunl0", kind="ipip", mtu=1480)  # no MAC


# --------------------------------------------------------------------------- neighbour dumps

NEIGHS = """[{"dst":"192.168.5.6","dev":"cali1"},
{"dst":"192.168.5.7","dev":"cali1","lladdr":"aa:bb:cc:dd:ee:ff","state":["PERMANENT"]},
{"dst":"192.168.5.99","dev":"cali1","state":["INCOMPLETE"]},
{"dst":"192.168.5.5","dev":"cali1","lladdr":"aa:bb:cc:dd:ee:fe","state":["STALE"]},
{"dst":"192.168.5.4","dev":"gone0","lladdr":"aa:bb:cc:dd:ee:fd","state":["PERMANENT"]}]
"""


def test_parse_neigh_dump() -> None:
    got = parse_neigh_dump(NEIGHS, AF_INET, name_to_index={"cali1": 3})
    assert got == [
        Neigh(AF_INET, 3, "192.168.5.6", None, 0),
        Neigh(AF_INET, 3, "192.168.5.7", "aa:bb:cc:dd:ee:ff", 0x80),
        Neigh(AF_INET, 3, "192.168.5.99", None, 0x01),
        Neigh(AF_INET, 3, "192.168.5.5", "aa:bb:cc:dd:ee:fe", 0x04),
    ]
    v6 = '[{"dst":"ff02::16","lladdr":"33:33:00:00:00:16","state":["NOARP"]}]'  # `... dev vxlan-v6.calico`
    assert parse_neigh_dump(v6, AF_INET6, ifindex=5, name_to_index={}) == [
        Neigh(AF_INET6, 5, "ff02::16", "33:33:00:00:00:16", 0x40)]


# --------------------------------------------------------------------------- IpTool with a scripted ip


class ScriptedIp:
    """Stands in for the runner: answers each call from a list; records argv and stdin."""

    def __init__(self, *answers: CommandResult) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list[str], str | None]] = []

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        self.calls.append((list(argv), stdin))
        return self.answers.pop(0)


class Names:
    def __init__(self, *maps: dict[int, str]) -> None:
        self.maps = list(maps)

    def __call__(self) -> dict[int, str]:
        return dict(self.maps.pop(0) if len(self.maps) > 1 else self.maps[0])


def test_routes_replace_groups_families_and_maps_failures() -> None:
    ip = ScriptedIp(CommandResult(1, "", "Error: Device for nexthop is not up.\nCommand failed -:2\n"),
                    CommandResult(0))
    tool = IpTool(ip, Names({1: "lo", 3: "cali1", 4: "cali2"}))
    routes = [Route(AF_INET, "10.0.0.1/32", scope=253, oif=3), Route(AF_INET, "10.0.0.2/32", scope=253, oif=4),
              Route(AF_INET, "10.0.0.3/32", scope=253, oif=9),  # no such index: never sent
              Route(AF_INET6, "fd00::1/128", priority=1024, oif=3)]
    assert tool.routes_replace(routes) == [0, errno.ENETDOWN, errno.ENODEV, 0]
    (argv4, in4), (argv6, in6) = ip.calls
    assert argv4 == ["ip", "-4", "-force", "-batch", "-"] and argv6 == ["ip", "-6", "-force", "-batch", "-"]
    assert in4 is not None and in4.splitlines() == [
        "route replace unicast 10.0.0.1/32 table 254 proto 3 scope 253 dev cali1",
        "route replace unicast 10.0.0.2/32 table 254 proto 3 scope 253 dev cali2"]
    assert in6 == "route replace unicast fd00::1/128 table 254 proto 3 scope 0 metric 1024 dev cali1\n"


def test_interface_renamed_during_a_batch_is_reported_gone() -> None:
    ip = ScriptedIp(CommandResult(0))
    tool = IpTool(ip, Names({3: "cali1", 4: "cali2"}, {3: "cali1", 5: "cali2"}))  # cali2 recreated meanwhile
    routes = [Route(AF_INET, "10.0.0.1/32", oif=3), Route(AF_INET, "10.0.0.2/32", oif=4)]
    assert tool.routes_replace(routes) == [0, errno.ENODEV]


def test_deletes_need_no_names() -> None:
    ip = ScriptedIp(CommandResult(1, "", "RTNETLINK answers: No such process\nCommand failed -:1\n"))
    tool = IpTool(ip, Names())  # would raise if asked
    assert tool.routes_delete([Route(AF_INET, "10.0.0.1/32", oif=3), Route(AF_INET, "10.0.0.2/32", oif=3)]) == [
        errno.ESRCH, 0]
    assert ip.calls[0][1] == "route del 10.0.0.1/32 table 254\nroute del 10.0.0.2/32 table 254\n"


def test_neighbour_abort_is_located_and_the_rest_rerun() -> None:
    neighs = [Neigh(AF_INET, 3, f"10.0.0.{i}", f"ee:ee:ee:ee:ee:0{i}") for i in range(1, 5)]
    dump = '[{"dst":"10.0.0.1","dev":"cali1","lladdr":"ee:ee:ee:ee:ee:01","state":["PERMANENT"]}]'
    ip = ScriptedIp(
        CommandResult(2, "", "RTNETLINK answers: Invalid argument\n"),  # ip exited somewhere after line 1
        CommandResult(0, dump),  # the neighbour dump that locates it: line 2 is missing
        CommandResult(0),  # lines 3-4 re-run
    )
    tool = IpTool(ip, Names({3: "cali1"}))
    assert tool.neighs_replace(neighs) == [0, errno.EINVAL, 0, 0]
    assert ip.calls[1][0] == ["ip", "-4", "-j", "neigh", "show", "nud", "all"]
    assert ip.calls[2][1] is not None and ip.calls[2][1].splitlines() == [
        "neigh replace 10.0.0.3 lladdr ee:ee:ee:ee:ee:03 nud permanent dev cali1",
        "neigh replace 10.0.0.4 lladdr ee:ee:ee:ee:ee:04 nud permanent dev cali1"]


def test_unlocatable_abort_fails_only_the_unconfirmed_lines() -> None:
    ip = ScriptedIp(CommandResult(255, "", "RTNETLINK answers: File exists\nCommand failed -:1\n"
                                          'Error: argument "x" is wrong: invalid\n'))
    tool = IpTool(ip, Names({3: "cali1"}))
    routes = [Route(AF_INET, f"10.0.0.{i}/32", oif=3) for i in range(1, 4)]
    assert tool.routes_replace(routes) == [errno.EEXIST, errno.EIO, errno.EIO]


def test_items_ip_cannot_express_fail_alone_and_a_hung_ip_fails_the_batch() -> None:
    class Hung:
        calls = 0

        def run(self, argv: Sequence[str], stdin: str | None = None, *,
                while_running: Callable[[], None] | None = None) -> CommandResult:
            self.calls += 1
            return CommandResult(EXIT_TIMED_OUT, "", "ip: timed out after 60.0s", tuple(argv))

    hung = Hung()
    tool = IpTool(hung, Names({3: "cali1"}))
    assert tool.neighs_replace([Neigh(AF_INET, 0, "10.0.0.1", "ee:ee:ee:ee:ee:01")]) == [errno.EINVAL]
    assert hung.calls == 0
    routes = [Route(AF_INET, "10.0.0.1/32", type=42), Route(AF_INET, "10.0.0.2/32", oif=3)]
    assert tool.routes_replace(routes) == [errno.EINVAL, errno.EIO]
    assert hung.calls == 1


def test_route_list_argv_missing_table_and_interrupted_dump() -> None:
    ip = ScriptedIp(CommandResult(0, "[", "Dump was interrupted and may be inconsistent.\n"),
                    CommandResult(0, '[{"type":"1","dst":"10.0.0.1","protocol":"3","scope":"253","flags":[]}]'),
                    CommandResult(2, "[", "Error: ipv4: FIB table does not exist.\nDump terminated\n"),
                    CommandResult(1, "", "RTNETLINK answers: Operation not permitted\n"))
    tool = IpTool(ip, Names({3: "cali1"}))
    assert tool.route_list(AF_INET, 254, oif=3) == [Route(AF_INET, "10.0.0.1/32", scope=253, oif=3)]
    assert ip.calls[1][0] == ["ip", "-4", "-j", "-d", "-N", "route", "show", "table", "254", "dev", "cali1"]
    assert tool.route_list(AF_INET, 1000) == []
    with pytest.raises(NetlinkCallError) as exc:
        tool.route_list(AF_INET6, 254)
    assert exc.value.errno == errno.EPERM
    with pytest.raises(NetlinkCallError) as exc:
        tool.route_list(AF_INET, 254, oif=9)
    assert exc.value.not_found


class NamesOf:
    """Lookups of named interfaces (IpTool.names_of) over a sequence of index -> name maps, one per call."""

    def __init__(self, *maps: dict[int, str]) -> None:
        self.maps = list(maps)
        self.asked: list[set[int]] = []

    def __call__(self, indexes: Iterable[int]) -> dict[int, str]:
        wanted = set(indexes)
        self.asked.append(wanted)
        got = {i: n for i, n in self.maps[0].items() if i in wanted}
        if len(self.maps) > 1:
            self.maps.pop(0)
        return got


class NoFullMap:
    def __call__(self) -> dict[int, str]:
        raise AssertionError("the whole interface map was asked for")


def test_a_batch_or_one_device_dump_looks_up_the_names_it_uses_alone() -> None:
    dump = '[{"type":"1","dst":"10.0.0.1","protocol":"3","scope":"253","flags":[]}]'
    ip = ScriptedIp(CommandResult(0, dump), CommandResult(0))
    names_of = NamesOf({3: "cali1", 4: "cali2", 5: "cali3"})
    tool = IpTool(ip, NoFullMap(), names_of=names_of)
    assert tool.route_list(AF_INET, 254, oif=3) == [Route(AF_INET, "10.0.0.1/32", scope=253, oif=3)]
    assert ip.calls[0][0][-2:] == ["dev", "cali1"] and names_of.asked == [{3}, {3}]   # before and after the dump
    routes = [Route(AF_INET, "10.0.0.1/32", oif=3), Route(AF_INET, "10.0.0.2/32", oif=4),
              Route(AF_INET, "10.0.0.3/32", oif=9)]                              # 9: no such interface
    assert tool.routes_replace(routes) == [0, 0, errno.ENODEV]
    assert names_of.asked[2:] == [{3, 4, 9}, {3, 4}]   # before the batch; after it, the ones sent
    assert "cali3" not in ip.calls[1][1]


def test_many_interfaces_are_looked_up_by_index_never_through_the_whole_map() -> None:
    """A batch about 1,000 interfaces costs 1,000 lookups, not a link dump of every interface."""
    names = {i: f"cali{i}" for i in range(2, 1002)}
    ip = ScriptedIp(CommandResult(0))
    names_of = NamesOf(names)
    tool = IpTool(ip, NoFullMap(), names_of=names_of)
    routes = [Route(AF_INET, f"10.0.{i // 250}.{i % 250}/32", oif=i) for i in names]
    assert tool.routes_replace(routes) == [0] * len(routes)
    assert [len(a) for a in names_of.asked] == [1000, 1000]


def test_a_full_dump_after_a_link_listing_checks_only_the_interfaces_it_names() -> None:
    # The caller's listing is the "before"; "after" is one lookup per interface the output names.  A
    # route of an interface renamed since the listing (cali2), or missing from it (cali9), is left out.
    dump = json.dumps([{"dst": "10.0.0.1", "dev": "cali1", "protocol": "3", "scope": "253", "flags": []},
                       {"dst": "10.0.0.2", "dev": "cali2", "protocol": "3", "scope": "253", "flags": []},
                       {"dst": "10.0.0.9", "dev": "cali9", "protocol": "3", "scope": "253", "flags": []},
                       {"type": "6", "dst": "10.0.1.0/26", "protocol": "80", "flags": []}])
    ip = ScriptedIp(CommandResult(0, dump), CommandResult(0, '[{"type":"6","dst":"10.0.1.0/26","flags":[]}]'))
    names_of = NamesOf({3: "cali1", 4: "renamed"})
    tool = IpTool(ip, NoFullMap(), names_of=names_of)
    listing = {1: "lo", 3: "cali1", 4: "cali2", 5: "cali3"}
    got = tool.route_list(AF_INET, 254, names=listing)
    assert [(r.dst, r.oif) for r in got] == [("10.0.0.1/32", 3), ("10.0.1.0/26", 0)]
    assert names_of.asked == [{3, 4}]
    assert [r.dst for r in tool.route_list(AF_INET, 254, names=listing)] == ["10.0.1.0/26"]
    assert names_of.asked == [{3, 4}, set()]   # a dump that names no interface: nothing to check


def test_dumped_dev_names_decode_json_escapes() -> None:
    text = json.dumps([{"dev": "cali1"}, {"dev": 'we"ird\\x'}, {"nexthops": [{"dev": "eth0"}, {"dev": "cali1"}]}])
    assert dumped_dev_names(text) == {"cali1", 'we"ird\\x', "eth0"}
    assert dumped_dev_names('[{"dst":"10.0.0.0/8","dev" : "a b"}]') == {"a b"}


def test_interface_renamed_during_a_batch_fails_its_lines() -> None:
    ip = ScriptedIp(CommandResult(0))
    tool = IpTool(ip, NoFullMap(), names_of=NamesOf({3: "cali1", 4: "cali2"}, {3: "cali1", 4: "renamed"}))
    routes = [Route(AF_INET, "10.0.0.1/32", oif=3), Route(AF_INET, "10.0.0.2/32", oif=4)]
    assert tool.routes_replace(routes) == [0, errno.ENODEV]


def test_interface_gone_during_a_one_interface_dump_is_reported() -> None:
    ip = ScriptedIp(CommandResult(0, "[]"))
    tool = IpTool(ip, NoFullMap(), names_of=NamesOf({3: "cali1"}, {}))
    with pytest.raises(NetlinkCallError) as exc:
        tool.route_list(AF_INET, 254, oif=3)
    assert exc.value.errno == errno.ENODEV


def test_ifnames_match_the_socket_module_and_unknown_index_is_absent() -> None:
    import socket

    from felixpy.drivers.netlink import ifnames
    assert ifnames.if_nameindex() == socket.if_nameindex()
    every = dict(socket.if_nameindex())
    assert ifnames.indextonames([*every, 2**31 - 1, 0, -1]) == every
    assert ifnames.indextonames([]) == {}


def test_dumps_decode_an_element_at_a_time_as_json_would_whole() -> None:
    """``_load`` yields a dump's elements one by one (a 10,000-link dump never exists decoded whole), and
    takes and refuses exactly what ``json.loads`` of a list does."""
    from felixpy.drivers.netlink.iproute2 import _load

    for text in ("[]", " [ ] \n", "[{}]", '[{"a":[1,{"b":"],"}]},\n {"c":null} ]\n', LINKS, NEIGHS, "",
                 "[{} , {}]", "[{},\t{}]", "[1,2,3]"):
        assert list(_load(text)) == (json.loads(text) if text.strip() else [])
    for bad in ("[", "[{}", '[{"a":1},', "[{}]]", "[{}] x", "{}", '[{"a":1} {"b":2}]', "[,]", "[{},]", "[{} ,]",
                "[{},,{}]", "[{} }", "[{}"):
        with pytest.raises(ValueError):
            list(_load(bad))


def test_a_vxlan_parent_listed_after_its_device_is_found() -> None:
    text = ('[{"ifindex":9,"ifname":"vxlan.calico","flags":["UP"],"mtu":1450,"address":"66:00:00:00:00:07",'
            '"linkinfo":{"info_kind":"vxlan","info_data":{"id":4096,"link":"eth9","port":4789}}},'
            '{"ifindex":12,"ifname":"eth9","flags":["UP"],"mtu":1500,"address":"aa:bb:cc:00:00:12"}]')
    vx = parse_link_dump(text)[0].vxlan
    assert vx is not None and vx.parent_index == 12


def test_a_runner_that_takes_lines_gets_the_batch_as_lines_never_joined() -> None:
    """A batch goes to a lines runner unjoined (15,000 ``tc`` lines joined were held twice at the BPF stress
    profile's peak, #17), and the child reads exactly what the joined text was, a re-run included."""

    class LinesIp(ScriptedIp):
        takes_stdin_lines = True

        def run(self, argv: Sequence[str], stdin: Any = None, *,
                while_running: Callable[[], None] | None = None) -> CommandResult:
            if "-batch" in argv:
                assert stdin is not None and not isinstance(stdin, str)
            return super().run(argv, stdin_text(stdin), while_running=while_running)

    neighs = [Neigh(AF_INET, 3, f"10.0.0.{i}", f"ee:ee:ee:ee:ee:0{i}") for i in range(1, 5)]
    dump = '[{"dst":"10.0.0.1","dev":"cali1","lladdr":"ee:ee:ee:ee:ee:01","state":["PERMANENT"]}]'
    ip = LinesIp(CommandResult(2, "", "RTNETLINK answers: Invalid argument\n"), CommandResult(0, dump),
                 CommandResult(0))
    tool = IpTool(ip, Names({3: "cali1"}))
    assert tool.neighs_replace(neighs) == [0, errno.EINVAL, 0, 0]
    assert ip.calls[0][1] == "".join(f"neigh replace 10.0.0.{i} lladdr ee:ee:ee:ee:ee:0{i} nud permanent dev cali1\n"
                                     for i in range(1, 5))
    assert ip.calls[2][1] == ("neigh replace 10.0.0.3 lladdr ee:ee:ee:ee:ee:03 nud permanent dev cali1\n"
                              "neigh replace 10.0.0.4 lladdr ee:ee:ee:ee:ee:04 nud permanent dev cali1\n")
