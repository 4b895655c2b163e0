"""Recognising our kernel objects by name, and the bpffs helpers."""

from __future__ import annotations

import os
import tempfile

import pytest

from felixpy.bpf import defs, maps, owned
from felixpy.bpf.policy_ir import ALLOW_ALL

from .conftest import BPFTestEnv


def test_names() -> None:
    for n in ("cali_v4_ct4", "cali_iface4", "xdp_cali_progs3", "calico_foo"):
        assert owned.is_owned_map_name(n)
    assert not owned.is_owned_map_name("maps.debug")
    for n in ("calico_tc_main", "calico_tc_skb_a", "cali_tc_preambl", "cali_xdp_preamb",
              "calico_xdp_main", "p4i_0123abcd", "p6x_0123abcd_3", "calico_log_filt"):
        assert owned.is_owned_prog_name(n), n
    for n in ("p4i_xyz", "cls_ingress", "p4q_0123abcd"):
        assert not owned.is_owned_prog_name(n), n


@pytest.mark.bpf
def test_loaded_programs_are_listed_as_ours(env: BPFTestEnv) -> None:
    env.attach_point(defs.HOOK_TC_INGRESS, policy=ALLOW_ALL)
    env.programs.preamble_fd(defs.HOOK_TC_INGRESS)
    progs = owned.list_owned_programs()
    names = {p.name for p in progs}
    assert {"calico_tc_main", "cali_tc_preambl"} <= names
    assert any(p.kind == "policy" for p in progs)


@pytest.mark.kernel
def test_ensure_pin_root_mounts_bpffs_when_absent() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    d = tempfile.mkdtemp(prefix="felixpy-pinroot-")
    try:
        assert not maps.is_bpffs(d)
        root = os.path.join(d, "tc", "globals")
        maps.ensure_pin_root(root, bpffs_mount=d)
        assert maps.is_bpffs(d) and os.path.isdir(root)
        maps.ensure_pin_root(root, bpffs_mount=d)  # idempotent: no second mount
        ms = maps.MapSet(root, sizes={"cali_v4_ct4": 16, "cali_v6_ct4": 16}).ensure()
        assert os.path.exists(os.path.join(root, "cali_jump_ing2"))
        ms.close()
    finally:
        maps.unmount(d)
        os.rmdir(d)
