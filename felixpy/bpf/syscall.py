"""bpf(2) operations through libbpf's low-level API (``libbpf.so.1``), bound with ctypes.

This module owns no kernel objects itself; it is the narrow shim through which the rest of
:mod:`felixpy.bpf` creates maps, reads and writes entries, loads the generated policy programs,
pins and opens objects, reads object info, runs BPF_PROG_TEST_RUN, queries TCX hooks and
creates/updates/detaches TCX links.  Each function is one call into libbpf's ``bpf.h`` API
(``bpf_map_create``, ``bpf_prog_load``, ``bpf_link_create`` ...): libbpf builds the
``union bpf_attr`` for the command, sizes it for the kernel, retries ``EAGAIN`` on program load
and probes the kernel features it depends on (object names, memlock accounting), so none of that
is hand-written here.  What is mirrored here are the ``*_opts`` structs of libbpf 1.1's
``bpf/bpf.h`` (each passed with ``sz`` set, as libbpf requires) and the prefixes of the kernel's
``bpf_{map,prog,link}_info`` that are read; ``tests/bpf/test_syscall.py`` checks both against the
C headers.

Why libbpf and not bcc: libbpf is a small C library with no LLVM (it is bcc's own dependency; 350
KiB plus libelf and zlib), so a daemon that only rewrites maps and policy programs never maps
clang; bcc is only needed to *compile* the C programs (``build.py``, or the worker process).
libbpf 1.1 predates TCX: the TCX attach types pass through ``bpf_link_create`` and
``bpf_prog_query_opts`` unchanged, but the link's relative-program/expected-revision fields are not
reachable through its opts (felixpy uses neither).

libbpf 1.x returns a negative errno on failure.  Every failure raises
:class:`~felixpy.bpf.errors.BPFSyscallError` carrying that errno (a refused program load raises
:class:`~felixpy.bpf.errors.VerifierError` with the verifier log); "not found" answers that are
part of an operation's contract (lookup, delete, next key, next id) return None/False instead.
File descriptors returned are owned by the caller (close them with :func:`os.close`).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import functools
import os
from dataclasses import dataclass

from felixpy.bpf.errors import BPFSyscallError, VerifierError

LIBBPF_SONAME = "libbpf.so.1"
libbpf = ctypes.CDLL(LIBBPF_SONAME, use_errno=True)

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

# Attach types (enum bpf_attach_type).  libbpf 1.1's headers predate TCX (kernel 6.6) and
# netkit; libbpf passes the value through to the kernel unchanged.
ATTACH_XDP = 37
ATTACH_TCX_INGRESS = 46
ATTACH_TCX_EGRESS = 47
ATTACH_NETKIT_PRIMARY = 54
ATTACH_NETKIT_PEER = 55

# BPF_LINK_CREATE / BPF_PROG_ATTACH / BPF_LINK_UPDATE flags.
F_REPLACE = 1 << 2
F_BEFORE = 1 << 3
F_AFTER = 1 << 4

_ENOENT = _errno.ENOENT
_u32 = ctypes.c_uint32
_u64 = ctypes.c_uint64
_ptr = ctypes.c_void_p


# ---------------------------------------------------------------------------------------------
# libbpf 1.1 opts structs (bpf/bpf.h).  ``sz`` must be sizeof(struct): libbpf rejects (EINVAL) a
# size it does not know unless the unknown tail is zero.


class _Opts(ctypes.Structure):
    def __init__(self, **kw: object) -> None:
        super().__init__(sz=ctypes.sizeof(self), **kw)


class MapCreateOpts(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("btf_fd", _u32), ("btf_key_type_id", _u32),
                ("btf_value_type_id", _u32), ("btf_vmlinux_value_type_id", _u32),
                ("inner_map_fd", _u32), ("map_flags", _u32), ("map_extra", _u64),
                ("numa_node", _u32), ("map_ifindex", _u32)]


class ProgLoadOpts(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("attempts", ctypes.c_int),
                ("expected_attach_type", ctypes.c_int), ("prog_btf_fd", _u32),
                ("prog_flags", _u32), ("prog_ifindex", _u32), ("kern_version", _u32),
                ("attach_btf_id", _u32), ("attach_prog_fd", _u32), ("attach_btf_obj_fd", _u32),
                ("fd_array", _ptr), ("func_info", _ptr), ("func_info_cnt", _u32),
                ("func_info_rec_size", _u32), ("line_info", _ptr), ("line_info_cnt", _u32),
                ("line_info_rec_size", _u32), ("log_level", _u32), ("log_size", _u32),
                ("log_buf", _ptr)]


class _KprobeMulti(ctypes.Structure):
    _fields_ = [("flags", _u32), ("cnt", _u32), ("syms", _ptr), ("addrs", _ptr),
                ("cookies", _ptr)]


class _LinkCreateUnion(ctypes.Union):
    _fields_ = [("perf_event_bpf_cookie", _u64), ("kprobe_multi", _KprobeMulti),
                ("tracing_cookie", _u64)]


class LinkCreateOpts(_Opts):
    _anonymous_ = ("_u",)
    _fields_ = [("sz", ctypes.c_size_t), ("flags", _u32), ("iter_info", _ptr),
                ("iter_info_len", _u32), ("target_btf_id", _u32), ("_u", _LinkCreateUnion)]


class LinkUpdateOpts(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("flags", _u32), ("old_prog_fd", _u32)]


class ProgQueryOpts(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("query_flags", _u32), ("attach_flags", _u32),
                ("prog_ids", ctypes.POINTER(_u32)), ("prog_cnt", _u32),
                ("prog_attach_flags", ctypes.POINTER(_u32))]


class ProgTestRunOpts(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", _ptr), ("data_out", _ptr),
                ("data_size_in", _u32), ("data_size_out", _u32), ("ctx_in", _ptr),
                ("ctx_out", _ptr), ("ctx_size_in", _u32), ("ctx_size_out", _u32),
                ("retval", _u32), ("repeat", ctypes.c_int), ("duration", _u32), ("flags", _u32),
                ("cpu", _u32), ("batch_size", _u32)]


# Kernel info structs (linux/bpf.h), only the leading fields read here: the kernel copies
# min(info_len, its own size), so a prefix is a valid buffer.


class BpfMapInfo(ctypes.Structure):
    _fields_ = [("type", _u32), ("id", _u32), ("key_size", _u32), ("value_size", _u32),
                ("max_entries", _u32), ("map_flags", _u32), ("name", ctypes.c_char * 16),
                ("ifindex", _u32), ("btf_vmlinux_value_type_id", _u32), ("netns_dev", _u64),
                ("netns_ino", _u64), ("btf_id", _u32), ("btf_key_type_id", _u32),
                ("btf_value_type_id", _u32), ("_pad", _u32), ("map_extra", _u64)]


class BpfProgInfo(ctypes.Structure):
    _fields_ = [("type", _u32), ("id", _u32), ("tag", ctypes.c_uint8 * 8),
                ("jited_prog_len", _u32), ("xlated_prog_len", _u32), ("jited_prog_insns", _u64),
                ("xlated_prog_insns", _u64), ("load_time", _u64), ("created_by_uid", _u32),
                ("nr_map_ids", _u32), ("map_ids", _u64), ("name", ctypes.c_char * 16)]


class BpfLinkInfo(ctypes.Structure):
    _fields_ = [("type", _u32), ("id", _u32), ("prog_id", _u32)]


for _s, _size in ((MapCreateOpts, 48), (ProgLoadOpts, 104), (LinkCreateOpts, 64),
                  (LinkUpdateOpts, 16), (ProgQueryOpts, 40), (ProgTestRunOpts, 80),
                  (BpfMapInfo, 88), (BpfProgInfo, 80), (BpfLinkInfo, 12)):
    assert ctypes.sizeof(_s) == _size, (_s.__name__, ctypes.sizeof(_s))


# ---------------------------------------------------------------------------------------------
# Prototypes (libbpf 1.1.2 bpf/bpf.h).  Every function returns 0 / an fd, or a negative errno.


# libbpf's TC API (bpf/libbpf.h), for one read: which program a clsact filter runs.
class TcHook(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", ctypes.c_int), ("attach_point", ctypes.c_int),
                ("parent", _u32)]


class TcOpts(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", ctypes.c_int), ("flags", _u32), ("prog_id", _u32),
                ("handle", _u32), ("priority", _u32)]


TC_INGRESS, TC_EGRESS = 1, 2  # enum bpf_tc_attach_point


class MapBatchOpts(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", _u64), ("flags", _u64)]


def _proto(name: str, *argtypes: object) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    fn = getattr(libbpf, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_c_int = ctypes.c_int
_cstr = ctypes.c_char_p
_bpf_map_create = _proto("bpf_map_create", _c_int, _cstr, _u32, _u32, _u32,
                         ctypes.POINTER(MapCreateOpts))
_bpf_map_lookup_elem = _proto("bpf_map_lookup_elem", _c_int, _ptr, _ptr)
_bpf_map_update_elem = _proto("bpf_map_update_elem", _c_int, _ptr, _ptr, _u64)
_bpf_map_delete_elem = _proto("bpf_map_delete_elem", _c_int, _ptr)
_bpf_map_update_batch = _proto("bpf_map_update_batch", _c_int, _ptr, _ptr, ctypes.POINTER(_u32),
                               ctypes.POINTER(MapBatchOpts))
_bpf_map_lookup_batch = _proto("bpf_map_lookup_batch", _c_int, _ptr, _ptr, _ptr, _ptr, ctypes.POINTER(_u32),
                               ctypes.POINTER(MapBatchOpts))
_bpf_map_delete_batch = _proto("bpf_map_delete_batch", _c_int, _ptr, ctypes.POINTER(_u32),
                               ctypes.POINTER(MapBatchOpts))
_bpf_map_get_next_key = _proto("bpf_map_get_next_key", _c_int, _ptr, _ptr)
_bpf_obj_pin = _proto("bpf_obj_pin", _c_int, _cstr)
_bpf_obj_get = _proto("bpf_obj_get", _cstr)
_bpf_obj_get_info_by_fd = _proto("bpf_obj_get_info_by_fd", _c_int, _ptr, ctypes.POINTER(_u32))
_bpf_prog_load = _proto("bpf_prog_load", _c_int, _cstr, _cstr, _ptr, ctypes.c_size_t,
                        ctypes.POINTER(ProgLoadOpts))
_bpf_prog_test_run_opts = _proto("bpf_prog_test_run_opts", _c_int, ctypes.POINTER(ProgTestRunOpts))
_bpf_prog_get_next_id = _proto("bpf_prog_get_next_id", _u32, ctypes.POINTER(_u32))
_bpf_prog_get_fd_by_id = _proto("bpf_prog_get_fd_by_id", _u32)
_bpf_link_create = _proto("bpf_link_create", _c_int, _c_int, _c_int,
                          ctypes.POINTER(LinkCreateOpts))
_bpf_link_update = _proto("bpf_link_update", _c_int, _c_int, ctypes.POINTER(LinkUpdateOpts))
_bpf_link_detach = _proto("bpf_link_detach", _c_int)
_bpf_prog_query_opts = _proto("bpf_prog_query_opts", _c_int, _c_int,
                              ctypes.POINTER(ProgQueryOpts))
_libbpf_num_possible_cpus = _proto("libbpf_num_possible_cpus")
_bpf_tc_query = _proto("bpf_tc_query", ctypes.POINTER(TcHook), ctypes.POINTER(TcOpts))


def _check(cmd: str, ret: int) -> int:
    """libbpf's result -> the value, or BPFSyscallError(cmd, errno) for a negative errno."""
    if ret < 0:
        raise BPFSyscallError(cmd, -ret)
    return ret


@functools.cache
def possible_cpus() -> int:
    """Number of possible CPUs: the per-CPU value count the kernel uses for per-CPU maps."""
    n = _libbpf_num_possible_cpus()
    if n <= 0:
        raise OSError(-n, f"libbpf_num_possible_cpus: {os.strerror(-n)}")
    return int(n)


# ---------------------------------------------------------------------------------------------
# Maps


def map_create(map_type: int, key_size: int, value_size: int, max_entries: int, *,
               flags: int = 0, name: str = "") -> int:
    opts = MapCreateOpts(map_flags=flags)
    return _check("MAP_CREATE", _bpf_map_create(map_type, name.encode()[:15] or None, key_size,
                                                value_size, max_entries, ctypes.byref(opts)))


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    """Return the raw value (``value_size`` bytes; per-CPU callers pass the total) or None."""
    vbuf = ctypes.create_string_buffer(value_size)
    ret = _bpf_map_lookup_elem(fd, key, vbuf)
    if ret == -_ENOENT:
        return None
    _check("MAP_LOOKUP_ELEM", ret)
    return vbuf.raw


def map_update(fd: int, key: bytes, value: bytes, flags: int = ANY) -> None:
    _check("MAP_UPDATE_ELEM", _bpf_map_update_elem(fd, key, value, flags))


class BatchIncomplete(BPFSyscallError):
    """A bulk map write or delete (``BPF_MAP_UPDATE_BATCH``/``BPF_MAP_DELETE_BATCH``, or
    ``Map.set_many``/``Map.delete_many``) stopped after its first ``done`` elements (those are
    written, or gone from the map)."""

    def __init__(self, cmd: str, err: int, done: int) -> None:
        super().__init__(cmd, err)
        self.done = done


def _batch_done(asked: int, count: _u32) -> int:
    """How many elements a failed batch command got through.  The kernel writes the count back only
    once it has started on the elements: a command refused up front (no batch operations for the map
    type, bad flags) leaves the count as it was passed -- which a command that stopped at a failing
    element never does (that element is not counted) -- so an unchanged count means none."""
    return 0 if count.value == asked else int(count.value)


def map_update_batch(fd: int, keys: bytes, values: bytes, count: int, flags: int = ANY) -> None:
    """Write *count* elements in one ``BPF_MAP_UPDATE_BATCH`` (*keys*/*values*: the packed elements).
    Raises :class:`BatchIncomplete` with how many were written when the kernel stops early (EINVAL
    or ENOTSUPP with none written: the map type has no batch operations)."""
    n = _u32(count)
    opts = MapBatchOpts(elem_flags=flags, flags=0)
    ret = _bpf_map_update_batch(fd, keys, values, ctypes.byref(n), ctypes.byref(opts))
    if ret < 0:
        raise BatchIncomplete("MAP_UPDATE_BATCH", -ret, _batch_done(count, n))


def map_delete_batch(fd: int, keys: bytes, count: int) -> None:
    """Delete *count* keys (packed) in one ``BPF_MAP_DELETE_BATCH``.  The kernel deletes in order and
    stops at the first key it cannot delete -- an absent key too (ENOENT), where the one-key delete is
    not an error: :class:`BatchIncomplete` says how many were deleted before it, and the caller decides."""
    n = _u32(count)
    opts = MapBatchOpts()
    ret = _bpf_map_delete_batch(fd, keys, ctypes.byref(n), ctypes.byref(opts))
    if ret < 0:
        raise BatchIncomplete("MAP_DELETE_BATCH", -ret, _batch_done(count, n))


_LOOKUP_RACE_RETRIES = 3


def map_lookup_batch(fd: int, cursor: bytes | None, count: int, key_size: int,
                     value_size: int) -> tuple[bytes, bytes, int, bytes | None]:
    """Read up to *count* elements in one ``BPF_MAP_LOOKUP_BATCH``, from *cursor* (None: the map's start;
    else what the previous call returned).  Returns ``(keys, values, n, next cursor)``: *n* elements
    packed in *keys* and *values*, and None as the cursor once the map's end was reached (the kernel
    answers the last batch with ENOENT, its count filled in: an empty map is one call, n 0).  Per-CPU
    maps: *value_size* is the per-element total, round_up(value_size, 8) x possible CPUs.

    The cursor is opaque: a bucket index for hash maps, the last key read for the others (arrays, LPM
    tries), whose walk is get-next-key inside the kernel -- so deleting that key before the next call
    restarts an LPM trie's walk.  Raises :class:`BPFSyscallError` (EINVAL/ENOTSUPP: no batch
    operations for the map type)."""
    retries = _LOOKUP_RACE_RETRIES
    while True:
        kbuf = ctypes.create_string_buffer(count * key_size)
        vbuf = ctypes.create_string_buffer(count * value_size)
        out = ctypes.create_string_buffer(max(key_size, 4))
        n = _u32(count)
        ret = _bpf_map_lookup_batch(fd, cursor, out, kbuf, vbuf, ctypes.byref(n), ctypes.byref(MapBatchOpts()))
        got = int(n.value)
        if ret == 0 or ret == -_ENOENT or (ret == -_errno.EINTR and got):
            # (EINTR: the in-kernel walk lost a race with a delete at one key three times; what it
            # read before that is good, and the next call goes on from there.)
            nxt = None if ret == -_ENOENT else out.raw
            return ctypes.string_at(kbuf, got * key_size), ctypes.string_at(vbuf, got * value_size), got, nxt
        if ret == -_errno.ENOSPC:  # one hash bucket holds more than *count* elements (none read): ask for more
            count *= 2
            continue
        if ret == -_errno.EINTR and retries:
            retries -= 1
            continue
        raise BPFSyscallError("MAP_LOOKUP_BATCH", -ret)


def map_delete(fd: int, key: bytes) -> bool:
    """Delete; returns False (not an error) when the key was absent."""
    ret = _bpf_map_delete_elem(fd, key)
    if ret == -_ENOENT:
        return False
    _check("MAP_DELETE_ELEM", ret)
    return True


def map_next_key(fd: int, key: bytes | None, key_size: int) -> bytes | None:
    nbuf = ctypes.create_string_buffer(key_size)
    ret = _bpf_map_get_next_key(fd, key, nbuf)
    if ret == -_ENOENT:
        return None
    _check("MAP_GET_NEXT_KEY", ret)
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


def _obj_info(fd: int, info: ctypes.Structure) -> None:
    size = _u32(ctypes.sizeof(info))
    _check("OBJ_GET_INFO_BY_FD", _bpf_obj_get_info_by_fd(fd, ctypes.byref(info),
                                                         ctypes.byref(size)))


def map_info(fd: int) -> MapInfo:
    i = BpfMapInfo()
    _obj_info(fd, i)
    return MapInfo(i.type, i.id, i.key_size, i.value_size, i.max_entries, i.map_flags,
                   i.name.decode())


# ---------------------------------------------------------------------------------------------
# Pinning


def obj_pin(fd: int, path: str) -> None:
    _check("OBJ_PIN", _bpf_obj_pin(fd, path.encode()))


def obj_get(path: str) -> int:
    return _check("OBJ_GET", _bpf_obj_get(path.encode()))


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


_LOG_ON_REFUSAL = 1 << 22  # verifier log buffer for the explanatory retry
_REFUSED = frozenset({_errno.EACCES, _errno.EINVAL, _errno.E2BIG, _errno.ENOSPC})


def prog_load(prog_type: int, insns: bytes, *, name: str = "", license: str = "Apache-2.0",
              expected_attach_type: int = 0, log_level: int = 0, log_size: int = 0) -> int:
    """Load raw instructions.  On refusal the load is retried with a verifier log so the raised
    :class:`VerifierError` explains why."""
    cname = name.encode()[:15] or None
    clic = license.encode()

    def attempt(level: int, size: int) -> tuple[int, str]:
        log = ctypes.create_string_buffer(size) if size else None
        # libbpf: a log buffer needs a size and vice versa; log_level 0 with a buffer makes
        # libbpf itself retry at level 1 on failure (we do our own retry, below).
        opts = ProgLoadOpts(expected_attach_type=expected_attach_type, log_level=level,
                            log_size=size if log is not None else 0,
                            log_buf=ctypes.addressof(log) if log is not None else None)
        ret = _bpf_prog_load(prog_type, cname, clic, insns, len(insns) // 8, ctypes.byref(opts))
        return ret, (log.value.decode(errors="replace") if log is not None else "")

    fd, _ = attempt(log_level, log_size)
    if fd >= 0:
        return fd
    err = -fd
    if err in _REFUSED:  # get the verifier's explanation
        _, text = attempt(max(log_level, 1), max(log_size, _LOG_ON_REFUSAL))
        raise VerifierError(err, name, text)
    raise BPFSyscallError("BPF_PROG_LOAD", err, f"program {name!r}")


_MAX_MAP_IDS = 64


def prog_info(fd: int) -> ProgInfo:
    ids = (_u32 * _MAX_MAP_IDS)()
    i = BpfProgInfo(nr_map_ids=_MAX_MAP_IDS, map_ids=ctypes.addressof(ids))
    _obj_info(fd, i)
    return ProgInfo(i.type, i.id, bytes(i.tag), i.xlated_prog_len, i.name.decode(),
                    tuple(ids[: min(i.nr_map_ids, _MAX_MAP_IDS)]))


@dataclass(frozen=True, slots=True)
class TestRunResult:
    retval: int
    duration_ns: int
    data_out: bytes
    ctx_out: bytes


def prog_test_run(fd: int, data: bytes, *, ctx: bytes | None = None, repeat: int = 1,
                  data_out_size: int | None = None) -> TestRunResult:
    out_size = data_out_size if data_out_size is not None else len(data) + 256
    dout = ctypes.create_string_buffer(out_size)
    cout = None
    opts = ProgTestRunOpts(data_in=ctypes.cast(ctypes.c_char_p(data), _ptr), data_size_in=len(data),
                       data_out=ctypes.addressof(dout), data_size_out=out_size, repeat=repeat)
    if ctx is not None:
        cout = ctypes.create_string_buffer(max(len(ctx), 512))  # kernel copies its full ctx
        opts.ctx_in = ctypes.cast(ctypes.c_char_p(ctx), _ptr)
        opts.ctx_size_in = len(ctx)
        opts.ctx_out = ctypes.addressof(cout)
        opts.ctx_size_out = len(cout)
    _check("PROG_TEST_RUN", _bpf_prog_test_run_opts(fd, ctypes.byref(opts)))
    return TestRunResult(opts.retval, opts.duration, dout.raw[: min(opts.data_size_out, out_size)],
                         cout.raw[: opts.ctx_size_out] if cout is not None else b"")


def prog_get_next_id(start: int) -> int | None:
    nxt = _u32()
    ret = _bpf_prog_get_next_id(start, ctypes.byref(nxt))
    if ret == -_ENOENT:
        return None
    _check("PROG_GET_NEXT_ID", ret)
    return nxt.value


def prog_get_fd_by_id(prog_id: int) -> int:
    return _check("PROG_GET_FD_BY_ID", _bpf_prog_get_fd_by_id(prog_id))


def prog_info_by_id(prog_id: int) -> ProgInfo | None:
    """The info of loaded program *prog_id*, or None when it is gone (ids are read racily)."""
    try:
        fd = prog_get_fd_by_id(prog_id)
    except BPFSyscallError:
        return None
    try:
        return prog_info(fd)
    finally:
        os.close(fd)


def same_program(a: ProgInfo, b: ProgInfo) -> bool:
    """The same code over the same maps (name, tag, map ids): one need not replace the other."""
    return (a.name, a.tag, sorted(a.map_ids)) == (b.name, b.tag, sorted(b.map_ids))


# ---------------------------------------------------------------------------------------------
# Links (TCX)


def link_create(prog_fd: int, target_ifindex: int, attach_type: int, flags: int = 0) -> int:
    opts = LinkCreateOpts(flags=flags)
    return _check("LINK_CREATE", _bpf_link_create(prog_fd, target_ifindex, attach_type,
                                                  ctypes.byref(opts)))


def link_update(link_fd: int, new_prog_fd: int, old_prog_fd: int = 0) -> None:
    opts = LinkUpdateOpts(flags=F_REPLACE if old_prog_fd else 0, old_prog_fd=old_prog_fd)
    _check("LINK_UPDATE", _bpf_link_update(link_fd, new_prog_fd, ctypes.byref(opts)))


def link_detach(link_fd: int) -> None:
    _check("LINK_DETACH", _bpf_link_detach(link_fd))


def link_info(link_fd: int) -> tuple[int, int, int]:
    """(link type, link id, prog id) of a link."""
    i = BpfLinkInfo()
    _obj_info(link_fd, i)
    return i.type, i.id, i.prog_id


def prog_query(target: int, attach_type: int, max_ids: int = 64) -> list[int]:
    """Program ids attached at ``target`` (an ifindex for TCX) for ``attach_type``, in order.
    ``max_ids`` 0 only asks whether the query is supported.  Failures raise."""
    ids = (_u32 * max_ids)() if max_ids else None
    opts = ProgQueryOpts(prog_ids=ids, prog_cnt=max_ids)
    _check("PROG_QUERY", _bpf_prog_query_opts(target, attach_type, ctypes.byref(opts)))
    return list(ids[: min(opts.prog_cnt, max_ids)]) if ids is not None else []


def prog_query_tcx(ifindex: int, attach_type: int) -> list[int]:
    """Program ids attached to an interface through TCX (in order)."""
    try:
        return prog_query(ifindex, attach_type)
    except BPFSyscallError as e:
        if e.errno in (_errno.ENOENT, _errno.EINVAL, _errno.ENODEV):
            return []
        raise


def tc_query_prog_id(ifindex: int, attach_point: int, handle: int, priority: int) -> int | None:
    """The id of the program the clsact filter (handle, priority) on a hook runs; None if there is
    no such filter.  Acts in the calling thread's network namespace (netlink)."""
    hook = TcHook(ifindex=ifindex, attach_point=attach_point)
    opts = TcOpts(handle=handle, priority=priority)
    ret = _bpf_tc_query(ctypes.byref(hook), ctypes.byref(opts))
    if ret in (-_ENOENT, -_errno.EINVAL, -_errno.ENODEV):
        return None
    _check("TC_QUERY", ret)
    return int(opts.prog_id)


def close(fd: int) -> None:
    os.close(fd)
