"""Restart into a different world, per mode, IPv4 and IPv6 at once (see :mod:`fv.chaos.worlds`).

The reference is the node's very first start of day with datastore B (a clean kernel).  Then the daemon
is stopped, started with the unrelated datastore A (endpoints, policies, IP sets, a host endpoint, VXLAN
with another VNI, remote VTEP and block), stopped, and started with B again: the kernel must come back to
exactly the reference — not one chain, rule, set, member, route, ip rule, FDB or neighbour entry or device
of A left, nothing of B missing — and B's policy must hold (b denies a, a → c passes).  In the BPF modes
the dump includes the BPF maps, ``cali_iface`` and the TCX link pins (:func:`fv.chaos.kill9.bpf_dump`).

``CHAOS_ENDPOINTS`` (default 100) synthetic endpoints per world.
"""

from __future__ import annotations

import os

import pytest

from fv.chaos.worlds import WorldNode, converge, full_dump, full_world, only_in, settled_dump, world_config
from fv.expect import ICMP, TCP, Expect
from fv.harness import BPF_MODES, HOST, MODES

pytestmark = pytest.mark.fv

ENDPOINTS = int(os.environ.get("CHAOS_ENDPOINTS", "100"))


@pytest.mark.parametrize("mode", [*MODES, *BPF_MODES])
def test_restart_into_an_unrelated_world_leaves_nothing_of_the_old_one(mode: str) -> None:
    a, b = full_world("x", ENDPOINTS), full_world("y", ENDPOINTS)
    node = WorldNode.create(mode)
    try:
        node.apply(b, config=world_config("y"))           # first start of day on a fresh kernel
        reference = settled_dump(node)
        assert any("vxlan.calico" in ln and '"id": 4097' in ln for ln in reference["vxlan devices"]), reference
        node.stop_daemon()

        node.apply(a, config=world_config("x"))           # restart into A
        in_a = settled_dump(node)
        own_a = only_in(in_a, reference)
        # A really had its own objects of every kind, or "none left" below would prove nothing.
        bpf = mode in BPF_MODES
        want_kinds = {"sets": "bpf cali_v4_ip_sets" if bpf else "ipsets" if mode != "nftables" else "nft ip calico",
                      "routes v4": "routes v4", "routes v6": "routes v6",
                      "fdb": "fdb vxlan.calico", "fdb v6": "fdb vxlan-v6.calico",
                      "neigh": "neigh vxlan.calico", "devices": "vxlan devices"}
        if bpf:
            want_kinds.update({"sets v6": "bpf cali_v6_ip_sets", "BPF routes": "bpf cali_v4_routes",
                               "BPF routes v6": "bpf cali_v6_routes"})
        missing = [k for k, key in want_kinds.items() if not own_a.get(key)]
        assert not missing, f"[{mode}] world A programmed nothing of its own for {missing}"
        if bpf:
            # eth0 is a data interface in both worlds (programs attached, a cali_iface entry); A's host
            # endpoint is its policy programs, which fill the slots B leaves empty.
            assert any(ln.startswith("eth0 ") for ln in in_a.get("bpf cali_iface4", [])), \
                f"[{mode}] no data interface entry in cali_iface"
            assert any(ln.startswith("eth0_") for ln in in_a.get("bpf tcx pins", [])), f"[{mode}] no eth0 links"
            assert own_a.get("bpf cali_jump_ing2") and own_a.get("bpf cali_jump_egr2"), \
                f"[{mode}] the host endpoint's programs are not in eth0's policy slots"
        else:
            hep_chain = "cali-th-eth0"
            assert any(hep_chain in ln for lines in own_a.values() for ln in lines), f"[{mode}] no host endpoint chain"
        node.stop_daemon()

        node.apply(b, config=world_config("y"))           # restart into B again
        # Unwanted IP sets go one per apply in iptables modes (Felix's MaxIPSetDeletionsPerIteration): allow
        # for a slow shared machine.
        diff, took = converge(node, reference, timeout=60 + 0.6 * ENDPOINTS)
        final = full_dump(node)
        left = {k: v for k, v in only_in(final, reference).items() if k in own_a}
        left = {k: [ln for ln in v if ln in set(own_a[k])] for k, v in left.items()}
        left = {k: v for k, v in left.items() if v}
        assert not left, f"[{mode}] objects of world A left after the restart into B:\n" + "\n".join(
            f"{k}: {ln}" for k, v in left.items() for ln in v[:10])
        assert not diff, f"[{mode}] after {took:.1f}s the kernel still differs from a clean start with B:\n" + \
            "\n".join(diff)
        print(f"[{mode}] A → B at {ENDPOINTS} endpoints: A had {sum(map(len, own_a.values()))} own lines; "
              f"equal to a clean start with B {took:.2f}s after B's InSync")
        for v in (4, 6):
            node.check(v, Expect(True).block(src="a", dst="b"), (TCP, ICMP), names=[HOST, "a", "b", "c"],
                       what="world B after A")
    finally:
        node.close()
