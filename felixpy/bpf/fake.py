"""An in-memory fake of a BPF map (:class:`FakeMap`) for tests, with the kernel's semantics.

It offers the :class:`~felixpy.bpf.maps.BPFMap` interface over a dict of raw key/value bytes,
encoded exactly as :class:`~felixpy.bpf.maps.Map` encodes them for the kernel: hash and array
maps (arrays pre-filled with zeros, out-of-range index is E2BIG), LPM-trie longest-prefix lookup,
per-CPU values as lists, ``max_entries`` (E2BIG when a new key would not fit) and the update
flags (``NOEXIST``/``EXIST``).  Bulk writes and deletes (``set_many``/``delete_many``) are the
element-by-element loops :class:`~felixpy.bpf.maps.Map` falls back to, with the same results.
Failure injection: :attr:`FakeMap.fail_next_update`, :attr:`FakeMap.fail_deletes`.
``tests/bpf/test_fakemap.py`` checks parity with the kernel for the same operations.

:class:`InlineExecutor` runs what is submitted to it at once, on the caller's thread: the fakes'
background writes (policy sources) are done when the call that queues them returns.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFSyscallError
from felixpy.bpf.maps import MapCodec, MapSpec


class FakeMap(MapCodec):
    """In-memory stand-in with the same interface and semantics: hash, array, LPM-trie
    longest-prefix lookup, per-CPU lists, ``max_entries`` (E2BIG when full), update flags."""

    def __init__(self, spec: MapSpec) -> None:
        self.spec = spec
        self._d: dict[bytes, bytes] = {}
        if spec.map_type in (sc.MAP_TYPE_ARRAY, sc.MAP_TYPE_PERCPU_ARRAY):
            zero = self._encode_value(bytes(spec.value_size))
            for i in range(spec.max_entries):
                self._d[i.to_bytes(4, "little")] = zero
        self.fail_next_update: int | None = None  # failure injection: errno for the next set()
        self.fail_deletes: dict[bytes, int] = {}  # failure injection: raw key -> errno its delete fails with
        self.created_empty = False  # as a reopened pin: sweeps look (Map sets it for a map it made)

    def _lpm_lookup(self, key: bytes) -> bytes | None:
        want_bits = int.from_bytes(key[:4], "little")
        data = key[4:]
        best: tuple[int, bytes] | None = None
        for k, v in self._d.items():
            plen = int.from_bytes(k[:4], "little")
            if plen > want_bits:
                continue
            if _prefix_equal(k[4:], data, plen) and (best is None or plen > best[0]):
                best = (plen, v)
        return None if best is None else best[1]

    def get(self, key: Any) -> Any:
        kb = self._key(key)
        raw = self._lpm_lookup(kb) if self.spec.map_type == sc.MAP_TYPE_LPM_TRIE else self._d.get(kb)
        return None if raw is None else self._decode_value(raw)

    def set(self, key: Any, value: Any, flags: int = sc.ANY) -> None:
        if self.fail_next_update is not None:
            err, self.fail_next_update = self.fail_next_update, None
            raise BPFSyscallError("BPF_MAP_UPDATE_ELEM", err)
        kb = self._key(key)
        exists = kb in self._d
        if flags == sc.NOEXIST and exists:
            raise BPFSyscallError("BPF_MAP_UPDATE_ELEM", errno.EEXIST)
        if flags == sc.EXIST and not exists:
            raise BPFSyscallError("BPF_MAP_UPDATE_ELEM", errno.ENOENT)
        if self.spec.map_type in (sc.MAP_TYPE_ARRAY, sc.MAP_TYPE_PERCPU_ARRAY, sc.MAP_TYPE_PROG_ARRAY):
            if int.from_bytes(kb, "little") >= self.spec.max_entries:
                raise BPFSyscallError("BPF_MAP_UPDATE_ELEM", errno.E2BIG)
        elif not exists and len(self._d) >= self.spec.max_entries:
            raise BPFSyscallError("BPF_MAP_UPDATE_ELEM", errno.E2BIG)
        self._d[kb] = self._encode_value(value)

    def delete(self, key: Any) -> bool:
        kb = self._key(key)
        if kb in self.fail_deletes:
            raise BPFSyscallError("BPF_MAP_DELETE_ELEM", self.fail_deletes[kb])
        return self._d.pop(kb, None) is not None

    def keys(self) -> Iterator[Any]:
        for k in list(self._d):
            yield self._decode_key(k)

    def raw_keys(self) -> Iterator[bytes]:
        return iter(list(self._d))

    def items(self) -> Iterator[tuple[Any, Any]]:
        for k, v in list(self._d.items()):
            yield self._decode_key(k), self._decode_value(v)

    def clear(self) -> int:
        n = len(self._d)
        self._d.clear()
        return n

    def __len__(self) -> int:
        return len(self._d)


def _prefix_equal(a: bytes, b: bytes, bits: int) -> bool:
    full, rem = divmod(bits, 8)
    if a[:full] != b[:full]:
        return False
    if rem:
        mask = (0xFF << (8 - rem)) & 0xFF
        return (a[full] & mask) == (b[full] & mask)
    return True


_P = ParamSpec("_P")
_T = TypeVar("_T")


class InlineExecutor(Executor):
    """An executor that runs each call when it is submitted and returns its finished future."""

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        f: Future[_T] = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as e:
            f.set_exception(e)
        return f
