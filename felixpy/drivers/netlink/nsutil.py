"""Run a callable with the calling thread inside a named network namespace.

Only used to *open* sockets (a netlink socket stays bound to the namespace it
was created in) and to *fork* children (:mod:`felixpy.drivers.cmdshim`: a child
is born in its parent thread's namespace).  A missing namespace is an error; nothing is ever created.
Failing to switch back is fatal: later work would silently act on the wrong
namespace, so we raise SystemExit rather than carry on.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def call_in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    if netns is None:
        return fn()
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)  # FileNotFoundError if missing
    try:
        orig = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
        try:
            _setns(target)
            try:
                return fn()
            finally:
                try:
                    _setns(orig)
                except OSError as exc:  # pragma: no cover - would need a broken kernel
                    raise SystemExit(f"cannot return to the original network namespace: {exc}") from exc
        finally:
            os.close(orig)
    finally:
        os.close(target)
