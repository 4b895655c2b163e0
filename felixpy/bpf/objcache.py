"""The on-disk cache of compiled variants: a restarted daemon loads its TC/XDP programs from
bytecode instead of recompiling them (~0.4 s of clang per variant, in a worker process).

What is cached, per variant: each sub-program's instructions as bcc emitted them (``dump_func``),
with every map reference (``ld_imm64`` of a map fd) recorded as the *name* of the map it
pointed at, plus the program type.  Loading patches the fds of this process's maps (opened by
pin path under the pin root) back in and loads through libbpf (:func:`felixpy.bpf.syscall.prog_load`),
so the daemon needs neither bcc nor LLVM for a cached variant.

The key is everything the bytecode depends on: a SHA-256 of the expanded C source (every local
header spliced in), the cflags (compile flags, log level, family) except the pin root (it only
names the maps bcc opens at compile time, and map references are relocated by name), the kernel
release and the bcc version (read from bcc's ``version.py`` without importing bcc).  A file whose key does
not match is a miss and is overwritten by the next compile; a cached program the kernel refuses is
a miss too (logged), so a stale or corrupt cache can only cost a compile.

Location: ``FELIXPY_BPF_CACHE_DIR`` (an empty value turns the cache off), default
``/var/lib/felixpy/bpf`` (Felix keeps its objects under ``/usr/lib/calico/bpf``; felixpy's are
built on the node, so they live with its state).  Files are written atomically (temp + rename).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path

import structlog

from felixpy.bpf import syscall as sc
from felixpy.bpf.build import Variant, expand_source
from felixpy.bpf.errors import BPFError

log = structlog.get_logger(__name__)

CACHE_ENV = "FELIXPY_BPF_CACHE_DIR"
DEFAULT_DIR = "/var/lib/felixpy/bpf"
LICENSE = "GPL"  # bcc's default for a text without a license section
_LD_IMM64 = 0x18
_PSEUDO_MAP_FD = 1
FORMAT = 1


def cache_dir() -> str | None:
    d = os.environ.get(CACHE_ENV, DEFAULT_DIR)
    return d or None


def bcc_version() -> str:
    """bcc's version without importing bcc (which would map LLVM into this process)."""
    spec = importlib.util.find_spec("bcc")
    if spec is None or not spec.submodule_search_locations:
        return "none"
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "version.py"
        if p.exists():
            for line in p.read_text().splitlines():
                if line.startswith("__version__"):
                    return line.split("=", 1)[1].strip().strip("'\"")
    return "unknown"


def cache_key(variant: Variant) -> str:
    h = hashlib.sha256()
    flags = [f for f in variant.cflags("") if not f.startswith("-DCALI_PIN_ROOT=")]
    for part in (f"format {FORMAT}", expand_source(variant.source), *flags, os.uname().release, bcc_version()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _path(directory: str, variant: Variant) -> Path:
    return Path(directory) / f"{variant.label}.json"


def _map_refs(insns: bytes) -> list[tuple[int, int]]:
    """(instruction index, fd) of every ``ld_imm64`` that loads a map by fd."""
    out = []
    for i in range(len(insns) // 8):
        op, regs, _off, imm = struct.unpack_from("<BBhi", insns, i * 8)
        if op == _LD_IMM64 and regs >> 4 == _PSEUDO_MAP_FD:
            out.append((i, imm))
    return out


def store(directory: str, variant: Variant, funcs: Mapping[str, bytes]) -> bool:
    """Record *funcs* (name -> bcc's instructions, map fds of this process) for *variant*."""
    entry: dict[str, object] = {"key": cache_key(variant), "prog_type": variant.prog_type, "funcs": {}}
    out = entry["funcs"]
    assert isinstance(out, dict)
    names: dict[int, str] = {}
    for func, insns in funcs.items():
        relocs = []
        for idx, fd in _map_refs(insns):
            if fd not in names:
                try:
                    names[fd] = sc.map_info(fd).name
                except (OSError, BPFError):
                    log.info("BPF variant not cached: a map reference is not a map", variant=variant.label, fd=fd)
                    return False
            relocs.append([idx, names[fd]])
        out[func] = {"insns": base64.b64encode(insns).decode(), "maps": relocs}
    path = _path(directory, variant)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("BPF compile cache not written", path=str(path), error=str(e))
        return False
    return True


def load(directory: str, variant: Variant, pin_root: str) -> dict[str, int] | None:
    """Load *variant*'s programs from the cache (fds by function name), or None on a miss."""
    path = _path(directory, variant)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if entry.get("key") != cache_key(variant):
        log.info("BPF compile cache entry is stale", variant=variant.label)
        return None
    fds: dict[str, int] = {}
    map_fds: dict[str, int] = {}
    try:
        for func, rec in entry["funcs"].items():
            insns = bytearray(base64.b64decode(rec["insns"]))
            for idx, name in rec["maps"]:
                if name not in map_fds:
                    map_fds[name] = sc.obj_get(os.path.join(pin_root, name))
                struct.pack_into("<i", insns, idx * 8 + 4, map_fds[name])
            fds[func] = sc.prog_load(int(entry["prog_type"]), bytes(insns), name=func, license=LICENSE)
    except (OSError, BPFError, KeyError, ValueError, TypeError, IndexError, struct.error) as e:
        log.warning("BPF compile cache entry not loadable; compiling", variant=variant.label, error=str(e))
        for fd in fds.values():
            os.close(fd)
        return None
    finally:
        for fd in map_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
    return fds
