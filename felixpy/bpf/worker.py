"""Compile and load variants in a short-lived worker process; hand the program fds back.

clang/LLVM inside bcc costs ~150 MiB of resident memory in whichever process compiles, and it is
not given back.  The daemon therefore never imports bcc itself: :class:`WorkerLoader` starts
``python -m felixpy.bpf.worker`` with one end of a Unix socketpair, the worker compiles and
loads the requested variants (through the same :func:`felixpy.bpf.build.load_variant`, so the
maps it binds are the shared pins), sends each program fd back with ``SCM_RIGHTS``, and exits.
The kernel keeps a program alive while any process holds an fd to it (or a prog array slot
does), so the programs outlive the worker.

Compiled variants are also kept on disk (:mod:`felixpy.bpf.objcache`): the worker writes each
variant it compiled to the cache, and :meth:`WorkerLoader.prefetch` loads every variant it finds
there in this process (bytecode through libbpf, no bcc), so a restarted daemon with a warm cache
spawns no worker at all.

Protocol (SOCK_SEQPACKET, one message per record):
  parent -> worker: JSON {"pin_root": str, "cache_dir": str | null,
                          "variants": [[program, hook, ep, ipv6, debug], ...]}
  worker -> parent: per program, JSON {"variant": i, "func": name, "compile_s": f} + 1 fd;
                    finally {"done": true} or {"error": "..."}.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from felixpy.bpf import objcache
from felixpy.bpf.build import EpType, Program, Variant
from felixpy.bpf.errors import CompileError


@dataclass
class WorkerLoaded:
    """Same shape as :class:`felixpy.bpf.build.Loaded` for what ProgramsMap uses."""

    variant: Variant
    fds: dict[str, int]
    compile_seconds: float = 0.0

    def fd(self, func: str) -> int:
        return self.fds[func]


def _encode(v: Variant) -> list[object]:
    return [v.program.value, v.hook, v.ep.value, v.ipv6, v.debug]


def _decode(x: list[object]) -> Variant:
    return Variant(Program(x[0]), int(str(x[1])), EpType(x[2]), bool(x[3]), bool(x[4]))


@dataclass
class WorkerLoader:
    """Loads variants via a worker process; caches per variant like the in-process loader."""

    pin_root: str
    cache_dir: str | None = field(default_factory=objcache.cache_dir)  # None: no on-disk cache
    _cache: dict[Variant, WorkerLoaded] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    spawns: int = 0
    disk_hits: int = 0

    def __call__(self, variant: Variant, pin_root: str) -> WorkerLoaded:
        assert pin_root == self.pin_root
        got = self._cache.get(variant)
        if got is None:
            self.prefetch([variant])
            got = self._cache[variant]
        return got

    def prefetch(self, variants: list[Variant]) -> None:
        """Compile every not-yet-loaded variant in one worker run."""
        with self._lock:
            todo = [v for v in dict.fromkeys(variants) if v not in self._cache]
            if self.cache_dir is not None:
                for v in list(todo):
                    cached = objcache.load(self.cache_dir, v, self.pin_root)
                    if cached is not None:
                        self._cache[v] = WorkerLoaded(v, cached)
                        self.disk_hits += 1
                        todo.remove(v)
            if not todo:
                return
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "felixpy.bpf.worker", str(child.fileno())],
                    pass_fds=(child.fileno(),), env=os.environ.copy())
                self.spawns += 1
                child.close()
                parent.send(json.dumps({"pin_root": self.pin_root, "cache_dir": self.cache_dir,
                                        "variants": [_encode(v) for v in todo]}).encode())
                results: dict[int, WorkerLoaded] = {}
                while True:
                    msg, fds, _flags, _addr = socket.recv_fds(parent, 65536, 1)
                    if not msg:
                        raise CompileError("bpf worker exited without finishing")
                    rec = json.loads(msg)
                    if rec.get("done"):
                        break
                    if "error" in rec:
                        raise CompileError(f"bpf worker: {rec['error']}")
                    i = rec["variant"]
                    wl = results.setdefault(i, WorkerLoaded(todo[i], {}))
                    wl.fds[rec["func"]] = fds[0]
                    wl.compile_seconds = rec.get("compile_s", 0.0)
                proc.wait(timeout=60)
            finally:
                parent.close()
            for i, wl in results.items():
                self._cache[todo[i]] = wl

    def close(self) -> None:
        for wl in self._cache.values():
            for fd in wl.fds.values():
                os.close(fd)
        self._cache.clear()


def _serve(sock: socket.socket) -> None:
    from felixpy.bpf import build

    req = json.loads(sock.recv(65536))
    try:
        for i, enc in enumerate(req["variants"]):
            v = _decode(enc)
            loaded = build.load_variant(v, req["pin_root"])
            if req.get("cache_dir"):
                objcache.store(req["cache_dir"], v, {f: loaded.bpf.dump_func(f.encode()) for f in loaded.fds})
            for func, fd in loaded.fds.items():
                socket.send_fds(sock, [json.dumps({"variant": i, "func": func,
                                                   "compile_s": loaded.compile_seconds}).encode()],
                                [fd])
        sock.send(json.dumps({"done": True}).encode())
    except Exception as e:  # report, then exit non-zero
        sock.send(json.dumps({"error": str(e)[-4000:]}).encode())
        raise


if __name__ == "__main__":
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    _serve(socket.socket(fileno=int(sys.argv[1])))
