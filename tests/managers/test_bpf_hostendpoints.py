"""Host endpoints in BPF mode over fakes: the daemon's own wiring, the real BPF endpoint manager and
driver, in-memory maps and a fake attach layer.  Asserts what the kernel holds: which host
interfaces carry our preambles, what policy each hook's slot enforces, ``cali_iface`` flags, and
what a restart keeps, re-attaches or sweeps."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import pytest

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.policy_ir import PolicySet
from felixpy.config import Config
from felixpy.drivers.bpfendpoints.fake import FakeBPF, fake_kernel
from felixpy.proto import felixbackend_pb2 as pb
from .harness import Node, policy, profile, rule, tier, wep
from .test_bpf_endpoints import EGR, ING, entries, ifstate, programmed

BPF_CONFIG = replace(Config(), BPFEnabled=True)
DENY_ALL_TIERS = [tier("default", ingress=["deny-all"], egress=["deny-all"])]


def hep(hid: str, name: str = "", *, v4: tuple[str, ...] = (), v6: tuple[str, ...] = (),
        tiers: list[pb.TierInfo] | None = None, profiles: tuple[str, ...] = (),
        untracked: list[pb.TierInfo] | None = None, forward: list[pb.TierInfo] | None = None,
        pre_dnat: list[pb.TierInfo] | None = None) -> pb.HostEndpointUpdate:
    return pb.HostEndpointUpdate(id=pb.HostEndpointID(endpoint_id=hid), endpoint=pb.HostEndpoint(
        name=name, expected_ipv4_addrs=list(v4), expected_ipv6_addrs=list(v6), tiers=tiers or [],
        untracked_tiers=untracked or [], forward_tiers=forward or [], pre_dnat_tiers=pre_dnat or [],
        profile_ids=list(profiles)))


def hep_remove(hid: str) -> pb.HostEndpointRemove:
    return pb.HostEndpointRemove(id=pb.HostEndpointID(endpoint_id=hid))


def node(families: tuple[int, ...] = (4,), bpf: FakeBPF | None = None, n1: Node | None = None,
         config: Config = BPF_CONFIG) -> tuple[Node, FakeBPF]:
    fb = bpf or fake_kernel()
    n = Node(families=families, config=config, bpf=fb, netlink_fake=n1.netlink if n1 else None)
    for name, addrs in (("eth0", ("10.98.0.1", "fd00:98::1")), ("eth1", ("10.97.0.1", "fd00:97::1")),
                        ("lo", ("127.0.0.1",)), ("dummy0", ())):
        n.link_up(name)
        n.addrs(name, *addrs)
    n.link_up("cali1")
    n.send(profile("allow"), policy("deny-all", inbound=[rule("deny")], outbound=[rule("deny")]),
           policy("allow-all", inbound=[rule()], outbound=[rule()]),
           wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00:65::2/128"], profiles=["allow"]))
    return n, fb


def hep_ifaces(fb: FakeBPF) -> set[str]:
    """Host interfaces carrying our preamble on both TC hooks."""
    out = set()
    for (idx, hook), _fd in fb.attacher.attached.items():
        name = fb.attacher.names[idx]
        if hook == ING and (idx, EGR) in fb.attacher.attached and not name.startswith("cali"):
            out.add(name)
    return out


def slot_policy(n: Node, fb: FakeBPF, iface: str, hook: int, v: int = 4) -> PolicySet:
    tc_ing, tc_egr = entries(fb, n.ifindex(iface), v)
    prog = fb.kernel.policies.installed(hook, tc_ing if hook == ING else tc_egr)
    assert prog is not None
    ps = prog.key[0]
    assert isinstance(ps, PolicySet)
    return ps


def slot_empty(n: Node, fb: FakeBPF, iface: str, hook: int, v: int = 4) -> bool:
    """The hook's policy slot holds nothing (a data interface no host endpoint covers: allow)."""
    tc_ing, tc_egr = entries(fb, n.ifindex(iface), v)
    entry = tc_ing if hook == ING else tc_egr
    return fb.kernel.policies.installed(hook, entry) is None and \
        fb.kernel.maps.jumps(hook).get(ctypes.c_uint32(entry)) is None


def flags(n: Node, fb: FakeBPF, iface: str) -> int:
    st = ifstate(fb, n.ifindex(iface))
    assert st is not None
    return int(st.flags)


def test_named_hep_gets_programs_with_its_policy_per_direction_and_other_data_interfaces_allow() -> None:
    n, fb = node()
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n.apply()
    # Every data interface carries the programs (Felix's applyPolicyToDataIface); lo and dummy0 do not
    # match BPFDataIfacePattern.
    assert hep_ifaces(fb) == {"eth0", "eth1"}
    assert flags(n, fb, "eth0") == defs.IFACE_STATE_HEP | defs.IFACE_STATE_V4_READY
    assert flags(n, fb, "eth1") == defs.IFACE_STATE_HEP | defs.IFACE_STATE_V4_READY
    assert slot_empty(n, fb, "eth1", ING) and slot_empty(n, fb, "eth1", EGR)
    ing, egr = slot_policy(n, fb, "eth0", ING), slot_policy(n, fb, "eth0", EGR)
    for ps in (ing, egr):
        assert ps.for_host_interface and not ps.suppress_normal_host_policy
        assert [len(t.policies) for t in ps.host_normal_tiers] == [1]
    assert ing.host_normal_tiers[0].policies[0].rules[0].action.value == "deny"
    assert programmed(n, fb, "cali1")  # workloads unaffected
    assert not n.dp.unsupported


def test_hep_without_policy_denies_host_traffic_and_removal_swaps_back_to_allow() -> None:
    n, fb = node()
    n.send(hep("eth0-hep", "eth0"))
    n.apply()
    ps = slot_policy(n, fb, "eth0", ING)
    # No tiers, no profiles: the program's end-of-profiles drop denies everything but the failsafes
    # (which the main program checks before policy).
    assert ps == PolicySet(for_host_interface=True, suppress_normal_host_policy=False)
    idx = n.ifindex("eth0")
    before, calls = entries(fb, idx), fb.attacher.attach_calls
    n.send(hep_remove("eth0-hep"))
    n.apply()
    # Still a data interface: its programs stay (no re-attach) and allow again.
    assert fb.attacher.attach_calls == calls and entries(fb, idx) == before
    assert slot_empty(n, fb, "eth0", ING) and slot_empty(n, fb, "eth0", EGR)
    assert flags(n, fb, "eth0") == defs.IFACE_STATE_HEP | defs.IFACE_STATE_V4_READY
    assert programmed(n, fb, "cali1")


def test_wildcard_covers_every_data_interface_and_a_specific_hep_wins() -> None:
    n, fb = node()
    n.send(hep("all", "*", tiers=DENY_ALL_TIERS))
    n.apply()
    # lo and dummy0 do not match BPFDataIfacePattern; workloads are not host endpoints.
    assert hep_ifaces(fb) == {"eth0", "eth1"}
    n.send(hep("eth1", "eth1", tiers=[tier("default", ingress=["allow-all"], egress=["allow-all"])]))
    n.apply()
    assert hep_ifaces(fb) == {"eth0", "eth1"}
    assert slot_policy(n, fb, "eth1", ING).host_normal_tiers[0].policies[0].rules[0].action.value == "allow"
    assert slot_policy(n, fb, "eth0", ING).host_normal_tiers[0].policies[0].rules[0].action.value == "deny"


def test_hep_by_expected_ip_follows_the_address() -> None:
    n, fb = node()
    n.send(hep("by-ip", v4=("10.98.1.1",), tiers=DENY_ALL_TIERS))
    n.apply()
    def holder() -> set[str]:
        return {i for i in ("eth0", "eth1") if not slot_empty(n, fb, i, ING)}
    assert holder() == set()  # nobody holds it yet
    n.addrs("eth0", "10.98.0.1", "fd00:98::1", "10.98.1.1")
    n.apply()
    assert holder() == {"eth0"}
    n.addrs("eth0", "10.98.0.1", "fd00:98::1")
    n.addrs("eth1", "10.97.0.1", "fd00:97::1", "10.98.1.1/32")
    n.apply()
    assert holder() == {"eth1"} and hep_ifaces(fb) == {"eth0", "eth1"}


def test_interfaces_outside_bpf_data_iface_pattern_get_no_programs() -> None:
    n, fb = node(config=replace(BPF_CONFIG, BPFDataIfacePattern="^eth1$"))
    n.send(hep("all", "*", tiers=DENY_ALL_TIERS), hep("d", "dummy0", tiers=DENY_ALL_TIERS))
    n.apply()
    assert hep_ifaces(fb) == {"eth1"}


def test_one_heps_attach_failure_leaves_the_others_programmed_and_is_retried() -> None:
    n, fb = node()
    fb.attacher.fail_ifaces.add("eth0")
    n.send(hep("all", "*", tiers=DENY_ALL_TIERS))
    report = n.apply(expect_ok=False)
    assert not report.ok
    assert hep_ifaces(fb) == {"eth1"} and programmed(n, fb, "cali1")
    st = ifstate(fb, n.ifindex("eth0"))
    assert st is None or not st.flags & defs.IFACE_STATE_V4_READY
    fb.attacher.fail_ifaces.clear()
    n.apply()
    assert hep_ifaces(fb) == {"eth0", "eth1"}


def test_policy_change_swaps_the_hep_program_without_reattach() -> None:
    n, fb = node()
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n.apply()
    calls = fb.attacher.attach_calls
    before = entries(fb, n.ifindex("eth0"))
    n.send(policy("deny-all", inbound=[rule("deny", protocol="tcp")], outbound=[rule("deny")]))
    n.apply()
    assert fb.attacher.attach_calls == calls and entries(fb, n.ifindex("eth0")) == before
    assert slot_policy(n, fb, "eth0", ING).host_normal_tiers[0].policies[0].rules[0].protocol == 6


def test_ipv6_family_is_programmed_too() -> None:
    n, fb = node(families=(4, 6))
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n.apply()
    assert flags(n, fb, "eth0") == defs.IFACE_STATE_HEP | defs.IFACE_STATE_V4_READY | defs.IFACE_STATE_V6_READY
    assert slot_policy(n, fb, "eth0", ING, 6).host_normal_tiers
    n.send(hep_remove("eth0-hep"))
    n.apply()
    assert slot_empty(n, fb, "eth0", ING, 6) and slot_empty(n, fb, "eth0", EGR, 6)
    assert flags(n, fb, "eth0") == defs.IFACE_STATE_HEP | defs.IFACE_STATE_V4_READY | defs.IFACE_STATE_V6_READY


def _restart(n1: Node, fb1: FakeBPF, *msgs: object) -> tuple[Node, FakeBPF]:
    n, fb = node(bpf=fb1.restarted(), n1=n1)
    n.send(*msgs)
    return n, fb


def test_restart_with_the_same_feed_reclaims_and_reattaches_nothing() -> None:
    n1, fb1 = node(families=(4, 6))
    n1.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n1.apply()
    idx = n1.ifindex("eth0")
    before = (dict(fb1.attacher.attached), entries(fb1, idx, 4), entries(fb1, idx, 6))
    n, fb = node(families=(4, 6), bpf=fb1.restarted(), n1=n1)
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    calls = fb.attacher.attach_calls
    n.apply()
    assert fb.attacher.attach_calls == calls  # the same preamble stays attached
    assert (dict(fb.attacher.attached), entries(fb, idx, 4), entries(fb, idx, 6)) == before
    assert slot_policy(n, fb, "eth0", ING).host_normal_tiers


def test_restart_sweeps_interfaces_that_are_no_longer_data_interfaces() -> None:
    n1, fb1 = node()
    n1.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n1.apply()
    idx = n1.ifindex("eth0")
    tc_ing, _ = entries(fb1, idx)
    n, fb = node(bpf=fb1.restarted(), n1=n1, config=replace(BPF_CONFIG, BPFDataIfacePattern="^eth1$"))
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n.apply()
    assert hep_ifaces(fb) == {"eth1"}
    assert not fb.attacher.is_attached("eth0", idx, ING) and not fb.attacher.is_attached("eth0", idx, EGR)
    assert flags(n, fb, "eth0") == defs.IFACE_STATE_NOT_MANAGED
    assert fb.kernel.maps.jumps(ING).get(ctypes.c_uint32(tc_ing)) is None  # its policy entry freed
    assert programmed(n, fb, "cali1")


def test_restart_without_the_hep_keeps_the_attachment_and_allows() -> None:
    n1, fb1 = node()
    n1.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n1.apply()
    idx = n1.ifindex("eth0")
    attached = dict(fb1.attacher.attached)
    n, fb = _restart(n1, fb1)
    calls = fb.attacher.attach_calls
    n.apply()
    assert fb.attacher.attach_calls == calls and dict(fb.attacher.attached) == attached
    assert slot_empty(n, fb, "eth0", ING) and slot_empty(n, fb, "eth0", EGR)
    assert flags(n, fb, "eth0") == defs.IFACE_STATE_HEP | defs.IFACE_STATE_V4_READY
    assert idx == n.ifindex("eth0")


def test_unsupported_features_are_reported_by_name_and_the_rest_is_programmed() -> None:
    n, fb = node(config=replace(BPF_CONFIG, FloatingIPs="Enabled"))
    ut = policy("ut", inbound=[rule()], untracked=True)
    w = wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"])
    w.endpoint.ipv4_nat.append(pb.NatInfo(ext_ip="10.96.5.5", int_ip="10.65.0.2"))
    n.send(ut, w, hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS, untracked=[tier("default", ingress=["ut"])]),
           pb.GlobalBGPConfigUpdate(service_cluster_cidrs=["10.96.128.0/24"]))
    n.apply()
    # Untracked policy is programmed in BPF mode now (XDP + raw OUTPUT): only floating IPs are refused.
    assert set(n.dp.unsupported) == {"floating IPs in BPF mode"}
    assert "projectcalico/calico#5251" in n.dp.unsupported["floating IPs in BPF mode"]
    assert hep_ifaces(fb) == {"eth0", "eth1"} and programmed(n, fb, "cali1")
    assert slot_policy(n, fb, "eth0", ING).host_normal_tiers  # normal policy still enforced
    assert n.ifindex("eth0") in fb.xdp.attached


def test_host_endpoint_dscp_reaches_its_tc_egress_globals() -> None:
    """A HEP's QoS DSCP goes into its interface's TC egress globals (what the host sends out through
    it), both families; the workload's into its TC ingress; nothing is reported unsupported, and the
    HEP's policy is programmed as without it."""
    n, fb = node(families=(4, 6))
    n.apply()
    h = hep("eth0-hep", "eth0", v4=("10.99.0.1",), tiers=DENY_ALL_TIERS)
    h.endpoint.qos_policies.append(pb.QoSPolicy(destination="external", dscp=26))
    n.send(h, wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00:65::2/128"], profiles=["allow"], dscp=46))
    n.apply()
    assert not n.dp.unsupported

    def dscp(iface: str, hook: int) -> tuple[int, int]:
        g = fb.kernel.maps.ap_globals.get(mt.ApKey(n.ifindex(iface), hook))
        return g.v4.dscp, g.v6.dscp

    assert (dscp("eth0", EGR), dscp("eth0", ING)) == ((26, 26), (-1, -1))
    assert (dscp("cali1", ING), dscp("cali1", EGR)) == ((46, 46), (-1, -1))
    assert (dscp("eth1", EGR), dscp("eth1", ING)) == ((-1, -1), (-1, -1))  # no HEP: no DSCP
    assert programmed(n, fb, "cali1") and slot_policy(n, fb, "eth0", ING).host_normal_tiers
    h.endpoint.ClearField("qos_policies")
    n.send(h)
    n.apply()
    assert dscp("eth0", EGR) == (-1, -1)


def test_hep_status_is_reported_in_bpf_mode() -> None:
    n, fb = node()
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS), hep("ghost", "eth9"))
    n.apply()
    assert n.host_status == {"eth0-hep": "up", "ghost": "error"}


def test_wildcard_pre_dnat_and_forward_tiers_reach_workload_programs_in_the_inverse_direction() -> None:
    n, fb = node()
    n.apply()
    wl_in, wl_out = slot_policy(n, fb, "cali1", ING), slot_policy(n, fb, "cali1", EGR)
    # A '*' HEP with normal policy only: the workload's programs stay as they were (suppressed there).
    n.send(hep("all", "*", tiers=DENY_ALL_TIERS))
    n.apply()
    assert (slot_policy(n, fb, "cali1", ING), slot_policy(n, fb, "cali1", EGR)) == (wl_in, wl_out)
    n.send(policy("fwd", inbound=[rule("deny", protocol="udp")], outbound=[rule("deny", protocol="tcp")]),
           policy("pd", inbound=[rule("deny", protocol="sctp")], pre_dnat=True),
           hep("all", "*", tiers=DENY_ALL_TIERS, forward=[tier("default", ingress=["fwd"], egress=["fwd"])],
               pre_dnat=[tier("default", ingress=["pd"])]))
    n.apply()
    from_wl, to_wl = slot_policy(n, fb, "cali1", ING), slot_policy(n, fb, "cali1", EGR)
    # From the workload (TC ingress): the HEP's ingress side -- its pre-DNAT and inbound forward rules.
    assert from_wl.host_forward_tiers[0].policies[0].rules[0].protocol == 17
    assert from_wl.host_pre_dnat_tiers[0].policies[0].rules[0].protocol == 132
    # To the workload (TC egress): the HEP's egress side -- outbound forward rules, no pre-DNAT.
    assert to_wl.host_forward_tiers[0].policies[0].rules[0].protocol == 6 and not to_wl.host_pre_dnat_tiers
    assert from_wl.suppress_normal_host_policy and to_wl.suppress_normal_host_policy
    assert not from_wl.host_normal_tiers and not from_wl.for_host_interface
    assert from_wl.profiles == wl_out.profiles  # the workload's own policy is still there
    # A change of a policy only the '*' HEP uses reaches the workload programs too.
    n.send(policy("fwd", inbound=[rule("deny", protocol="icmp")], outbound=[rule("deny", protocol="tcp")]))
    n.apply()
    assert slot_policy(n, fb, "cali1", ING).host_forward_tiers[0].policies[0].rules[0].protocol == 1
    n.send(hep_remove("all"))
    n.apply()
    assert (slot_policy(n, fb, "cali1", ING), slot_policy(n, fb, "cali1", EGR)) == (wl_in, wl_out)


def test_hep_interface_down_then_gone_leaves_no_cali_iface_entry() -> None:
    n, fb = node()
    n.apply()
    idx = n.ifindex("eth0")
    assert flags(n, fb, "eth0") == defs.IFACE_STATE_HEP | defs.IFACE_STATE_V4_READY
    n.link_down("eth0")
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n.apply()
    assert not fb.attacher.is_attached("eth0", idx, ING)  # programs only on an interface that is up
    assert flags(n, fb, "eth0") == defs.IFACE_STATE_NOT_MANAGED
    n.link_up("eth0")
    n.apply()
    assert hep_ifaces(fb) == {"eth0", "eth1"}
    n.link_down("eth0")
    n.apply()
    assert hep_ifaces(fb) == {"eth1"} and flags(n, fb, "eth0") == defs.IFACE_STATE_NOT_MANAGED
    n.link_gone("eth0")
    n.apply()
    assert ifstate(fb, idx) is None
