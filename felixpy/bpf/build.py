"""Compiling and loading the C programs in ``bpf-gpl/`` with bcc.

A :class:`Variant` is Felix's "AttachType": the tuple of compile-time choices (program file,
kernel hook, endpoint type, IP family, log level).  :func:`load_variant` compiles a variant with
bcc (clang 14 in-process) and loads each of its sub-programs, at most once per process: the
result is cached by (source, cflags).  Compiling costs ~0.2-1 s and ~150 MiB of LLVM; see
``docs/bpf.md`` for how the daemon keeps that out of its steady state (compile in a short-lived
worker, :mod:`felixpy.bpf.worker`).

Kernel headers: bcc needs a kernel source tree; Debian splits its headers package in two, so a
merged symlink tree is built by ``scripts/bcc-headers.sh`` and handed to bcc through
``BCC_KERNEL_SOURCE`` (set here, before the first ``BPF()``).
"""

from __future__ import annotations

import enum
import errno
import functools
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from felixpy.bpf import defs
from felixpy.bpf.errors import CompileError

log = structlog.get_logger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
BPF_SRC_DIR = Path(os.environ.get("FELIXPY_BPF_SRC", REPO_ROOT / "bpf-gpl"))
DEFAULT_HEADERS = "/var/cache/felixpy/bcc-headers"


class EpType(enum.Enum):
    WEP = "wep"
    HEP = "hep"


class Program(enum.Enum):
    TC = "tc"
    TC_PREAMBLE = "tc_preamble"
    XDP = "xdp"
    XDP_PREAMBLE = "xdp_preamble"


# Sub-programs of each object, by logical jump index (Felix's tcSubProgNames/xdpSubProgNames).
TC_SUBPROGS: dict[defs.ProgIndex, str] = {
    defs.ProgIndex.MAIN: "calico_tc_main",
    defs.ProgIndex.ALLOWED: "calico_tc_skb_accepted_entrypoint",
    defs.ProgIndex.DROP: "calico_tc_skb_drop",
    defs.ProgIndex.NEW_FLOW: "calico_tc_skb_new_flow_entrypoint",
}
XDP_SUBPROGS: dict[defs.ProgIndex, str] = {
    defs.ProgIndex.MAIN: "calico_xdp_main",
    defs.ProgIndex.ALLOWED: "calico_xdp_accepted_entrypoint",
    defs.ProgIndex.DROP: "calico_xdp_drop",
}
PREAMBLE_FUNC = {Program.TC_PREAMBLE: "cali_tc_preamble", Program.XDP_PREAMBLE: "cali_xdp_preamble"}


@dataclass(frozen=True, slots=True)
class Variant:
    program: Program
    hook: int = defs.HOOK_TC_INGRESS  # kernel hook: HOOK_TC_INGRESS / _EGRESS / HOOK_XDP
    ep: EpType = EpType.WEP
    ipv6: bool = False
    debug: bool = False

    def __post_init__(self) -> None:
        xdp = self.program in (Program.XDP, Program.XDP_PREAMBLE)
        if xdp != (self.hook == defs.HOOK_XDP):
            raise ValueError(f"{self.program} cannot attach to hook {self.hook}")

    @property
    def is_xdp(self) -> bool:
        return self.hook == defs.HOOK_XDP

    @property
    def compile_flags(self) -> int:
        """CALI_COMPILE_FLAGS, as Felix's calculate-flags derives them from the object name."""
        f = 0
        if self.is_xdp:
            f |= defs.XDP_PROG | defs.TC_HOST_EP | defs.TC_INGRESS
        else:
            if self.ep is EpType.HEP:
                f |= defs.TC_HOST_EP
            # INGRESS is the *policy* direction: to-WEP (kernel egress) and from-HEP (kernel
            # ingress).
            to_host = self.hook == defs.HOOK_TC_INGRESS
            if (self.ep is EpType.WEP and not to_host) or (self.ep is EpType.HEP and to_host):
                f |= defs.TC_INGRESS
        if self.program in (Program.TC_PREAMBLE, Program.XDP_PREAMBLE):
            f |= defs.TC_PREAMBLE
        return f

    @property
    def source(self) -> Path:
        return BPF_SRC_DIR / f"{self.program.value}.c"

    @property
    def subprogs(self) -> dict[defs.ProgIndex, str]:
        if self.program is Program.TC:
            return TC_SUBPROGS
        if self.program is Program.XDP:
            return XDP_SUBPROGS
        return {}

    @property
    def prog_type(self) -> int:
        from felixpy.bpf import syscall as sc

        return sc.PROG_TYPE_XDP if self.is_xdp else sc.PROG_TYPE_SCHED_CLS

    def cflags(self, pin_root: str) -> list[str]:
        flags = [
            f"-DCALI_COMPILE_FLAGS={self.compile_flags}",
            f"-DCALI_LOG_LEVEL={defs.LOG_LEVEL_DEBUG if self.debug else defs.LOG_LEVEL_OFF}",
            f'-DCALI_PIN_ROOT="{pin_root}"',
            "-Wno-unused-function",
            "-Wno-address-of-packed-member",
        ]
        if self.ipv6:
            flags.append("-DIPVER6")
        if self.program is Program.XDP and not xdp_metadata_supported():
            flags.append("-DCALI_XDP_NO_METADATA")
        return flags

    @property
    def label(self) -> str:
        """Felix-style object name, e.g. ``from_wep_debug_v6``."""
        if self.program in (Program.TC_PREAMBLE, Program.XDP_PREAMBLE):
            suffix = "" if self.is_xdp else (
                "_ingress" if self.hook == defs.HOOK_TC_INGRESS else "_egress")
            return str(self.program.value) + suffix
        if self.is_xdp:
            base = "xdp"
        else:
            to_host = self.hook == defs.HOOK_TC_INGRESS
            base = f"{'from' if to_host else 'to'}_{self.ep.value}"
        return f"{base}_{'debug' if self.debug else 'no_log'}{'_v6' if self.ipv6 else ''}"


XDP_METADATA_FEATURE = "BPF XDP metadata"
XDP_METADATA_DETAIL = ("this kernel refuses bpf_xdp_adjust_meta to XDP programs, so a packet a host endpoint's "
                       "untracked (doNotTrack) policy allows in XDP is not marked for TC: the TC program's "
                       "tracked policy and conntrack apply to it as to any other packet (stricter, never more open)")


@functools.cache
def xdp_metadata_supported() -> bool:
    """Probe: whether this kernel lets an XDP program call ``bpf_xdp_adjust_meta``, which the XDP program
    uses to tell the host endpoint's TC program that untracked policy accepted a packet.  Some kernels
    refuse the helper to every XDP program ("program of this type cannot use helper
    bpf_xdp_adjust_meta#54": seen on 6.18.44-fc-v1300); there the XDP program is built without it
    (``CALI_XDP_NO_METADATA``) and the endpoint driver reports the feature unsupported once.  The probe
    loads (and closes) a four-instruction program; a failure for any other reason counts as supported,
    so the real load reports it."""
    from felixpy.bpf import asm
    from felixpy.bpf import syscall as sc
    from felixpy.bpf.errors import BPFSyscallError

    prog = asm.Block()
    prog.mov64_imm(asm.R2, -4)  # (R1: the context, as the program is entered)
    prog.call(asm.FN_XDP_ADJUST_META)
    prog.mov64_imm(asm.R0, defs.XDP_PASS)
    prog.exit()
    try:
        fd = sc.prog_load(sc.PROG_TYPE_XDP, prog.assemble(), name="fpy_meta_probe", license="GPL",
                          expected_attach_type=sc.ATTACH_XDP)
    except BPFSyscallError as e:
        return not (e.errno == errno.EINVAL and "cannot use helper" in str(e))
    os.close(fd)
    return True


@dataclass
class Loaded:
    """A compiled, loaded variant: the bcc module (kept alive: it owns the program fds) and the
    fd of each function by name."""

    variant: Variant
    bpf: Any
    fds: dict[str, int]
    compile_seconds: float
    load_seconds: float

    def fd(self, func: str) -> int:
        return self.fds[func]


_cache: dict[tuple[str, tuple[str, ...]], Loaded] = {}
_lock = threading.Lock()
stats = {"compiles": 0, "cache_hits": 0}


def headers_dir() -> str:
    """Directory to use as BCC_KERNEL_SOURCE, building the merged tree if needed."""
    env = os.environ.get("BCC_KERNEL_SOURCE")
    if env:
        return env
    cand = os.environ.get("FELIXPY_BCC_HEADERS", DEFAULT_HEADERS)
    if os.path.isdir(os.path.join(cand, "include")):
        return cand
    script = REPO_ROOT / "scripts" / "bcc-headers.sh"
    out = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def expand_source(path: Path, _seen: set[Path] | None = None) -> str:
    """The C text of ``path`` with its local (quoted) includes spliced in, each file once.

    bcc only rewrites map method calls (``m.lookup()``, ``m.call()``) in the main file it is
    given, yet the programs keep Felix's layout of logic in per-concern headers.  Splicing the
    headers into one text keeps both; ``#line`` markers keep diagnostics pointing at the real
    files."""
    seen = _seen if _seen is not None else set()
    path = path.resolve()
    if path in seen:
        return ""
    seen.add(path)
    out: list[str] = [f'#line 1 "{path}"']
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        m = _INCLUDE_RE.match(line)
        if m and (path.parent / m.group(1)).exists():
            out.append(expand_source(path.parent / m.group(1), seen))
            out.append(f'#line {lineno + 1} "{path}"')
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def load_variant(variant: Variant, pin_root: str) -> Loaded:
    """Compile (once per process per cflags) and load every sub-program of ``variant``."""
    cflags = variant.cflags(pin_root)
    key = (str(variant.source), tuple(cflags))
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            stats["cache_hits"] += 1
            return hit
        os.environ["BCC_KERNEL_SOURCE"] = headers_dir()
        from bcc import BPF  # type: ignore[import-untyped]  # deferred: importing bcc maps libbcc (and LLVM) into the process

        t0 = time.perf_counter()
        try:
            b = BPF(text=expand_source(variant.source).encode(), cflags=cflags)
        except Exception as e:  # bcc raises bare Exception
            raise CompileError(f"compiling {variant.label}: {e}") from e
        t1 = time.perf_counter()
        funcs = list(variant.subprogs.values()) or [PREAMBLE_FUNC[variant.program]]
        fds: dict[str, int] = {}
        for name in funcs:
            try:
                fds[name] = b.load_func(name.encode(), variant.prog_type).fd
            except Exception as e:
                raise CompileError(f"loading {variant.label}:{name}: {e}") from e
        t2 = time.perf_counter()
        loaded = Loaded(variant, b, fds, t1 - t0, t2 - t1)
        _cache[key] = loaded
        stats["compiles"] += 1
        log.info("bpf variant loaded", variant=variant.label, compile_s=round(t1 - t0, 3),
                 load_s=round(t2 - t1, 4))
        return loaded
