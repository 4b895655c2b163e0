"""The BPF maps felixpy shares with its programs: specs and pinned wrappers (the fake is in :mod:`felixpy.bpf.fake`).

What it owns: every map in :data:`TC_MAP_SPECS`, pinned as ``<pin root>/<name>``.  The pin root
defaults to ``/sys/fs/bpf/tc/globals`` (Felix's ``bpfdefs.GlobalPinDir``) and is configurable
so tests can use a private bpffs.

How a fresh process recognises them: by pinned path and kernel map name (``cali_*``,
``xdp_cali_*``; the name carries the layout version suffix, e.g. ``cali_v4_ct4``), and by
checking type, key size and value size against the spec.  A pin whose layout differs is replaced
(Felix does the same for key/value size changes); a different ``max_entries`` is kept as is,
except for the conntrack maps (:data:`COPY_ON_RESIZE`, sized by ``BPFMapSizeConntrack``), which are
rebuilt at the wanted size with every entry copied over, so established flows survive a resize.
A layout change bumps the version suffix; a new map then looks for the previous versions' pins
(``cali_v4_ct3``, ``cali_v4_ct2``...), converts their entries through the chain of
:data:`UPGRADES` (Felix migrates conntrack the same way) when every step has a converter, and
unlinks the old pin either way (no process of this version uses it).

Python creates every pin *before* bcc compiles a program, so the programs' ``BPF_TABLE_PINNED``
declarations only ever open existing maps with exactly the attributes given here.

Apply contract: :meth:`MapSet.ensure` is idempotent.  Entry operations are one libbpf call (one
bpf(2) command) each; bulk operations go in chunks of :data:`BATCH_CHUNK` elements a command:
writes (:meth:`Map.set_many`) in ``BPF_MAP_UPDATE_BATCH``, read-backs (:meth:`Map.keys`,
:meth:`Map.items` and their raw forms) in ``BPF_MAP_LOOKUP_BATCH``, deletes (:meth:`Map.delete_many`)
in ``BPF_MAP_DELETE_BATCH``; a map whose type the kernel refuses them for goes element by element
(``BPF_MAP_GET_NEXT_KEY`` for reads).  Deleting an absent key returns False rather than raising.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

import structlog

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError

log = structlog.get_logger(__name__)

DEFAULT_PIN_ROOT = "/sys/fs/bpf/tc/globals"
BPF_FS_MAGIC = 0xCAFE4A11
OWNED_PREFIXES = ("cali_", "calico_", "xdp_cali_")

CType = type[ctypes.Structure] | type[ctypes._SimpleCData]  # type: ignore[type-arg]


@dataclass(frozen=True, slots=True)
class MapSpec:
    base: str
    version: int
    map_type: int
    key_type: Any
    value_type: Any
    max_entries: int
    flags: int = 0
    # Derived once (every map write asks for the sizes, and every MapSet lookup for the name: as
    # properties they were ~2 µs of a ~9 µs single-element write).  Not part of the value.
    _name: str = field(default="", init=False, repr=False, compare=False)
    _key_size: int = field(default=0, init=False, repr=False, compare=False)
    _value_size: int = field(default=0, init=False, repr=False, compare=False)
    _percpu: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_name", self.base + (str(self.version) if self.version > 1 else ""))
        object.__setattr__(self, "_key_size", ctypes.sizeof(self.key_type))
        object.__setattr__(self, "_value_size", ctypes.sizeof(self.value_type))
        object.__setattr__(self, "_percpu", self.map_type in sc.PERCPU_MAP_TYPES)

    @property
    def name(self) -> str:
        """Pinned (and kernel) name: base + version suffix when version > 1."""
        if len(self._name) >= 16:
            raise ValueError(f"map name {self._name!r} is too long for BPF_OBJ_NAME_LEN")
        return self._name

    @property
    def key_size(self) -> int:
        return self._key_size

    @property
    def value_size(self) -> int:
        return self._value_size

    @property
    def percpu(self) -> bool:
        return self._percpu

    def sized(self, max_entries: int) -> MapSpec:
        return MapSpec(self.base, self.version, self.map_type, self.key_type, self.value_type,
                       max_entries, self.flags)


u32 = ctypes.c_uint32
_NP = sc.F_NO_PREALLOC


class _StateBlob(ctypes.Structure):
    _fields_ = [("raw", ctypes.c_uint8 * mt.STATE_BLOB_SIZE)]


# Mirrors the CALI_MAP declarations in bpf-gpl/*.h (checked by tests/bpf/test_maps_match_c.py).
CT4 = MapSpec("cali_v4_ct", 4, sc.MAP_TYPE_LRU_HASH, mt.CtKey4, mt.CtValue4, 512000)
CT6 = MapSpec("cali_v6_ct", 4, sc.MAP_TYPE_LRU_HASH, mt.CtKey6, mt.CtValue6, 512000)
IPSETS4 = MapSpec("cali_v4_ip_sets", 1, sc.MAP_TYPE_LPM_TRIE, mt.IPSetKey4, u32, 1048576, _NP)
IPSETS6 = MapSpec("cali_v6_ip_sets", 1, sc.MAP_TYPE_LPM_TRIE, mt.IPSetKey6, u32, 1048576, _NP)
ROUTES4 = MapSpec("cali_v4_routes", 1, sc.MAP_TYPE_LPM_TRIE, mt.RouteKey4, mt.RouteValue4, 262144, _NP)
ROUTES6 = MapSpec("cali_v6_routes", 1, sc.MAP_TYPE_LPM_TRIE, mt.RouteKey6, mt.RouteValue6, 262144, _NP)
FSAFES4 = MapSpec("cali_v4_fsafes", 2, sc.MAP_TYPE_LPM_TRIE, mt.FailsafeKey4, mt.FailsafeValue, 65536, _NP)
FSAFES6 = MapSpec("cali_v6_fsafes", 2, sc.MAP_TYPE_LPM_TRIE, mt.FailsafeKey6, mt.FailsafeValue, 65536, _NP)
IFSTATE = MapSpec("cali_iface", 4, sc.MAP_TYPE_HASH, u32, mt.IfStateValue, 1000, _NP)
STATE = MapSpec("cali_state", 6, sc.MAP_TYPE_PERCPU_ARRAY, u32, _StateBlob, 2)
COUNTERS = MapSpec("cali_counters", 6, sc.MAP_TYPE_PERCPU_HASH, mt.CountersKey, mt.CountersValue, 20000)
AP_GLOBALS = MapSpec("cali_ap_glob", 1, sc.MAP_TYPE_HASH, mt.ApKey, mt.TcPreambleGlobals, 4000, _NP)
XDP_GLOBALS = MapSpec("xdp_cali_glob", 1, sc.MAP_TYPE_HASH, u32, mt.XdpPreambleGlobals, 1000, _NP)
PROGS_ING = MapSpec("cali_progs_ing", 2, sc.MAP_TYPE_PROG_ARRAY, u32, u32, 400)
PROGS_EGR = MapSpec("cali_progs_egr", 2, sc.MAP_TYPE_PROG_ARRAY, u32, u32, 400)
JUMP_ING = MapSpec("cali_jump_ing", 2, sc.MAP_TYPE_PROG_ARRAY, u32, u32, 240000)
JUMP_EGR = MapSpec("cali_jump_egr", 2, sc.MAP_TYPE_PROG_ARRAY, u32, u32, 240000)
XDP_PROGS = MapSpec("xdp_cali_progs", 3, sc.MAP_TYPE_PROG_ARRAY, u32, u32, 400)
XDP_JUMP = MapSpec("xdp_cali_jump", 3, sc.MAP_TYPE_PROG_ARRAY, u32, u32, 2400)

ALL_SPECS: tuple[MapSpec, ...] = (
    CT4, CT6, IPSETS4, IPSETS6, ROUTES4, ROUTES6, FSAFES4, FSAFES6, IFSTATE, STATE, COUNTERS,
    AP_GLOBALS, XDP_GLOBALS, PROGS_ING, PROGS_EGR, JUMP_ING, JUMP_EGR, XDP_PROGS, XDP_JUMP,
)

# Maps rebuilt (entries copied) when the configured size differs from the pinned one.
COPY_ON_RESIZE = frozenset({CT4.base, CT6.base})
# Layout upgrades: (base name, from version) -> a converter of one raw (key, value) of that
# version into the next version's layout (None drops the entry).  felixpy has had one conntrack
# layout so far (Felix's v4), so the table is empty; a layout change adds its step here.
Converter = Callable[[bytes, bytes], "tuple[bytes, bytes] | None"]
UPGRADES: dict[tuple[str, int], Converter] = {}


def _pinned_name(base: str, version: int) -> str:
    return base + (str(version) if version > 1 else "")


KeyLike = ctypes.Structure | ctypes._SimpleCData | bytes | int  # type: ignore[type-arg]


def _to_bytes(v: Any, size: int) -> bytes:
    if isinstance(v, bytes | bytearray):
        b = bytes(v)
    elif isinstance(v, int):
        b = v.to_bytes(size, "little")
    else:
        b = bytes(v)  # ctypes object -> buffer contents
    if len(b) != size:
        raise ValueError(f"expected {size} bytes, got {len(b)}")
    return b


BATCH_CHUNK = 8192
# What the kernel answers a batch command for a map type without batch operations (on 6.18: PROG_ARRAY
# has none, arrays no delete; hash, LRU hash, per-CPU hash and LPM trie have all three).
_NO_BATCH_ERRNOS = frozenset({errno.EINVAL, errno.EOPNOTSUPP, 524})  # 524: the kernel's ENOTSUPP


# A bulk write or delete (:meth:`MapCodec.set_many`, :meth:`MapCodec.delete_many`) stopped at a
# failing element: the first ``done`` are written (or gone from the map).
WriteIncomplete = sc.BatchIncomplete


class PackedKeys(Sequence[bytes]):
    """Keys packed back to back in one bytes object (*size* bytes each), as a sequence of keys: what
    :meth:`MapCodec.delete_many` and (through :meth:`items`) :meth:`MapCodec.set_many` take, without an
    object per key until one is asked for.  A slice is packed too, so a batch chunk is one slice."""

    __slots__ = ("_buf", "_size")

    def __init__(self, buf: bytes, size: int) -> None:
        if len(buf) % size:
            raise ValueError(f"{len(buf)} bytes are not whole {size}-byte keys")
        self._buf, self._size = buf, size

    def __len__(self) -> int:
        return len(self._buf) // self._size

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> PackedKeys: ...

    def __getitem__(self, i: int | slice) -> bytes | PackedKeys:
        ks = self._size
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                raise ValueError("packed keys slice with step 1 only")
            return PackedKeys(self._buf[start * ks:max(start, stop) * ks], ks)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self._buf[i * ks:(i + 1) * ks]

    def items(self, value: Any) -> PackedItems:
        return PackedItems(self, value)


class PackedItems(Sequence[tuple[bytes, Any]]):
    """:class:`PackedKeys` each paired with one *value* (the same object for every key, so a batch write
    encodes it once), for :meth:`MapCodec.set_many`."""

    __slots__ = ("_keys", "_value")

    def __init__(self, keys: PackedKeys, value: Any) -> None:
        self._keys, self._value = keys, value

    def __len__(self) -> int:
        return len(self._keys)

    @overload
    def __getitem__(self, i: int) -> tuple[bytes, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> PackedItems: ...

    def __getitem__(self, i: int | slice) -> tuple[bytes, Any] | PackedItems:
        if isinstance(i, slice):
            return PackedItems(self._keys[i], self._value)
        return self._keys[i], self._value


class BPFMap(Protocol):
    """What both the kernel-backed :class:`Map` and :class:`felixpy.bpf.fake.FakeMap` offer."""

    spec: MapSpec

    def get(self, key: Any) -> Any: ...
    def set(self, key: Any, value: Any, flags: int = sc.ANY) -> None: ...
    def set_many(self, items: Sequence[tuple[Any, Any]], flags: int = sc.ANY) -> None: ...
    def delete(self, key: Any) -> bool: ...
    def delete_many(self, keys: Sequence[Any]) -> int: ...
    def keys(self) -> Iterator[Any]: ...
    def raw_keys(self) -> Iterator[bytes]: ...
    def items(self) -> Iterator[tuple[Any, Any]]: ...
    def clear(self) -> int: ...


class MapCodec:
    """Typed keys/values over raw bytes, shared by :class:`Map` and the in-memory fake."""

    spec: MapSpec

    def set(self, key: Any, value: Any, flags: int = sc.ANY) -> None:
        raise NotImplementedError

    def set_many(self, items: Sequence[tuple[Any, Any]], flags: int = sc.ANY) -> None:
        """Write every (key, value) in order, one :meth:`set` each; a failure is raised as
        :class:`WriteIncomplete`, saying how many were written before it."""
        for i, (key, value) in enumerate(items):
            try:
                self.set(key, value, flags)
            except BPFSyscallError as e:
                raise WriteIncomplete(e.cmd, e.errno, i) from e

    def delete(self, key: Any) -> bool:
        raise NotImplementedError

    def delete_many(self, keys: Sequence[Any]) -> int:
        """Delete every key in order, one :meth:`delete` each; returns how many were present (an absent
        key is skipped, as :meth:`delete` skips it).  A failure is raised as :class:`WriteIncomplete`,
        saying how many keys (from the front) are gone from the map before it."""
        deleted = 0
        for i, key in enumerate(keys):
            try:
                deleted += self.delete(key)
            except BPFSyscallError as e:
                raise WriteIncomplete(e.cmd, e.errno, i) from e
        return deleted

    def _key(self, key: Any) -> bytes:
        return _to_bytes(key, self.spec.key_size)

    def _decode_key(self, raw: bytes) -> Any:
        return self.spec.key_type.from_buffer_copy(raw)

    def _decode_value(self, raw: bytes) -> Any:
        vt = self.spec.value_type
        if not self.spec.percpu:
            return vt.from_buffer_copy(raw)
        stride = (self.spec.value_size + 7) & ~7
        return [vt.from_buffer_copy(raw, i * stride) for i in range(len(raw) // stride)]

    def _encode_value(self, value: Any) -> bytes:
        size = self.spec.value_size
        if not self.spec.percpu:
            return _to_bytes(value, size)
        stride = (size + 7) & ~7
        ncpu = sc.possible_cpus()
        if not isinstance(value, list):
            # One value for every CPU: encoded once (a node with 96 CPUs wrote 96 copies one by one).
            return (_to_bytes(value, size) + bytes(stride - size)) * ncpu
        out = bytearray(stride * ncpu)
        for i, v in enumerate(value[:ncpu]):
            out[i * stride:i * stride + size] = _to_bytes(v, size)
        return bytes(out)

    def _raw_value_size(self) -> int:
        if self.spec.percpu:
            return ((self.spec.value_size + 7) & ~7) * sc.possible_cpus()
        return self.spec.value_size


class Map(MapCodec):
    """A kernel map, addressed through typed keys/values (ctypes objects, ints or bytes).

    Per-CPU maps return a list (one value per possible CPU) from :meth:`get`; :meth:`set` with
    a single value writes it to every CPU."""

    def __init__(self, spec: MapSpec, fd: int, path: str | None = None) -> None:
        self.spec = spec
        self.fd = fd
        self.path = path
        # Made by this process with nothing copied in (no pin to reuse, resize or upgrade from): it
        # holds no entry a start-of-day sweep would have to look for.
        self.created_empty = False
        self._no_batch = False  # the kernel refused a batch command for this map: one by one from then on

    def get(self, key: Any) -> Any:
        raw = sc.map_lookup(self.fd, self._key(key), self._raw_value_size())
        return None if raw is None else self._decode_value(raw)

    def set(self, key: Any, value: Any, flags: int = sc.ANY) -> None:
        sc.map_update(self.fd, self._key(key), self._encode_value(value), flags)

    def set_many(self, items: Sequence[tuple[Any, Any]], flags: int = sc.ANY) -> None:
        """:meth:`MapCodec.set_many` in ``BPF_MAP_UPDATE_BATCH`` calls of up to :data:`BATCH_CHUNK`
        elements (a bulk write -- an IP set's members -- costs a syscall per chunk, not per element).
        Where the kernel stops, the rest goes one by one, so a bad element fails with its own error
        and its index; a map type without batch operations (refused before the first element, and
        every element then written alone) is written one by one from then on."""
        if self._no_batch or self.spec.percpu or len(items) < 2:
            MapCodec.set_many(self, items, flags)
            return
        done = 0
        ksize = self.spec.key_size
        while done < len(items):
            chunk = items[done:done + BATCH_CHUNK]
            # (Keys already bytes of the right size -- an IP set's -- are taken as they are; one value
            # object for every element is encoded once.)
            keys = b"".join(k if type(k) is bytes and len(k) == ksize else self._key(k) for k, _ in chunk)
            first = chunk[0][1]
            if all(v is first for _, v in chunk):
                values = self._encode_value(first) * len(chunk)
            else:
                values = b"".join(self._encode_value(v) for _, v in chunk)
            try:
                sc.map_update_batch(self.fd, keys, values, len(chunk), flags)
            except sc.BatchIncomplete as e:
                at = done + e.done
                try:
                    MapCodec.set_many(self, items[at:], flags)
                except WriteIncomplete as w:
                    raise WriteIncomplete(w.cmd, w.errno, at + w.done) from w
                if e.done == 0 and e.errno in _NO_BATCH_ERRNOS:
                    self._batches_refused(e)
                return
            done += len(chunk)

    def _batches_refused(self, e: BPFSyscallError) -> None:
        log.info("BPF map type has no batch operations; one element at a time", map=self.spec.name,
                 cmd=e.cmd, errno=e.errno)
        self._no_batch = True

    def delete(self, key: Any) -> bool:
        return sc.map_delete(self.fd, self._key(key))

    def delete_many(self, keys: Sequence[Any]) -> int:
        """:meth:`MapCodec.delete_many` in ``BPF_MAP_DELETE_BATCH`` calls of up to :data:`BATCH_CHUNK`
        keys.  The kernel stops a batch at an absent key (ENOENT): that key is skipped and the batch goes
        on after it, so the result equals the one-by-one loop's.  Where the kernel stops for another
        reason the rest goes one by one, so a failing key fails with its own error and its index; a map
        type without batch operations is handled one by one from then on."""
        if self._no_batch or len(keys) < 2:
            return MapCodec.delete_many(self, keys)
        ksize = self.spec.key_size
        raw = [k if type(k) is bytes and len(k) == ksize else self._key(k) for k in keys]
        deleted = done = 0
        while done < len(raw):
            chunk = raw[done:done + BATCH_CHUNK]
            try:
                sc.map_delete_batch(self.fd, b"".join(chunk), len(chunk))
            except sc.BatchIncomplete as e:
                deleted += e.done
                done += e.done
                if e.errno == errno.ENOENT:
                    done += 1  # absent: nothing to delete, not an error
                    continue
                try:
                    deleted += MapCodec.delete_many(self, raw[done:])
                except WriteIncomplete as w:
                    raise WriteIncomplete(w.cmd, w.errno, done + w.done) from w
                if e.done == 0 and e.errno in _NO_BATCH_ERRNOS:
                    self._batches_refused(e)
                return deleted
            deleted += len(chunk)
            done += len(chunk)
        return deleted

    def _chunks(self, values: bool = True) -> Iterator[tuple[bytes, bytes, int]]:
        """The whole map as ``(packed keys, packed raw values, n)`` chunks, lazily: ``BPF_MAP_LOOKUP_BATCH``
        of :data:`BATCH_CHUNK` elements (one syscall per chunk, not one or two per element), or, for a
        map type the kernel refuses that for, ``BPF_MAP_GET_NEXT_KEY`` (plus a lookup when *values*)
        one element a chunk.  The kernel's cursor between chunks is the last key read for arrays and
        LPM tries (see :func:`~felixpy.bpf.syscall.map_lookup_batch`): a caller that deletes must
        read to the end first."""
        ks, vs = self.spec.key_size, self._raw_value_size()
        cursor: bytes | None = None
        first = True
        while not self._no_batch:
            try:
                keys, vals, n, cursor = sc.map_lookup_batch(self.fd, cursor, BATCH_CHUNK, ks, vs)
            except BPFSyscallError as e:
                if not first or e.errno not in _NO_BATCH_ERRNOS:
                    raise
                self._batches_refused(e)
                break
            first = False
            if n:
                yield keys, vals, n
            if cursor is None:
                return
        k: bytes | None = None
        while (k := sc.map_next_key(self.fd, k, ks)) is not None:
            if not values:
                yield k, b"", 1
            elif (v := sc.map_lookup(self.fd, k, vs)) is not None:  # (None: deleted meanwhile)
                yield k, v, 1

    def raw_keys(self) -> Iterator[bytes]:
        """Every key as bytes, lazily (a chunk at a time: see :meth:`_chunks` before deleting)."""
        ks = self.spec.key_size
        for keys, _, n in self._chunks(values=False):
            for off in range(0, n * ks, ks):
                yield keys[off:off + ks]

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, raw value) as bytes, lazily (a chunk at a time: see :meth:`_chunks` before
        deleting).  Per-CPU values are every CPU's, as :meth:`get` reads them."""
        ks, vs = self.spec.key_size, self._raw_value_size()
        for keys, vals, n in self._chunks():
            for i in range(n):
                yield keys[i * ks:(i + 1) * ks], vals[i * vs:(i + 1) * vs]

    def keys(self) -> Iterator[Any]:
        # The whole map is read (packed, a few bytes objects a chunk) before the first key is yielded,
        # so the caller may delete as it goes.
        kt, ks = self.spec.key_type, self.spec.key_size
        for keys, _, n in list(self._chunks(values=False)):
            for i in range(n):
                yield kt.from_buffer_copy(keys, i * ks)

    def items(self) -> Iterator[tuple[Any, Any]]:
        # Read whole first, as keys().
        kt, ks, vs = self.spec.key_type, self.spec.key_size, self._raw_value_size()
        for keys, vals, n in list(self._chunks()):
            for i in range(n):
                yield kt.from_buffer_copy(keys, i * ks), self._decode_value(vals[i * vs:(i + 1) * vs])

    def clear(self) -> int:
        if self.spec.map_type in (sc.MAP_TYPE_ARRAY, sc.MAP_TYPE_PERCPU_ARRAY):
            zero = bytes(self.spec.value_size)
            for i in range(self.spec.max_entries):
                self.set(i, zero)
            return self.spec.max_entries
        if self.spec.map_type == sc.MAP_TYPE_PROG_ARRAY:
            n = 0
            for i in range(self.spec.max_entries):
                n += self.delete(i)
            return n
        return self.delete_many(list(self.raw_keys()))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- lifecycle --------------------------------------------------------------------------------

    @classmethod
    def create(cls, spec: MapSpec) -> Map:
        fd = sc.map_create(spec.map_type, spec.key_size, spec.value_size, spec.max_entries,
                           flags=spec.flags, name=spec.name)
        return cls(spec, fd)

    @classmethod
    def open_or_create(cls, spec: MapSpec, pin_root: str) -> Map:
        path = os.path.join(pin_root, spec.name)
        if os.path.exists(path):
            fd = sc.obj_get(path)
            info = sc.map_info(fd)
            if (info.type, info.key_size, info.value_size, info.flags) == (
                    spec.map_type, spec.key_size, spec.value_size, spec.flags):
                if info.max_entries != spec.max_entries and spec.base in COPY_ON_RESIZE:
                    return cls._resized(spec, cls(spec.sized(info.max_entries), fd, path), path)
                if info.max_entries != spec.max_entries:
                    log.info("bpf map size differs; keeping existing", map=spec.name,
                             pinned=info.max_entries, wanted=spec.max_entries)
                    spec = spec.sized(info.max_entries)
                return cls(spec, fd, path)
            os.close(fd)
            log.warning("bpf map layout changed; replacing pin", map=spec.name,
                        pinned=(info.type, info.key_size, info.value_size, info.flags))
            os.unlink(path)
        m = cls.create(spec)
        try:
            sc.obj_pin(m.fd, path)
        except BPFSyscallError as e:
            m.close()
            if e.errno == errno.EEXIST:  # raced with another process: use theirs
                return cls.open_or_create(spec, pin_root)
            raise
        m.path = path
        m.created_empty = m._upgrade_from_old_versions(pin_root) == 0
        return m

    @classmethod
    def _resized(cls, spec: MapSpec, old: Map, path: str) -> Map:
        """A new map at the wanted size holding every entry of *old* (as many as fit), pinned in its place."""
        new = cls.create(spec)
        copied = dropped = 0
        # (Lazily: the conntrack maps are hash maps, whose walk's cursor is a bucket, so what the programs
        # add or the LRU evicts meanwhile does not upset it.)
        for k, v in old.raw_items():
            try:
                sc.map_update(new.fd, k, v)
                copied += 1
            except BPFSyscallError as e:
                if e.errno != errno.E2BIG:
                    new.close()
                    old.close()
                    raise
                dropped += 1
        os.unlink(path)
        sc.obj_pin(new.fd, path)
        new.path = path
        old.close()
        log.info("bpf map resized; entries copied", map=spec.name, pinned=old.spec.max_entries,
                 wanted=spec.max_entries, copied=copied, dropped=dropped)
        return new

    def _upgrade_from_old_versions(self, pin_root: str) -> int:
        """Convert the newest older version's entries into this (new) map; unlink older pins.
        Returns how many entries were converted."""
        spec = self.spec
        newest = True
        total = 0
        for old_version in range(spec.version - 1, 0, -1):
            old_path = os.path.join(pin_root, _pinned_name(spec.base, old_version))
            if not os.path.exists(old_path):
                continue
            steps = [UPGRADES.get((spec.base, v)) for v in range(old_version, spec.version)]
            migrate, newest = newest and all(steps), False  # only the newest old version is migrated
            converted = 0
            if migrate:
                fd = sc.obj_get(old_path)
                try:
                    info = sc.map_info(fd)
                    k: bytes | None = None
                    while (k := sc.map_next_key(fd, k, info.key_size)) is not None:
                        raw = sc.map_lookup(fd, k, info.value_size)
                        kv: tuple[bytes, bytes] | None = (k, raw) if raw is not None else None
                        for step in steps:
                            if kv is None:
                                break
                            kv = step(*kv)  # type: ignore[misc]
                        if kv is not None:
                            with contextlib.suppress(BPFSyscallError):  # full: keep what fits
                                sc.map_update(self.fd, kv[0], kv[1], sc.NOEXIST)
                                converted += 1
                finally:
                    os.close(fd)
            log.info("bpf map layout upgraded from an older version", map=spec.name,
                     old=_pinned_name(spec.base, old_version), converted=converted, migrated=migrate)
            os.unlink(old_path)
            total += converted
        return total


# ---------------------------------------------------------------------------------------------
# bpffs


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_long * 15)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def is_bpffs(path: str) -> bool:
    st = _Statfs()
    if _libc.statfs(path.encode(), ctypes.byref(st)) != 0:
        return False
    return bool((st.f_type & 0xFFFFFFFF) == BPF_FS_MAGIC)


def mount_bpffs(path: str) -> None:
    """Mount a fresh bpffs instance at ``path`` (created if absent)."""
    os.makedirs(path, exist_ok=True)
    if _libc.mount(b"bpf", path.encode(), b"bpf", 0, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount -t bpf {path}: {os.strerror(err)}")


def unmount(path: str) -> None:
    if _libc.umount2(path.encode(), 2) != 0:  # MNT_DETACH
        err = ctypes.get_errno()
        raise OSError(err, f"umount {path}: {os.strerror(err)}")


def on_bpffs(path: str) -> bool:
    """Whether *path* (or, where it does not exist yet, its nearest existing parent) is on a bpffs."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return is_bpffs(p)


def ensure_pin_root(pin_root: str, bpffs_mount: str = "/sys/fs/bpf") -> None:
    """Make sure ``pin_root`` lives on a bpffs, mounting one at ``bpffs_mount`` if needed.

    Only the daemon calls this with the default root; tests use :func:`private_bpffs`."""
    if not on_bpffs(pin_root) and not is_bpffs(bpffs_mount):
        log.info("mounting bpffs", path=bpffs_mount)
        mount_bpffs(bpffs_mount)
    os.makedirs(pin_root, exist_ok=True)


@contextlib.contextmanager
def private_bpffs(parent: str | None = None) -> Iterator[str]:
    """A throwaway bpffs mounted on a temp dir (for tests and benchmarks); unmounted on exit."""
    import tempfile

    d = tempfile.mkdtemp(prefix="felixpy-bpffs-", dir=parent)
    mount_bpffs(d)
    try:
        yield d
    finally:
        with contextlib.suppress(OSError):
            unmount(d)
        with contextlib.suppress(OSError):
            os.rmdir(d)


# ---------------------------------------------------------------------------------------------


# Map names by hook (defs.HOOK_*), for the lookups every policy-slot write makes.
_PROGS_BY_HOOK = {defs.HOOK_TC_INGRESS: PROGS_ING.name, defs.HOOK_TC_EGRESS: PROGS_EGR.name,
                  defs.HOOK_XDP: XDP_PROGS.name}
_JUMPS_BY_HOOK = {defs.HOOK_TC_INGRESS: JUMP_ING.name, defs.HOOK_TC_EGRESS: JUMP_EGR.name,
                  defs.HOOK_XDP: XDP_JUMP.name}


@dataclass
class MapSet:
    """Every shared map, opened (or created and pinned) under one pin root."""

    pin_root: str
    sizes: Mapping[str, int] = field(default_factory=dict)
    maps: dict[str, Map] = field(default_factory=dict)

    def ensure(self) -> MapSet:
        os.makedirs(self.pin_root, exist_ok=True)
        for spec in ALL_SPECS:
            if spec.name in self.maps:
                continue
            if spec.name in self.sizes:
                spec = spec.sized(self.sizes[spec.name])
            self.maps[spec.name] = Map.open_or_create(spec, self.pin_root)
        return self

    def __getitem__(self, name: str) -> Map:
        return self.maps[name]

    def ct(self, v6: bool) -> Map:
        return self.maps[(CT6 if v6 else CT4).name]

    def ipsets(self, v6: bool) -> Map:
        return self.maps[(IPSETS6 if v6 else IPSETS4).name]

    def routes(self, v6: bool) -> Map:
        return self.maps[(ROUTES6 if v6 else ROUTES4).name]

    def failsafes(self, v6: bool) -> Map:
        return self.maps[(FSAFES6 if v6 else FSAFES4).name]

    @property
    def ifstate(self) -> Map:
        return self.maps[IFSTATE.name]

    @property
    def state(self) -> Map:
        return self.maps[STATE.name]

    @property
    def counters(self) -> Map:
        return self.maps[COUNTERS.name]

    @property
    def ap_globals(self) -> Map:
        return self.maps[AP_GLOBALS.name]

    @property
    def xdp_globals(self) -> Map:
        return self.maps[XDP_GLOBALS.name]

    def progs(self, hook: int) -> Map:
        return self.maps[_PROGS_BY_HOOK[hook]]

    def jumps(self, hook: int) -> Map:
        return self.maps[_JUMPS_BY_HOOK[hook]]

    def close(self) -> None:
        for m in self.maps.values():
            m.close()
        self.maps.clear()


def counters_total(m: BPFMap, ifindex: int, hook: int) -> list[int]:
    """Sum a counters entry over CPUs; zeros if absent."""
    v = m.get(mt.CountersKey(ifindex, hook))
    if v is None:
        return [0] * len(mt.CountersValue().c)
    return [sum(cpu.c[i] for cpu in v) for i in range(len(v[0].c))]


def ensure_counters(m: BPFMap, ifindex: int, hook: int) -> None:
    """Create a zeroed counters entry (programs drop packets when theirs is missing)."""
    with contextlib.suppress(BPFSyscallError):
        m.set(mt.CountersKey(ifindex, hook), mt.CountersValue(), sc.NOEXIST)
