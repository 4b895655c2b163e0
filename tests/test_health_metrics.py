from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from felixpy.feed.client import connect
from felixpy.health import HealthAggregator
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import netns as nsmod
from felixpy.testing.daemon import start_daemon


def test_reporter_goes_stale_after_its_timeout() -> None:
    now = [0.0]
    agg = HealthAggregator(lambda: now[0])
    agg.register("loop", timeout=20)
    agg.report("loop", live=True, ready=True)
    assert agg.live() and agg.ready()
    now[0] = 21
    assert not agg.live() and not agg.ready()
    agg.report("loop", live=True, ready=True)
    assert agg.live()


def test_not_ready_until_reported_ready_and_no_timeout_means_never_stale() -> None:
    now = [0.0]
    agg = HealthAggregator(lambda: now[0])
    agg.register("startup", timeout=0)
    assert agg.live() and not agg.ready()
    now[0] = 1e6
    assert agg.live()


def _get(ns: str, url: str) -> tuple[int, str]:
    with nsmod.entered(ns):
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


@pytest.mark.kernel
def test_daemon_serves_health_and_felix_metrics(netns: str) -> None:
    env = {"FELIX_HEALTHENABLED": "true", "FELIX_HEALTHHOST": "127.0.0.1", "FELIX_HEALTHPORT": "9099",
           "FELIX_PROMETHEUSMETRICSENABLED": "true", "FELIX_PROMETHEUSMETRICSHOST": "127.0.0.1"}
    d = start_daemon(netns, env=env, iface_monitor=False)
    try:
        c = connect(d.target)
        c.send([to_dataplane(0, pb.ConfigUpdate(config={})), to_dataplane(1, pb.IPSetRemove(id="x"))])
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # servers start when the first config arrives
            try:
                code, _ = _get(netns, "http://127.0.0.1:9099/readiness")
                break
            except OSError:
                time.sleep(0.1)
        assert code == 503  # not ready before InSync and the first apply
        code, body = _get(netns, "http://127.0.0.1:9099/liveness")
        assert code == 200 and json.loads(body)["InternalDataplaneMainLoop"]["live"]
        c.send([to_dataplane(2, pb.InSync())])
        c.wait_in_sync(15)
        time.sleep(0.2)
        assert _get(netns, "http://127.0.0.1:9099/readiness")[0] == 200
        code, text = _get(netns, "http://127.0.0.1:9091/metrics")
        assert code == 200
        for name in ("felix_int_dataplane_apply_time_seconds_count", "\nfelix_int_dataplane_failures ",
                     'felix_int_dataplane_messages{type="IPSetRemove"} 1.0',
                     "felix_int_dataplane_msg_batch_size_count",
                     "felix_int_dataplane_initial_resync_time_seconds"):
            assert name in text, name
        c.close()
    finally:
        d.stop()
