"""Host MTU detection and Felix's MTU file (one per node, not per IP family).

Felix finds the host MTU as the smallest MTU of the oper-up interfaces whose
names match ``MTUIfacePattern`` (1460 when none matches, the smallest common
cloud MTU), derives each encapsulation's MTU from it where none is configured,
and writes the pod MTU — the smallest MTU among the *enabled* encapsulations,
or the host MTU with none — to ``/var/lib/calico/mtu`` for the CNI plugin.
This is the one node-level object felixpy owns: it has no IP family, so it
exists once.

What it owns
    The MTU file (``/var/lib/calico/mtu`` unless ``FELIXPY_MTU_FILE`` names
    another path; tests point it into a temporary directory).

How a fresh process recognises it as ours
    By its path.  The first apply reads the file back and rewrites it only if
    its content differs, so a restart on an unchanged host writes nothing.

Apply contract
    ``apply()`` detects at start of day and then every ``interval`` seconds
    (Felix's 30 s loop; ``next_deadline()`` tells the loop), writes the file
    atomically (temporary file + rename) when the pod MTU changed, and logs the
    change.  Felix restarts itself when the host MTU changes; felixpy rewrites
    the file instead (new pods get the new MTU, and the tunnel-device syncer
    re-derives its automatic MTUs every 10 s), so no restart is needed.  A
    failed write raises :class:`~felixpy.errors.DataplaneError` and is retried.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import structlog

from felixpy.drivers.netlink.api import NetlinkFactory
from felixpy.drivers.netlink.handle import CachedHandle
from felixpy.errors import DataplaneError, FelixpyError

log = structlog.get_logger(__name__)

DEFAULT_MTU_FILE = "/var/lib/calico/mtu"
FALLBACK_HOST_MTU = 1460
DETECT_INTERVAL = 30.0


def mtu_file_path() -> str:
    return os.environ.get("FELIXPY_MTU_FILE", DEFAULT_MTU_FILE)


class HostMTU:
    def __init__(self, *, new_handle: NetlinkFactory, pattern: str, pod_mtu: Callable[[int], int],
                 path: str | None = None, clock: Callable[[], float] = time.monotonic,
                 interval: float = DETECT_INTERVAL) -> None:
        self._nl = CachedHandle(new_handle)
        self._pattern = re.compile(pattern) if pattern else None
        self._pod_mtu = pod_mtu
        self.path = path or mtu_file_path()
        self.clock = clock
        self.interval = interval
        self._due = 0.0
        self.host_mtu: int | None = None
        self.pod_mtu: int | None = None
        self._written: str | None = None  # what the file holds, as far as we know

    def queue_resync(self) -> None:
        self._due = 0.0
        self._written = None  # re-read the file too

    def next_deadline(self) -> float | None:
        return max(0.0, self._due - self.clock())

    def detect(self) -> int:
        """The smallest MTU of the oper-up interfaces matching the pattern (Felix's findHostMTU)."""
        smallest = 0
        for link in self._nl.get().link_list():
            if self._pattern is None or not self._pattern.search(link.name) or not link.oper_up:
                continue
            if smallest == 0 or link.mtu < smallest:
                smallest = link.mtu
        if smallest == 0:
            log.warning("No interface matches MTUIfacePattern; assuming host MTU 1460", pattern=self._pattern
                        and self._pattern.pattern)
            return FALLBACK_HOST_MTU
        return smallest

    def apply(self) -> None:
        if self.clock() < self._due:
            return
        try:
            host = self.detect()
        except FelixpyError:
            self._nl.drop()
            raise
        self._due = self.clock() + self.interval
        if host != self.host_mtu:
            if self.host_mtu is not None:
                log.info("Host MTU changed", old=self.host_mtu, new=host)
            self.host_mtu = host
        pod = self._pod_mtu(host)
        self.pod_mtu = pod
        want = str(pod)
        if self._written is None:
            self._written = self._read()
        if self._written == want:
            return
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            tmp = f"{self.path}.tmp-{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(want)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except OSError as exc:
            self._written = None
            self._due = 0.0
            raise DataplaneError(f"cannot write the MTU file {self.path}: {exc}") from exc
        log.info("Wrote the pod MTU for the CNI plugin", path=self.path, mtu=pod, host_mtu=host)
        self._written = want

    def _read(self) -> str | None:
        try:
            with open(self.path) as f:
                return f.read().strip()
        except OSError:
            return None

    def close(self) -> None:
        self._nl.drop()
