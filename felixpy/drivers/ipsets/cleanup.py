"""Cleanup-only driver: destroys the kernel ipsets an earlier iptables-mode run left, in nftables mode.

In nftables mode Calico's IP sets are nft sets inside the ``calico`` table, so
no ipset driver runs; Felix registers an ipset dataplane with nothing desired
for cleanup.  :class:`IPSetsCleanup` is that driver for one IP family.

What it owns
    Every kernel ipset whose name is Calico's for this family
    (:meth:`~.naming.IPVersionConfig.owns`: ``cali4…``/``felix-4…`` and the two
    legacy IPv4 names, or ``cali6…``/``felix-6…``); all of them are stale in
    nftables mode.  Other sets are never touched.

How a fresh process recognises them
    By name alone: one ``ipset list -name``.

Apply contract
    Registered after the family's iptables-backend cleanups and run in the same
    cleanup step after them (after the active nftables table was written), so the
    iptables rules that referenced these sets are already gone.  One ``ipset
    restore`` of ``destroy`` lines per apply; if the kernel refuses it (a set
    still in use by a foreign rule), each set is destroyed on its own and the
    ones still in use are reported and retried on the next apply
    (:class:`~felixpy.errors.DataplaneError`, never fatal).  Done once a listing
    finds none of ours; :meth:`queue_resync` re-arms it.
"""

from __future__ import annotations

import structlog

from felixpy.drivers.cmdshim import CommandRunner
from felixpy.drivers.ipsets.naming import IPVersionConfig
from felixpy.errors import DataplaneError

log = structlog.get_logger(__name__)


class IPSetsCleanup:
    """Destroys this family's stale Calico ipsets (see the module doc)."""

    def __init__(self, ip_version: int, runner: CommandRunner) -> None:
        self.ip_version = ip_version
        self.name = "ipsets"
        self._naming = IPVersionConfig(ip_version)
        self._runner = runner
        self.done = False
        self.removed = 0

    def queue_resync(self) -> None:
        self.done = False

    def _ours(self) -> list[str] | None:
        res = self._runner.run(["ipset", "list", "-name"])
        if res.returncode == 127:
            return None  # no ipset tool: no kernel sets of ours either
        if not res.ok:
            raise DataplaneError(f"ipset list -name exited {res.returncode}: {res.stderr.strip()[:300]}")
        return sorted(n for n in res.stdout.split() if self._naming.owns(n))

    def apply(self) -> None:
        if self.done:
            return
        names = self._ours()
        if not names:
            self.done = True
            return
        log.info("Destroying Calico ipsets left by iptables mode", ip_version=self.ip_version, sets=len(names))
        res = self._runner.run(["ipset", "restore"], stdin="".join(f"destroy {n}\n" for n in names))
        if not res.ok:
            in_use = []
            for n in names:
                if not self._runner.run(["ipset", "destroy", n]).ok:
                    in_use.append(n)
            if in_use:
                self.removed += len(names) - len(in_use)
                raise DataplaneError(f"could not destroy {len(in_use)} stale Calico ipsets (in use?): "
                                     f"{', '.join(in_use[:5])}")
        self.removed += len(names)
        left = self._ours()
        if left:
            raise DataplaneError(f"{len(left)} stale Calico ipsets still listed after destroying them")
        self.done = True
