"""A filter in front of one family's Linux IP-set dataplane (Felix's ``IPSets.SetFilter``).

BPF mode keeps Calico's IP sets in the LPM maps, but untracked host-endpoint egress policy stays in
the raw table, and its rules match Linux IP sets (Felix: "In BPF mode we still use iptables for raw
egress policy, but we filter the IP sets that we render to the dataplane").  The one IP-sets
manager feeds both dataplanes; :class:`FilteredIPSets` hands the Linux one (the ipset driver, or
the nftables root in nftables mode) only the sets the filter names, so the kernel holds exactly
those.  The raw-egress policy manager sets the filter from the chains it renders
(:class:`~felixpy.drivers.ipsets_api.IPSetFilter`).

What it owns
    No kernel object of its own: the wrapped dataplane owns the sets, their naming, writes and
    resync.  Here: every known set's metadata, by Calico set ID, and the filter (rule-layer names,
    ``cali40s:…``).  The filter is empty until the first :meth:`FilteredIPSets.set_filter`, so
    nothing passes before the policy manager has spoken.

How a fresh process recognises them
    As the wrapped dataplane does, by name.  A set the filter leaves out is simply never desired
    there, so that dataplane's start-of-day mark-and-sweep removes any Calico set an earlier run
    (or an earlier mode) left; a set leaving the filter is removed like any removed set (destroyed
    at the deletion step, after the tables stopped referencing it).

Apply contract
    Update methods only record.  Updates of a set in the filter are passed on as they come; of any
    other set only its metadata is kept.  Members are not kept here: when a set enters the filter,
    its full membership is read from *members* (BPF mode: the LPM-map dataplane the same manager
    feeds), so each member is held once.  ``apply_updates``, ``apply_deletions`` and
    ``queue_resync`` are the wrapped dataplane's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set as AbstractSet

import structlog

from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.rules.ipset_names import main_ipset_name

log = structlog.get_logger(__name__)

MembersSource = Callable[[str], frozenset[str] | None]


class FilteredIPSets:
    """An :class:`~felixpy.drivers.ipsets_api.IPSetsDataplane` and
    :class:`~felixpy.drivers.ipsets_api.IPSetFilter` over *inner* (see the module doc)."""

    def __init__(self, inner: IPSetsDataplane, members: MembersSource) -> None:
        self.ip_version = inner.ip_version
        self._inner = inner
        self._members_of = members
        self._meta: dict[str, IPSetMetadata] = {}  # every set the manager sent, by set ID
        self._filter: frozenset[str] = frozenset()
        self._passed: set[str] = set()  # set IDs the wrapped dataplane has
        self._log = log.bind(ip_version=self.ip_version)

    def status_counts(self) -> dict[str, int]:
        """For ``felixpy status``: the wrapped ipset driver's counts (the Linux sets in the kernel); an
        nftables view has none of its own (its table counts its sets)."""
        inner = getattr(self._inner, "status_counts", None)
        return dict(inner()) if inner is not None else {}

    def _wanted(self, set_id: str) -> bool:
        return main_ipset_name(set_id, self.ip_version) in self._filter

    # ------------------------------------------------------------------ filter
    def set_filter(self, names: frozenset[str]) -> None:
        if names == self._filter:
            return
        self._filter = names
        for set_id in sorted(s for s in self._passed if not self._wanted(s)):
            self._log.info("IP set no longer used by untracked egress policy; removing it", set_id=set_id)
            self._passed.discard(set_id)
            self._inner.remove_ip_set(set_id)
        known = set()
        for set_id, meta in self._meta.items():
            if not self._wanted(set_id):
                continue
            known.add(main_ipset_name(set_id, self.ip_version))
            if set_id not in self._passed:
                self._log.info("IP set used by untracked egress policy; programming it", set_id=set_id)
                self._passed.add(set_id)
                self._inner.add_or_replace_ip_set(meta, self._members_of(set_id) or ())
        unknown = names - known
        if unknown:
            # The screen keeps rules from naming undefined sets; one here would fail the raw table.
            self._log.warning("Untracked egress policy names IP sets that are not defined", sets=sorted(unknown))

    def filtered(self) -> frozenset[str]:
        """For tests and observability: the set IDs the wrapped dataplane is to hold."""
        return frozenset(self._passed)

    # ------------------------------------------------------------------ IPSetsDataplane
    def add_or_replace_ip_set(self, meta: IPSetMetadata, members: Iterable[str]) -> None:
        self._meta[meta.set_id] = meta
        if self._wanted(meta.set_id):
            self._passed.add(meta.set_id)
            self._inner.add_or_replace_ip_set(meta, members)

    def add_members(self, set_id: str, members: Iterable[str]) -> None:
        if set_id in self._passed:
            self._inner.add_members(set_id, members)

    def remove_members(self, set_id: str, members: Iterable[str]) -> None:
        if set_id in self._passed:
            self._inner.remove_members(set_id, members)

    def remove_ip_set(self, set_id: str) -> None:
        self._meta.pop(set_id, None)
        if set_id in self._passed:
            self._passed.discard(set_id)
            self._inner.remove_ip_set(set_id)

    def get_type_of(self, set_id: str) -> IPSetType | None:
        meta = self._meta.get(set_id)
        return None if meta is None else meta.type

    def get_desired_members(self, set_id: str) -> AbstractSet[str] | None:
        return self._inner.get_desired_members(set_id) if set_id in self._passed else None

    def queue_resync(self) -> None:
        self._inner.queue_resync()

    def apply_updates(self) -> None:
        self._inner.apply_updates()

    def apply_deletions(self) -> bool:
        return self._inner.apply_deletions()
