"""The BPF IP-set dataplane: IP-set members in the LPM maps ``cali_v4_ip_sets`` /
``cali_v6_ip_sets``, behind the same :class:`~felixpy.drivers.ipsets_api.IPSetsDataplane`
contract the ipset driver implements (so the IP-sets manager is the same in every mode).

What it owns: every entry of its family's IP-set map (key: 64-bit set id + address[, port,
protocol]; the id is a stable hash of the set's string id, :mod:`felixpy.bpf.ipsets`).

How a fresh process recognises them: the map is ours by pin path and name; on the first apply
every entry is read back and whatever no desired member accounts for is deleted
(mark-and-sweep), so a restart rewrites nothing that is still right.

Apply contract: members are written *before* the programs that reference them and cleared
*after*: :meth:`apply_updates` (run as a device syncer, before the endpoint driver swaps
programs) writes additions, member removals of live sets and whole new sets, but keeps the
members of removed sets; :meth:`apply_deletions` (the loop's IP-set deletion step, after the
*tables) clears those.  Only the difference is written.

Drift: a read-back after a refresh (``IpsetsRefreshInterval``) that finds members missing or
foreign against what this process wrote counts them as ``felixpy_drift_repairs{kind="bpf_set_member"}``
once the rewrite succeeded.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from felixpy.bpf.ipsets import BPFIPSets
from felixpy.drivers.bpfendpoints.kernel import BPFKernel
from felixpy.drivers.drift import DriftTally
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType



class BPFIPSetsDataplane:
    def __init__(self, ip_version: int, kernel: BPFKernel) -> None:
        self.ip_version = ip_version
        # The members live once, as map keys in the writer (a delta costs its own size, not the set's);
        # their strings are decoded back for the rare caller that needs them (raw egress policy's sets).
        self._sets = BPFIPSets(kernel.maps.ipsets(ip_version == 6), kernel.ipset_ids, ip_version == 6)
        self._types: dict[str, IPSetType] = {}
        self._removed: set[str] = set()
        self._drift = DriftTally(structlog.get_logger(__name__), map="ip_sets", ip_version=ip_version)

    # --------------------------------------------------------------------- desired state
    def status_counts(self) -> dict[str, int]:
        """For ``felixpy status``: the sets and members this family's LPM map is to hold (apart from
        the Linux IP sets BPF mode keeps for raw egress policy, which count as ``sets``)."""
        sets, members = self._sets.counts()
        for set_id in self._removed:  # removed, its members kept until the programs no longer use them
            size = self._sets.size(set_id)
            if size is not None:
                sets, members = sets - 1, members - size
        return {"bpf_sets": sets, "bpf_members": members}

    def add_or_replace_ip_set(self, meta: IPSetMetadata, members: Iterable[str]) -> None:
        self._types[meta.set_id] = meta.type
        self._removed.discard(meta.set_id)
        self._sets.replace(meta.set_id, members)

    def add_members(self, set_id: str, members: Iterable[str]) -> None:
        self._sets.add_members(set_id, members)

    def remove_members(self, set_id: str, members: Iterable[str]) -> None:
        self._sets.remove_members(set_id, members)

    def remove_ip_set(self, set_id: str) -> None:
        if set_id in self._sets:
            self._types.pop(set_id, None)
            self._removed.add(set_id)

    def get_type_of(self, set_id: str) -> IPSetType | None:
        return self._types.get(set_id)

    def get_desired_members(self, set_id: str) -> frozenset[str] | None:
        return None if set_id in self._removed else self._sets.members_of(set_id)

    # ------------------------------------------------------------------------------ apply
    def queue_resync(self) -> None:
        self._sets.queue_resync()

    def apply(self) -> None:
        self.apply_updates()

    def apply_updates(self) -> None:
        self._write()

    def _write(self) -> None:
        try:
            self._sets.apply()
        finally:
            self._drift.found("bpf_set_member", self._sets.take_drift())
        self._drift.repaired()

    def apply_deletions(self) -> bool:
        if self._removed:
            for set_id in sorted(self._removed):
                self._sets.remove(set_id)
            self._removed.clear()
            self._write()
        return False
