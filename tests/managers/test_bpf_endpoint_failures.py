"""BPF mode over fakes, when programming fails: one endpoint's failure (a slot update, an attach, a full
``cali_iface``, the whole attach batch) leaves the others programmed, fails closed and is retried; and
how the failures are reported.  Same harness and assertions on resulting state as
``test_bpf_endpoints.py``."""

from __future__ import annotations

import errno

import pytest

from felixpy.bpf import defs
from felixpy.drivers.bpfendpoints.fake import FakeBPF
from .harness import policy, profile, rule, tier, wep
from .test_bpf_endpoints import allowed, ifstate, node, programmed


def _fail_slot(fb: FakeBPF) -> None:
    fb.map("cali_jump_egr2").fail_next_update = errno.ENOMEM  # the first endpoint programmed (cali1)


def _heal_slot(fb: FakeBPF) -> None:
    pass  # fail_next_update is one-shot


def _fail_load(fb: FakeBPF) -> None:
    fb.progs.fail_next_load = errno.ENOSPC  # cali1's first program (loaded ahead, on the loader thread)


def _fail_attach(fb: FakeBPF) -> None:
    fb.attacher.fail_ifaces.add("cali1")


def _heal_attach(fb: FakeBPF) -> None:
    fb.attacher.fail_ifaces.clear()


def _fill_ifstate(fb: FakeBPF) -> None:
    m = fb.map("cali_iface4")
    m.spec = m.spec.sized(1)  # room for cali2 (programmed first in this case) only


def _grow_ifstate(fb: FakeBPF) -> None:
    m = fb.map("cali_iface4")
    m.spec = m.spec.sized(1000)


@pytest.mark.parametrize(("fail", "heal", "victim"), [
    (_fail_slot, _heal_slot, "cali1"),
    (_fail_load, _heal_slot, "cali1"),
    (_fail_attach, _heal_attach, "cali1"),
    (_fill_ifstate, _grow_ifstate, None),
], ids=["slot-update-fails", "program-load-fails", "attach-fails", "ifstate-map-full"])
def test_one_endpoint_failing_leaves_the_others_programmed_and_is_retried(fail, heal, victim) -> None:  # type: ignore[no-untyped-def]
    n, fb = node()
    for name in ("cali1", "cali2"):
        n.link_up(name)
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]),
           wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"]))
    fail(fb)
    report = n.apply(expect_ok=False)
    assert not report.ok
    good = [i for i in ("cali1", "cali2") if programmed(n, fb, i)]
    bad = [i for i in ("cali1", "cali2") if i not in good]
    assert len(good) == 1 and len(bad) == 1
    if victim:
        assert bad == [victim]
    assert bad[0] not in allowed(n)  # fail closed: the *tables keep dropping it
    st = ifstate(fb, n.ifindex(bad[0]))
    assert st is None or not st.flags & defs.IFACE_STATE_V4_READY
    heal(fb)
    assert n.apply().ok
    assert all(programmed(n, fb, i) for i in ("cali1", "cali2"))
    assert sorted(allowed(n)) == ["cali1", "cali2"]


def test_an_attach_batch_failing_as_a_whole_retries_every_interface_in_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 5 runs once for all the apply's interfaces: if that call fails outright (a socket error),
    none of them is READY or admitted, and the next apply programs them all."""
    n, fb = node()
    for iface in ("cali1", "cali2"):
        n.link_up(iface)
    n.send(policy("p", inbound=[rule("allow")], outbound=[rule("allow")]),
           wep("a", "cali1", tiers=[tier(ingress=["p"], egress=["p"])]),
           wep("b", "cali2", tiers=[tier(ingress=["p"], egress=["p"])]))
    real = fb.attacher.attach_many
    calls = {"n": 0}

    def broken_once(requests, **kw):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.ENOBUFS, "socket overrun")
        return real(requests, **kw)
    monkeypatch.setattr(fb.attacher, "attach_many", broken_once)
    report = n.apply(expect_ok=False)
    assert not report.ok
    assert not programmed(n, fb, "cali1") and not programmed(n, fb, "cali2") and allowed(n) == []
    n.apply()
    assert programmed(n, fb, "cali1") and programmed(n, fb, "cali2")


def test_an_endpoint_failing_apply_after_apply_is_logged_once_per_error_not_per_retry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from felixpy.drivers.bpfendpoints import driver as drv

    logs: list[dict[str, object]] = []

    class Recorder:
        def __getattr__(self, level: str):  # type: ignore[no-untyped-def]
            return lambda event, **kw: logs.append({"event": event, **kw})

    @contextlib.contextmanager
    def capture_logs():  # type: ignore[no-untyped-def]
        monkeypatch.setattr(drv, "log", Recorder())
        yield logs

    n, fb = node()
    for name in ("cali1", "cali2"):
        n.link_up(name)
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]),
           wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"]))
    fb.attacher.fail_ifaces.add("cali1")
    with capture_logs() as logs:
        for _ in range(3):
            report = n.apply(expect_ok=False)
            assert not report.ok
        fb.attacher.fail_ifaces.discard("cali1")
        assert n.apply().ok
    warned = [e for e in logs if e["event"] == "BPF endpoint not programmed; will retry"]
    assert [e["iface"] for e in warned] == ["cali1"]  # three failed applies, one warning
    assert [e["iface"] for e in logs if e["event"] == "BPF endpoint programmed after earlier failures"] == ["cali1"]
    assert programmed(n, fb, "cali1") and programmed(n, fb, "cali2")


def test_the_failure_message_names_a_few_interfaces_and_counts_the_rest() -> None:
    from felixpy.drivers.bpfendpoints.driver import EndpointProgrammingFailed

    e = EndpointProgrammingFailed({f"cali{i:04d}": OSError(7, "E2BIG") for i in range(3000)})
    text = str(e)
    assert text.startswith("3000 BPF endpoint(s) not programmed (cali0000: OSError")
    assert text.endswith("and 2995 more)") and len(text) < 500 and len(e.failures) == 3000
