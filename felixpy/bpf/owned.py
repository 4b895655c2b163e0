"""Recognising felixpy's BPF objects in the kernel after a restart.

Maps are ours when their kernel name starts ``cali_``, ``calico_`` or ``xdp_cali_`` (Felix's
prefixes) -- the name carries the layout version, e.g. ``cali_v4_ct4``.  Programs are ours when
their name is one of the C sub-programs (``calico_tc_main`` ..., kernel names are cut at 15
characters), a preamble (``cali_tc_preambl``, ``cali_xdp_preamb``), a log filter
(``calico_log_filt``) or a generated policy program (``p<4|6><i|e|x>_<hash>[_<part>]``).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

from felixpy.bpf import syscall as sc
from felixpy.bpf.build import PREAMBLE_FUNC, TC_SUBPROGS, XDP_SUBPROGS
from felixpy.bpf.errors import BPFSyscallError

MAP_PREFIXES = ("cali_", "calico_", "xdp_cali_")
_POLICY_RE = re.compile(r"^p[46][iex]_[0-9a-f]{8}(_\d+)?$")
_SUBPROG_NAMES = frozenset(n[:15] for n in (*TC_SUBPROGS.values(), *XDP_SUBPROGS.values(),
                                            *PREAMBLE_FUNC.values(), "calico_log_filter"))


def is_owned_map_name(name: str) -> bool:
    return name.startswith(MAP_PREFIXES)


def is_owned_prog_name(name: str) -> bool:
    return name in _SUBPROG_NAMES or bool(_POLICY_RE.match(name))


@dataclass(frozen=True, slots=True)
class OwnedProgram:
    id: int
    name: str
    kind: str  # "generic" / "policy"


def list_owned_programs() -> list[OwnedProgram]:
    """Every loaded program that is ours (whoever holds it: a prog array, a link, a filter)."""
    out: list[OwnedProgram] = []
    pid = 0
    while True:
        nxt = sc.prog_get_next_id(pid)
        if nxt is None:
            return out
        pid = nxt
        try:
            fd = sc.prog_get_fd_by_id(pid)
        except BPFSyscallError:
            continue  # gone meanwhile
        try:
            info = sc.prog_info(fd)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        if is_owned_prog_name(info.name):
            out.append(OwnedProgram(info.id, info.name,
                                    "policy" if _POLICY_RE.match(info.name) else "generic"))
