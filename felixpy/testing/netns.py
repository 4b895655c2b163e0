"""Throwaway network namespaces for tests, FV and benchmarks.

Nothing here ever touches the machine's root network namespace: every kernel
object a test creates lives in a namespace made by :func:`netns` and deleted on
exit, also when the test fails.  :func:`entered` moves the *calling thread* into
a namespace (``setns(2)``) and always moves it back, so in-process users —
libnftables over ctypes, pyroute2, and any subprocess forked meanwhile — act on
the namespace without ``ip netns exec``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def create(prefix: str = "fpy") -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    _run("ip", "netns", "add", name)
    # Loopback up: many tests talk to themselves.
    _run("ip", "-n", name, "link", "set", "lo", "up")
    return name


def delete(name: str, attempts: int = 5) -> None:
    """Kill the namespace's processes and delete it; raise if its name is still there afterwards.

    ``ip netns del`` lazily unmounts the name and unlinks it; that unlink fails (EBUSY) while the
    name is still a mount point, e.g. when it was mounted twice.  Each retry peels one more mount,
    and a name that stays is an error with iproute2's reason, not a silent leftover."""
    errors: list[str] = []
    for attempt in range(attempts):
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        done = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
        if not os.path.exists(f"/run/netns/{name}"):
            return
        errors.append(f"attempt {attempt + 1}: rc {done.returncode}: {done.stderr.strip() or '(no message)'}")
        time.sleep(0.1 * (attempt + 1))
    raise RuntimeError(f"network namespace {name} could not be deleted: " + "; ".join(errors))


@contextlib.contextmanager
def netns(prefix: str = "fpy") -> Iterator[str]:
    """Create a namespace, yield its name, delete it (and kill its processes)."""
    name = create(prefix)
    try:
        yield name
    finally:
        delete(name)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns failed: {os.strerror(err)}")


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the body with the calling thread inside namespace *name*."""
    orig = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            # Failing to get back would leave later work in the wrong namespace:
            # treat as fatal rather than carry on.
            _setns(orig)
    finally:
        os.close(target)
        os.close(orig)


def run_in(name: str, *args: str, check: bool = True, timeout: float = 30,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command inside namespace *name* (``ip netns exec``)."""
    return subprocess.run(["ip", "netns", "exec", name, *args], check=check, capture_output=True,
                          text=True, timeout=timeout, input=input)
