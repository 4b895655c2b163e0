"""The kernel's program tag, computed from instructions before they are loaded.

The kernel tags every program it loads with the first 8 bytes of a digest of its instructions as
user space gave them, with the map fds of ``ld_imm64`` map loads zeroed (fds differ between
processes; the maps are compared separately, by id).  Kernels up to 6.17 take SHA-1, later ones
SHA-256; both are accepted, so the check holds across a kernel upgrade of a running node.

Why: a restarted daemon finds the previous run's policy programs in the slots it reclaims.  When a
slot's program has the tag of the instructions this process would load, and references the same
maps, it *is* that program, and the slot is taken over without loading (the verifier is most of a
policy program's cost) and without a write (:meth:`felixpy.bpf.policyload.PolicyPrograms.adopt`).
"""

from __future__ import annotations

import hashlib

TAG_SIZE = 8
_INSN = 8
_LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW
_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE = 1, 2


def masked(insns: bytes) -> bytes:
    """``insns`` with the two ``imm`` halves of every map-fd ``ld_imm64`` zeroed, as the kernel hashes
    them (the second half is zeroed only when it looks like one: code, registers and offset all 0)."""
    out = bytearray(insns)
    in_map_load = False
    for i in range(0, len(out), _INSN):
        if not in_map_load and out[i] == _LD_IMM64 and out[i + 1] >> 4 in (_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE):
            in_map_load = True
            out[i + 4:i + 8] = bytes(4)
        elif in_map_load and not any(out[i:i + 4]):
            in_map_load = False
            out[i + 4:i + 8] = bytes(4)
        else:
            in_map_load = False
    return bytes(out)


def tags(insns: bytes) -> frozenset[bytes]:
    """The tags a kernel may give ``insns``: SHA-256's (6.18 on) and SHA-1's (before)."""
    m = masked(insns)
    return frozenset({hashlib.sha256(m).digest()[:TAG_SIZE], hashlib.sha1(m).digest()[:TAG_SIZE]})


def map_fds(insns: bytes) -> frozenset[int]:
    """The map fds ``insns`` load (``ld_imm64`` with a map-fd source)."""
    fds = set()
    for i in range(0, len(insns) - _INSN + 1, _INSN):
        if insns[i] == _LD_IMM64 and insns[i + 1] >> 4 in (_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE):
            fds.add(int.from_bytes(insns[i + 4:i + 8], "little", signed=True))
    return frozenset(fds)
