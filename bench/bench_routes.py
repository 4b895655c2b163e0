"""Benchmark: 5,000 workload routes, cold and on a restart resync, against ``ip -batch``.

Everything runs inside a throwaway network namespace (100 veth "workload"
interfaces, 50 /32 routes each, each route with a static ARP entry as Felix's
endpoint manager asks for).  Rows:

* felixpy cold — a fresh RouteTable: ``set_routes`` for every interface, then
  ``apply()`` (full resync of an empty table, then the writes through
  ``ip -force -batch``: one run for the routes, one for the ARP entries);
  the "of which" rows split ``apply()`` into time spent in the shim's calls;
* ip -batch cold — the same route and neighbour writes through one bare
  ``ip -batch -`` (the floor);
* pyroute2 one-by-one cold — ``IPRoute.route("replace")`` per route (routes
  only), why bulk writes go through ``ip -batch``;
* felixpy restart resync — a new RouteTable with the same desired state on the
  programmed table: link list + route dump + neighbour dump + diff; the bench
  asserts that it writes nothing;
* ip -batch rewrite — what a diff-less restart would do: all writes again;
* felixpy restart with drift — 10 % of routes missing, 10 % stale extras;
* dumps — pyroute2 against ``ip -j`` for the route and link dumps.

Usage: ``python bench/bench_routes.py [--routes 5000] [--ifaces 100] [--reps 3]`` (root).
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog  # noqa: E402

from felixpy.drivers.netlink.pyroute import PyrouteNetlink, _link_from_msg  # noqa: E402
from felixpy.drivers.routetable import MainTableOwnershipPolicy, RouteTable, Target  # noqa: E402
from felixpy.drivers.routetable.routeclass import RouteClass  # noqa: E402
from felixpy.testing import netns as N  # noqa: E402

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))


def plan(n_routes: int, n_ifaces: int) -> dict[str, list[Target]]:
    per = n_routes // n_ifaces
    base = int(ipaddress.IPv4Address("10.64.0.0"))
    out: dict[str, list[Target]] = {}
    k = 0
    for i in range(n_ifaces):
        ts = []
        for _ in range(per):
            addr = ipaddress.IPv4Address(base + k)
            mac = "ee:ee:%02x:%02x:%02x:%02x" % tuple(addr.packed)
            ts.append(Target(f"{addr}/32", dest_mac=mac))
            k += 1
        out[f"cali{i}"] = ts
    return out


class TimedHandle:
    """Opens real handles; adds up the seconds spent in each call and the items written."""

    WRITES = ("routes_replace", "routes_delete", "neighs_replace")

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.inner: PyrouteNetlink | None = None
        self.seconds: dict[str, float] = {}
        self.written = 0

    def open(self) -> TimedHandle:  # the table's NetlinkFactory
        self.inner = PyrouteNetlink(self.ns)
        return self

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
            self.inner = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)

        def timed_call(*args: Any, **kw: Any) -> Any:
            if name in self.WRITES:
                self.written += len(args[0])
            t0 = time.perf_counter()
            try:
                return attr(*args, **kw)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
        return timed_call


def new_table(ns: str) -> tuple[RouteTable, TimedHandle]:
    handle = TimedHandle(ns)
    rt = RouteTable(ip_version=4, new_handle=handle.open, static_arp=True,  # type: ignore[arg-type]
                    ownership=MainTableOwnershipPolicy(workload_iface_prefixes=["cali"], device_route_protocol=3,
                                                       remove_external_routes=True))
    return rt, handle


def load(rt: RouteTable, p: dict[str, list[Target]]) -> None:
    for iface, ts in p.items():
        rt.set_routes(RouteClass.LOCAL_WORKLOAD, iface, ts)


def flush(ns: str) -> None:
    N.run_in(ns, "ip", "route", "flush", "proto", "boot")
    N.run_in(ns, "ip", "neigh", "flush", "nud", "permanent")


def ip_batch(ns: str, p: dict[str, list[Target]]) -> None:
    lines = []
    for iface, ts in p.items():
        for t in ts:
            addr = t.cidr.split("/")[0]
            lines.append(f"route replace {t.cidr} dev {iface} proto boot scope link")
            lines.append(f"neigh replace {addr} lladdr {t.dest_mac} dev {iface} nud permanent")
    subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True)


def timed(fn: Callable[[], object]) -> float:
    gc.collect()  # start every measurement without the previous scenario's garbage
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def count_routes(ns: str) -> int:
    return N.run_in(ns, "ip", "route", "show", "proto", "boot").stdout.count("\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--routes", type=int, default=5000)
    ap.add_argument("--ifaces", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    p = plan(a.routes, a.ifaces)
    rows: dict[str, list[float]] = {}

    def rec(name: str, secs: float) -> None:
        rows.setdefault(name, []).append(secs)

    with N.netns("fpyb") as ns:
        lines = []
        for i in range(a.ifaces):
            lines += [f"link add cali{i} type veth peer name p{i}", f"link set cali{i} up", f"link set p{i} up"]
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True)
        for _ in range(a.reps):
            flush(ns)
            rt, h = new_table(ns)
            t_set = timed(lambda: load(rt, p))
            t_apply = timed(rt.apply)
            assert count_routes(ns) == a.routes, count_routes(ns)
            rec("felixpy cold: set_routes", t_set)
            rec("felixpy cold: apply", t_apply)
            rec("felixpy cold: total", t_set + t_apply)
            rec("  of which ip -batch, routes (routes_replace)", h.seconds["routes_replace"])
            rec("  of which ip -batch, ARP (neighs_replace)", h.seconds["neighs_replace"])
            rec("  of which dumps (links, routes, neighbours)",
                sum(h.seconds[k] for k in ("link_list", "route_list", "neigh_list")))
            rec("  of which the route table's own work", t_apply - sum(h.seconds.values()))
            rt.close()

            # Restart resync: same desired state, table already programmed.
            rt2, h2 = new_table(ns)
            t_set = timed(lambda: load(rt2, p))
            t_apply = timed(rt2.apply)
            assert h2.written == 0, f"a restart without drift wrote {h2.written} items"
            rec("felixpy restart resync (no drift): total", t_set + t_apply)
            rec("felixpy restart resync (no drift): apply", t_apply)
            rec("  of which dumps (links, routes, neighbours)", sum(h2.seconds.values()))
            rt2.close()

            # Restart with drift: 10 % missing, 10 % stale extras on workload ifaces.
            items = [(i, t) for i, ts in p.items() for t in ts]
            drop = items[:: 10]
            cmds = [f"route del {t.cidr} dev {i}" for i, t in drop]
            extra = [f"route add 10.200.{k // 250}.{k % 250}/32 dev cali{k % a.ifaces} proto boot scope link"
                     for k in range(len(drop))]
            subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(cmds + extra) + "\n", text=True,
                           check=True)
            rt3, h3 = new_table(ns)
            rt3.grace_period = 0.0  # the stale extras are not a CNI race here
            t_set = timed(lambda: load(rt3, p))
            t_apply = timed(rt3.apply)
            assert count_routes(ns) == a.routes
            assert h3.written == 2 * len(drop), h3.written  # the missing routes added, the extras deleted
            rec("felixpy restart with drift (10% missing, 10% stale): total", t_set + t_apply)
            rt3.close()

            flush(ns)
            rec("ip -batch cold (routes + neighs)", timed(lambda: ip_batch(ns, p)))
            assert count_routes(ns) == a.routes
            rec("ip -batch rewrite all (diff-less restart)", timed(lambda: ip_batch(ns, p)))

            flush(ns)
            from pyroute2 import IPRoute

            with IPRoute(netns=ns, flags=0) as ipr:
                idx = {i: ipr.link_lookup(ifname=i)[0] for i in p}

                def one_by_one() -> None:
                    for iface, ts in p.items():
                        for t in ts:
                            ipr.route("replace", dst=t.cidr, oif=idx[iface], proto=3, scope=253)

                rec("pyroute2 one-by-one cold (routes only)", timed(one_by_one))
                rec("route dump 5k: pyroute2 (decode)", timed(lambda: list(ipr.route("dump", table=254))))
                nl = PyrouteNetlink(ns)
                rec("route dump 5k: ip -j -d -N + json.loads only", timed(lambda: __import__("json").loads(
                    N.run_in(ns, "ip", "-4", "-j", "-d", "-N", "route", "show", "table", "254").stdout)))
                rec("route dump 5k: felixpy route_list (ip -j + parse)", timed(lambda: nl.route_list(2, 254)))
                n_links = len(nl.link_list())
                rec(f"link dump {n_links}: pyroute2 get_links (decode)",
                    timed(lambda: [_link_from_msg(m) for m in ipr.get_links()]))
                rec(f"link dump {n_links}: felixpy link_list (ip -j -d + parse)", timed(nl.link_list))
                nl.close()

    print(f"\n{a.routes} workload routes over {a.ifaces} veths (+ a static ARP entry each), "
          f"{a.reps} reps, median (min-max) seconds\n")
    width = max(len(k) for k in rows)
    print(f"{'scenario':<{width}}  {'median':>8}  {'min':>8}  {'max':>8}")
    for k, v in rows.items():
        print(f"{k:<{width}}  {statistics.median(v):8.3f}  {min(v):8.3f}  {max(v):8.3f}")
    cold = statistics.median(rows["felixpy cold: total"])
    ipb = statistics.median(rows["ip -batch cold (routes + neighs)"])
    print(f"\nfelixpy cold / ip -batch cold = {cold / ipb:.2f}x (goal <= 2x)")


if __name__ == "__main__":
    main()
