"""Transport throughput and idle memory (issue #2).

* msgs/s decoded and fanned out to managers, framed unix socket vs gRPC batches: the daemon
  runner runs in this process with a counting manager; the feed is a separate process, so
  encoding doesn't share our GIL.  Timed from the first byte sent to the manager seeing the
  last message.  Baseline: protobuf parsing alone of the same bytes (the floor for any transport).
* idle RSS of the real daemon (subprocess in a namespace, iptables mode) after the demo feed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import threading
import time
from typing import Any

from felixpy.config import Config
from felixpy.daemon import Daemon
from felixpy.dataplane.core import InternalDataplane
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb

N = 200_000


def messages(n: int) -> list[pb.ToDataplane]:
    out = [to_dataplane(0, pb.ConfigUpdate(config={}))]
    for i in range(1, n - 1):
        out.append(to_dataplane(i, pb.IPSetDeltaUpdate(id=f"s:set{i % 50}", added_members=[f"10.{i % 250}.{i % 200}.1"])))
    out.append(to_dataplane(n - 1, pb.InSync()))
    return out


class Counter:
    def __init__(self, n: int, done: threading.Event) -> None:
        self.n, self.seen, self.done = n, 0, done

    def on_update(self, msg: Any) -> None:
        self.seen += 1
        if self.seen == self.n:
            self.done.set()

    def complete_deferred_work(self) -> None:
        pass


def _client(target: str, n: int, start_q: "mp.Queue[float]") -> None:
    from felixpy.feed.client import connect

    msgs = messages(n)
    c = connect(target)
    start_q.put(time.perf_counter())
    c.send(msgs)
    time.sleep(3)
    c.close()


def run_transport(kind: str, n: int = N) -> float:
    tmp = tempfile.mkdtemp()
    sock = os.path.join(tmp, "s.sock")
    done = threading.Event()
    counter = Counter(n, done)

    def build(cfg: Config, **kw: Any) -> InternalDataplane:
        dp = InternalDataplane(cfg, kw["clock"])
        dp.register_manager(counter)
        return dp

    d = Daemon(build=build, environ={})
    if kind == "grpc":
        from felixpy.transports.grpcsvc import GrpcServer

        srv: Any = GrpcServer(f"unix:{sock}", d.events)
        target = f"grpc:unix:{sock}"
    else:
        from felixpy.transports.stream import UnixSocketServer

        srv = UnixSocketServer(sock, d.events)
        target = f"unix:{sock}"
    srv.start()
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    q: "mp.Queue[float]" = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_client, args=(target, n, q))
    p.start()
    t0 = q.get()
    done.wait(120)
    elapsed = time.perf_counter() - t0
    d.events.put(__import__("felixpy.daemon", fromlist=["Stop"]).Stop("bench"))
    p.join()
    srv.stop()
    return n / elapsed


def parse_only(n: int = N) -> float:
    raw = [m.SerializeToString() for m in messages(n)]
    t0 = time.perf_counter()
    for r in raw:
        m = pb.ToDataplane()
        m.ParseFromString(r)
        m.WhichOneof("payload")
    return n / (time.perf_counter() - t0)


def idle_rss_mib() -> float:
    from felixpy.feed.client import connect
    from felixpy.feed.scenario import bundled_scenario_path, load_scenario
    from felixpy.testing.daemon import start_daemon
    from felixpy.testing.netns import netns

    with netns("fpyb") as ns:
        d = start_daemon(ns, env={"FELIX_IPTABLESBACKEND": "legacy"})
        try:
            c = connect(d.target)
            c.send(load_scenario(bundled_scenario_path()).initial)
            c.wait_in_sync(60)
            time.sleep(3)
            with open(f"/proc/{d.proc.pid}/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
            c.close()
            return rss / 1024
        finally:
            d.stop()


def main() -> None:
    from felixpy import logs

    logs.configure("WARNING")
    print(f"# transport throughput, {N} messages (IPSetDeltaUpdate), client in a separate process")
    print("| path | msgs/s |")
    print("|---|---|")
    print(f"| protobuf parse only (floor) | {parse_only():,.0f} |")
    for kind in ("unix", "grpc"):
        print(f"| {kind} framed→decode→fan-out | {run_transport(kind):,.0f} |")
    print(f"\nidle daemon RSS (iptables-legacy, demo scenario applied): {idle_rss_mib():.1f} MiB")


if __name__ == "__main__":
    main()
