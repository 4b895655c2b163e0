"""The bpf(2) system call, via ctypes, for the commands felixpy needs.

This module owns no kernel objects itself; it is the narrow shim through which the rest of
:mod:`felixpy.bpf` creates maps, reads and writes entries, loads the generated policy programs,
pins and opens objects, runs BPF_PROG_TEST_RUN, and creates/updates/detaches TCX links.  It does not
need bcc (and so does not pull LLVM into the process): a daemon that only rewrites maps and policy
programs never maps clang.

Every failure raises :class:`~felixpy.bpf.errors.BPFSyscallError` carrying the errno.  File
descriptors returned are owned by the caller (close them with :func:`os.close`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import struct
from dataclasses import dataclass

from felixpy.bpf.errors import BPFSyscallError, VerifierError

_SYS_BPF = {"x86_64": 321, "aarch64": 280}[platform.machine()]
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# Commands.
MAP_CREATE = 0
MAP_LOOKUP_ELEM = 1
MAP_UPDATE_ELEM = 2
MAP_DELETE_ELEM = 3
MAP_GET_NEXT_KEY = 4
PROG_LOAD = 5
OBJ_PIN = 6
OBJ_GET = 7
PROG_TEST_RUN = 10
PROG_GET_NEXT_ID = 11
PROG_GET_FD_BY_ID = 13
MAP_GET_FD_BY_ID = 14
OBJ_GET_INFO_BY_FD = 15
PROG_QUERY = 16
LINK_CREATE = 28
LINK_UPDATE = 29
LINK_DETACH = 34

_CMD_NAMES = {v: k for k, v in dict(globals()).items() if isinstance(v, int) and k.isupper()
              and not k.startswith("_")}

# Map types.
MAP_TYPE_HASH = 1
MAP_TYPE_ARRAY = 2
MAP_TYPE_PROG_ARRAY = 3
MAP_TYPE_PERCPU_HASH = 5
MAP_TYPE_PERCPU_ARRAY = 6
MAP_TYPE_LRU_HASH = 9
MAP_TYPE_LPM_TRIE = 11
PERCPU_MAP_TYPES = frozenset({MAP_TYPE_PERCPU_HASH, MAP_TYPE_PERCPU_ARRAY})

# Map flags.
F_NO_PREALLOC = 1

# Update flags.
ANY = 0
NOEXIST = 1
EXIST = 2

# Program types.
PROG_TYPE_SCHED_CLS = 3
PROG_TYPE_XDP = 6

# Attach types (enum bpf_attach_type).
ATTACH_XDP = 37
ATTACH_TCX_INGRESS = 46
ATTACH_TCX_EGRESS = 47
ATTACH_NETKIT_PRIMARY = 54
ATTACH_NETKIT_PEER = 55

# BPF_LINK_CREATE / BPF_PROG_ATTACH flags.
F_REPLACE = 1 << 2
F_BEFORE = 1 << 3
F_AFTER = 1 << 4


def _call(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    ret = _libc.syscall(_SYS_BPF, cmd, attr, len(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise BPFSyscallError(_CMD_NAMES.get(cmd, str(cmd)), err)
    return int(ret)


def _attr(size: int = 128) -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(size)


def _addr(buf: ctypes.Array[ctypes.c_char] | None) -> int:
    return 0 if buf is None else ctypes.addressof(buf)


@functools.cache
def possible_cpus() -> int:
    """Number of possible CPUs: the per-CPU value count the kernel uses for per-CPU maps."""
    with open("/sys/devices/system/cpu/possible") as f:
        text = f.read().strip()
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n = max(n, int(hi or lo) + 1)
    return n


# ---------------------------------------------------------------------------------------------
# Maps


def map_create(map_type: int, key_size: int, value_size: int, max_entries: int, *,
               flags: int = 0, name: str = "") -> int:
    a = _attr()
    struct.pack_into("=IIIII", a, 0, map_type, key_size, value_size, max_entries, flags)
    struct.pack_into("16s", a, 28, name.encode()[:15])
    return _call(MAP_CREATE, a)


def _elem_attr(fd: int, key: bytes, value: ctypes.Array[ctypes.c_char] | None,
               flags: int = 0) -> tuple[ctypes.Array[ctypes.c_char], ctypes.Array[ctypes.c_char]]:
    a = _attr()
    kbuf = ctypes.create_string_buffer(key, len(key))
    struct.pack_into("=IIQQQ", a, 0, fd, 0, _addr(kbuf), _addr(value), flags)
    return a, kbuf


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    """Return the raw value (``value_size`` bytes; per-CPU callers pass the total) or None."""
    vbuf = ctypes.create_string_buffer(value_size)
    a, _k = _elem_attr(fd, key, vbuf)
    try:
        _call(MAP_LOOKUP_ELEM, a)
    except BPFSyscallError as e:
        if e.errno == 2:  # ENOENT
            return None
        raise
    return vbuf.raw


def map_update(fd: int, key: bytes, value: bytes, flags: int = ANY) -> None:
    vbuf = ctypes.create_string_buffer(value, len(value))
    a, _k = _elem_attr(fd, key, vbuf, flags)
    _call(MAP_UPDATE_ELEM, a)


def map_delete(fd: int, key: bytes) -> bool:
    """Delete; returns False (not an error) when the key was absent."""
    a, _k = _elem_attr(fd, key, None)
    try:
        _call(MAP_DELETE_ELEM, a)
    except BPFSyscallError as e:
        if e.errno == 2:
            return False
        raise
    return True


def map_next_key(fd: int, key: bytes | None, key_size: int) -> bytes | None:
    nbuf = ctypes.create_string_buffer(key_size)
    a = _attr()
    kbuf = None if key is None else ctypes.create_string_buffer(key, len(key))
    struct.pack_into("=IIQQ", a, 0, fd, 0, _addr(kbuf), _addr(nbuf))
    try:
        _call(MAP_GET_NEXT_KEY, a)
    except BPFSyscallError as e:
        if e.errno == 2:
            return None
        raise
    return nbuf.raw


@dataclass(frozen=True, slots=True)
class MapInfo:
    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    name: str


def map_info(fd: int) -> MapInfo:
    info = ctypes.create_string_buffer(88)
    a = _attr()
    struct.pack_into("=IIQ", a, 0, fd, len(info), _addr(info))
    _call(OBJ_GET_INFO_BY_FD, a)
    t, i, ks, vs, me, fl = struct.unpack_from("=IIIIII", info, 0)
    name = info.raw[24:40].split(b"\0", 1)[0].decode()
    return MapInfo(t, i, ks, vs, me, fl, name)


# ---------------------------------------------------------------------------------------------
# Pinning


def obj_pin(fd: int, path: str) -> None:
    p = ctypes.create_string_buffer(path.encode())
    a = _attr()
    struct.pack_into("=QI", a, 0, _addr(p), fd)
    _call(OBJ_PIN, a)


def obj_get(path: str) -> int:
    p = ctypes.create_string_buffer(path.encode())
    a = _attr()
    struct.pack_into("=QI", a, 0, _addr(p), 0)
    return _call(OBJ_GET, a)


# ---------------------------------------------------------------------------------------------
# Programs


@dataclass(frozen=True, slots=True)
class ProgInfo:
    type: int
    id: int
    tag: bytes
    xlated_len: int
    name: str
    map_ids: tuple[int, ...]


def prog_load(prog_type: int, insns: bytes, *, name: str = "", license: str = "Apache-2.0",
              expected_attach_type: int = 0, log_level: int = 0, log_size: int = 0) -> int:
    """Load raw instructions.  On refusal the load is retried with a verifier log so the raised
    :class:`VerifierError` explains why."""
    lic = ctypes.create_string_buffer(license.encode())
    ibuf = ctypes.create_string_buffer(insns, len(insns))

    def attempt(level: int, size: int) -> tuple[int, str]:
        log = ctypes.create_string_buffer(size) if size else None
        a = _attr(160)
        struct.pack_into("=IIQQIIQII", a, 0, prog_type, len(insns) // 8, _addr(ibuf), _addr(lic),
                         level, size, _addr(log), 0, 0)
        struct.pack_into("16s", a, 48, name.encode()[:15])
        struct.pack_into("=I", a, 68, expected_attach_type)
        ret = _libc.syscall(_SYS_BPF, PROG_LOAD, a, len(a))
        text = log.value.decode(errors="replace") if log is not None else ""
        if ret < 0:
            return -ctypes.get_errno(), text
        return int(ret), text

    fd, _ = attempt(log_level, log_size)
    if fd >= 0:
        return fd
    err = -fd
    if err in (13, 22, 7, 28):  # EACCES/EINVAL/E2BIG/ENOSPC: get the verifier's explanation
        size = max(log_size, 1 << 22)
        _, text = attempt(max(log_level, 1), size)
        raise VerifierError(err, name, text)
    raise BPFSyscallError("BPF_PROG_LOAD", err, f"program {name!r}")


def prog_info(fd: int) -> ProgInfo:
    info = ctypes.create_string_buffer(232)
    ids = (ctypes.c_uint32 * 64)()
    struct.pack_into("=IQ", info, 52, 64, ctypes.addressof(ids))
    a = _attr()
    struct.pack_into("=IIQ", a, 0, fd, len(info), _addr(info))
    _call(OBJ_GET_INFO_BY_FD, a)
    t, i = struct.unpack_from("=II", info, 0)
    tag = info.raw[8:16]
    xlated = struct.unpack_from("=I", info, 20)[0]
    nmaps = struct.unpack_from("=I", info, 52)[0]
    name = info.raw[64:80].split(b"\0", 1)[0].decode()
    return ProgInfo(t, i, tag, xlated, name, tuple(ids[: min(nmaps, 64)]))


@dataclass(frozen=True, slots=True)
class TestRunResult:
    retval: int
    duration_ns: int
    data_out: bytes
    ctx_out: bytes


def prog_test_run(fd: int, data: bytes, *, ctx: bytes | None = None, repeat: int = 1,
                  data_out_size: int | None = None) -> TestRunResult:
    din = ctypes.create_string_buffer(data, len(data))
    out_size = data_out_size if data_out_size is not None else len(data) + 256
    dout = ctypes.create_string_buffer(out_size)
    cin = cout = None
    if ctx is not None:
        cin = ctypes.create_string_buffer(ctx, len(ctx))
        cout = ctypes.create_string_buffer(max(len(ctx), 512))  # kernel copies its full ctx
    a = _attr(80)
    struct.pack_into("=IIIIQQII", a, 0, fd, 0, len(data), out_size, _addr(din), _addr(dout),
                     repeat, 0)
    struct.pack_into("=IIQQ", a, 40, len(ctx) if ctx else 0, len(cout) if cout else 0,
                     _addr(cin), _addr(cout))
    _call(PROG_TEST_RUN, a)
    retval, _, size_out = struct.unpack_from("=III", a, 4)
    duration = struct.unpack_from("=I", a, 36)[0]
    ctx_size_out = struct.unpack_from("=I", a, 44)[0]
    return TestRunResult(retval, duration, dout.raw[: min(size_out, out_size)],
                         cout.raw[:ctx_size_out] if cout is not None else b"")


def prog_get_next_id(start: int) -> int | None:
    a = _attr()
    struct.pack_into("=I", a, 0, start)
    try:
        _call(PROG_GET_NEXT_ID, a)
    except BPFSyscallError as e:
        if e.errno == 2:
            return None
        raise
    return int(struct.unpack_from("=I", a, 4)[0])


def prog_get_fd_by_id(prog_id: int) -> int:
    a = _attr()
    struct.pack_into("=I", a, 0, prog_id)
    return _call(PROG_GET_FD_BY_ID, a)


# ---------------------------------------------------------------------------------------------
# Links (TCX)


def link_create(prog_fd: int, target_ifindex: int, attach_type: int, flags: int = 0) -> int:
    a = _attr()
    struct.pack_into("=IIII", a, 0, prog_fd, target_ifindex, attach_type, flags)
    return _call(LINK_CREATE, a)


def link_update(link_fd: int, new_prog_fd: int, old_prog_fd: int = 0) -> None:
    a = _attr()
    flags = F_REPLACE if old_prog_fd else 0
    struct.pack_into("=IIII", a, 0, link_fd, new_prog_fd, flags, old_prog_fd)
    _call(LINK_UPDATE, a)


def link_detach(link_fd: int) -> None:
    a = _attr()
    struct.pack_into("=I", a, 0, link_fd)
    _call(LINK_DETACH, a)


def link_info(link_fd: int) -> tuple[int, int, int]:
    """(link type, link id, prog id) of a link."""
    info = ctypes.create_string_buffer(64)
    a = _attr()
    struct.pack_into("=IIQ", a, 0, link_fd, len(info), _addr(info))
    _call(OBJ_GET_INFO_BY_FD, a)
    ltype, lid, pid = struct.unpack_from("=III", info, 0)
    return ltype, lid, pid


def prog_query_tcx(ifindex: int, attach_type: int) -> list[int]:
    """Program ids attached to an interface through TCX (in order)."""
    ids = (ctypes.c_uint32 * 64)()
    a = _attr()
    struct.pack_into("=IIIIQI", a, 0, ifindex, attach_type, 0, 0, ctypes.addressof(ids), 64)
    try:
        _call(PROG_QUERY, a)
    except BPFSyscallError as e:
        if e.errno in (2, 22, 19):
            return []
        raise
    cnt = struct.unpack_from("=I", a, 24)[0]
    return list(ids[:cnt])


def close(fd: int) -> None:
    os.close(fd)
