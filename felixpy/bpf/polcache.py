"""The on-disk cache of generated policy-program bytecode: a fresh start (node reboot, a new pin
root) loads its policy programs without generating them again.

What it owns: the files ``<cache dir>/policy/<key>.bin`` (the cache directory is the compile cache's,
:func:`felixpy.bpf.objcache.cache_dir`: ``FELIXPY_BPF_CACHE_DIR``, default ``/var/lib/felixpy/bpf``;
empty turns both caches off) and nothing in the kernel.

The key is everything the bytecode depends on (:func:`entry_key`): the program's cache key as
:class:`~felixpy.bpf.policyload.PolicyPrograms` makes it -- the policy set, hook, family, XDP slots,
the IP-set ids the program embeds, ``max_jumps``/``max_insns``, all in its ``repr`` -- plus the
generator fingerprint (:func:`~felixpy.bpf.policyload.generator_fingerprint`, a digest of the
generator's source files), this file format and the Python version (the generator parses CIDRs with
the standard library).  The map file descriptors are the one thing that differs between processes:
each ``ld_imm64`` map reference is recorded as the *role* of the map (state, IP sets, programs, policy
jumps: :class:`~felixpy.bpf.polprog.ProgramMaps`' fields, in order) with its immediate zeroed, and the
current process's fds are patched in on :meth:`PolicyBytecodeCache.get`.

An entry is ``MAGIC``, the format version, a SHA-256 of the rest and the rest: a JSON header (the key,
each part's length, the relocations) and the instructions.  A file that is short, of another version,
whose checksum does not match, that names another key, or whose relocations do not point at a
zeroed map load is a miss (logged once per entry) and is overwritten when the program is generated
again: a corrupt, truncated or stale entry is never loaded.  Entries are written atomically (temp
file + rename, no fsync: a torn file after a crash fails its checksum).  The cache is bounded: past
``max_entries`` files or ``max_bytes`` the least recently used (by mtime: a hit touches its file) go
until it is at 7/8 of either bound.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from felixpy.bpf.polprog import ProgramMaps

log = structlog.get_logger(__name__)

SUBDIR = "policy"
MAGIC = b"FPYPOLBC"
FORMAT = 1
_HEAD = struct.Struct("<8sI32sI")  # magic, format, sha256(rest), header length
_LD_IMM64 = 0x18
_PSEUDO_MAP_FD = 1
# An aligned ld_imm64 whose source register says "map fd" (any destination register).
_MAP_LOAD = re.compile(rb"\x18[\x10-\x1f]")
ROLES = ("state", "ipsets", "progs", "jumps")  # ProgramMaps' fields: a relocation names one by index
DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_BYTES = 64 << 20
_TMP_PREFIX = ".tmp-"


def entry_key(generator: str, key_repr: str) -> str:
    """The cache key of a program whose :class:`PolicyPrograms` key has ``repr`` *key_repr*, built by
    the generator with fingerprint *generator*."""
    h = hashlib.sha256(f"format {FORMAT}\0{generator}\0{sys.version}\0".encode())
    h.update(key_repr.encode())
    return h.hexdigest()


def _map_loads(insns: bytes | bytearray) -> list[int]:
    """Instruction indices of the map-fd ``ld_imm64`` loads in *insns*."""
    return [m.start() // 8 for m in _MAP_LOAD.finditer(insns) if not m.start() % 8]


def _fds(maps: ProgramMaps) -> tuple[int, int, int, int]:
    return (maps.state, maps.ipsets, maps.progs, maps.jumps)


def encode(key: str, parts: Sequence[bytes], maps: ProgramMaps) -> bytes | None:
    """The entry for *parts* (built with *maps*' fds), or None when a map reference is not one of
    *maps* or two roles share an fd (nothing could say which to patch in)."""
    role_of = {fd: i for i, fd in enumerate(_fds(maps))}
    if len(role_of) != len(ROLES):
        return None
    relocs: list[list[int]] = []
    out = bytearray()
    for p, insns in enumerate(parts):
        base = len(out)
        out += insns
        for idx in _map_loads(insns):
            fd = struct.unpack_from("<i", insns, idx * 8 + 4)[0]
            role = role_of.get(fd)
            if role is None:
                return None
            relocs.append([p, idx, role])
            out[base + idx * 8 + 4:base + idx * 8 + 8] = bytes(4)
    header = json.dumps({"key": key, "parts": [len(x) for x in parts], "maps": relocs},
                        separators=(",", ":")).encode()
    rest = header + bytes(out)
    return _HEAD.pack(MAGIC, FORMAT, hashlib.sha256(rest).digest(), len(header)) + rest


def decode(blob: bytes, key: str, maps: ProgramMaps) -> list[bytes]:
    """The parts an entry holds, with *maps*' fds patched in; ValueError when the entry is not one
    this process may load (see the module doc)."""
    if len(blob) < _HEAD.size:
        raise ValueError("truncated header")
    magic, fmt, digest, hlen = _HEAD.unpack_from(blob)
    if magic != MAGIC or fmt != FORMAT:
        raise ValueError(f"not a format {FORMAT} entry")
    rest = memoryview(blob)[_HEAD.size:]
    if hashlib.sha256(rest).digest() != digest:
        raise ValueError("checksum mismatch")
    if hlen > len(rest):
        raise ValueError("truncated header")
    header = json.loads(bytes(rest[:hlen]))
    if header.get("key") != key:
        raise ValueError("another key's entry")
    sizes = [int(n) for n in header["parts"]]
    code = rest[hlen:]
    if not sizes or any(n <= 0 or n % 8 for n in sizes) or sum(sizes) != len(code):
        raise ValueError("part lengths do not match the instructions")
    fds = _fds(maps)
    parts = []
    start = 0
    for n in sizes:
        parts.append(bytearray(code[start:start + n]))
        start += n
    relocs = [(int(p), int(idx), int(role)) for p, idx, role in header["maps"]]
    if sorted((p, idx) for p, idx, _r in relocs) != [(p, idx) for p, x in enumerate(parts) for idx in _map_loads(x)]:
        raise ValueError("the relocations are not the entry's map loads")
    for p, idx, role in relocs:
        insns = parts[p]
        at = idx * 8
        if not (0 <= role < len(ROLES) and at + 16 <= len(insns) and not any(insns[at + 4:at + 8])):
            raise ValueError("a relocation does not point at a zeroed map load")
        struct.pack_into("<i", insns, at + 4, fds[role])
    return [bytes(x) for x in parts]


@dataclass
class PolicyBytecodeCache:
    """Policy programs' instructions on disk, by :func:`entry_key` (see the module doc)."""

    directory: str  # the compile cache's directory: entries go in its ``policy`` subdirectory
    max_entries: int = DEFAULT_MAX_ENTRIES
    max_bytes: int = DEFAULT_MAX_BYTES
    stats: dict[str, int] = field(default_factory=lambda: {"hits": 0, "misses": 0, "rejected": 0,
                                                           "stored": 0, "evicted": 0})
    _usage: tuple[int, int] | None = None  # (entries, bytes) once scanned; kept up to date by put()

    @property
    def path(self) -> str:
        return os.path.join(self.directory, SUBDIR)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, key + ".bin")

    def get(self, key: str, maps: ProgramMaps) -> list[bytes] | None:
        """The cached parts for *key* with *maps*' fds in them, or None (a miss: absent or unusable)."""
        path = self._file(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except OSError:
            self.stats["misses"] += 1
            return None
        try:
            parts = decode(blob, key, maps)
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as e:
            self.stats["rejected"] += 1
            log.warning("BPF policy bytecode cache entry not usable; generating", entry=key[:16], error=str(e))
            return None
        self.stats["hits"] += 1
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        return parts

    def put(self, key: str, parts: Sequence[bytes], maps: ProgramMaps) -> bool:
        """Store *parts* (built with *maps*' fds) under *key*, replacing any entry there."""
        blob = encode(key, parts, maps)
        if blob is None:
            log.debug("BPF policy program not cached: a map reference is not one of its maps", entry=key[:16])
            return False
        path = self._file(key)
        try:
            os.makedirs(self.path, exist_ok=True)
            if self._usage is None:
                self._usage = self._scan()
            try:
                replaced = os.stat(path).st_size
            except FileNotFoundError:
                replaced = -1
            # A name of its own per entry and process (mkstemp's random names were half a put's cost);
            # what a crashed writer left is overwritten by the next put of that key or swept by _scan.
            tmp = os.path.join(self.path, f"{_TMP_PREFIX}{key}.{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as e:
            log.warning("BPF policy bytecode cache not written", path=path, error=str(e))
            return False
        n, size = self._usage
        self._usage = (n + (replaced < 0), size + len(blob) - max(replaced, 0))
        self.stats["stored"] += 1
        if self._usage[0] > self.max_entries or self._usage[1] > self.max_bytes:
            self._evict()
        return True

    def _entries(self) -> list[tuple[float, int, str]]:
        """(mtime, size, path) of every entry."""
        out = []
        try:
            with os.scandir(self.path) as it:
                for e in it:
                    if e.name.endswith(".bin"):
                        with contextlib.suppress(OSError):
                            st = e.stat()
                            out.append((st.st_mtime, st.st_size, e.path))
        except FileNotFoundError:
            pass
        return out

    def _scan(self) -> tuple[int, int]:
        """(entries, bytes) of the cache, once per process; temp files a crashed writer left go."""
        entries = self._entries()
        cutoff = time.time() - 60
        with contextlib.suppress(OSError), os.scandir(self.path) as it:
            for e in it:
                if e.name.startswith(_TMP_PREFIX) and e.stat(follow_symlinks=False).st_mtime < cutoff:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
        return len(entries), sum(size for _t, size, _p in entries)

    def _evict(self) -> None:
        """Remove the least recently used entries until the cache is at 7/8 of both bounds."""
        entries = sorted(self._entries())
        n, size = len(entries), sum(e[1] for e in entries)
        keep_n, keep_bytes = self.max_entries * 7 // 8, self.max_bytes * 7 // 8
        gone = 0
        for _mtime, esize, path in entries:
            if n <= keep_n and size <= keep_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            n, size, gone = n - 1, size - esize, gone + 1
        self._usage = (n, size)
        self.stats["evicted"] += gone
        log.info("BPF policy bytecode cache trimmed", removed=gone, entries=n, bytes=size)
