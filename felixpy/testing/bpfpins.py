"""Reading BPF pins back in tests: which TCX links are pinned, and what they run."""

from __future__ import annotations

import os

from felixpy.bpf import syscall as sc


def tcx_links(tcx_dir: str) -> dict[str, tuple[int, int]]:
    """TCX link pins in *tcx_dir*: pin name → (link id, program id); empty when the directory is absent."""
    out = {}
    for pin in sorted(os.listdir(tcx_dir)) if os.path.isdir(tcx_dir) else []:
        fd = sc.obj_get(os.path.join(tcx_dir, pin))
        try:
            _type, link_id, prog_id = sc.link_info(fd)
        finally:
            os.close(fd)
        out[pin] = (link_id, prog_id)
    return out
