"""Which cleanup-only drivers each mode registers (Felix's cleanup tables and CleanUpProgramsAndPins)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from felixpy.config import Config
from felixpy.dataplane.wiring import KernelDeps, _default_cleanups


def kinds(config: Config, v: int, backend: str) -> list[str]:
    return [f"{type(d).__name__}:{getattr(d, 'name', '')}" for d in _default_cleanups(KernelDeps())(config, v, backend)]


@pytest.mark.parametrize("backend", ["legacy", "nft", "nftables"])
def test_tables_modes_clean_up_bpf_mode_once_per_node(backend: str) -> None:
    cfg = Config()
    assert kinds(cfg, 4, backend).count("BPFCleanup:bpf") == 1
    assert "BPFCleanup:bpf" not in kinds(cfg, 6, backend)  # node-level: registered with one family


@pytest.mark.parametrize("backend", ["legacy", "nft", "nftables"])
def test_bpf_mode_cleans_the_other_backends_but_not_itself(backend: str) -> None:
    cfg = replace(Config(), BPFEnabled=True)
    for v in (4, 6):
        got = kinds(cfg, v, backend)
        assert "BPFCleanup:bpf" not in got
        # Over iptables the filtered ipset driver owns the kernel ipsets (untracked egress policy's, the
        # rest swept by it); over nftables they are stale, as in nftables mode.
        assert ("IPSetsCleanup:ipsets" in got) == (backend == "nftables")
        assert ("NftablesTableCleanup:nftables" in got) == (backend != "nftables")
        assert sum(k.startswith("IptablesBackendCleanup") for k in got) == (2 if backend == "nftables" else 1)
