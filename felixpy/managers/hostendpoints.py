"""Host endpoints (per IP family): resolution to interfaces, their chains, host dispatch, status.

The host-endpoint half of Felix's ``endpointManager``.

Resolution (:func:`resolve_host_endpoints`, pure and mode-independent — a BPF
manager can consume the same result) looks at every non-workload interface
the interface monitor reported (``IfaceAddrsUpdate``; an interface with no
address still counts) and picks, per interface, the matching host endpoint
with the lowest ID:

* a HEP that names an interface matches that interface only (never by IP);
* a HEP that names none matches every interface holding one of its
  ``expected_ipv4_addrs``/``expected_ipv6_addrs``;
* a ``*`` HEP never matches a particular interface; the lowest-ID one becomes
  the pseudo-interface ``any-interface-at-all``, the dispatch chains' default
  for host-bound traffic on every interface no specific HEP claims (a specific
  HEP on an interface takes precedence over ``*``).

Losers are shadowed (a warning names both) and take over when the winner
goes.  Addresses moving between interfaces re-resolve at the next apply.

Chains per resolved interface (Felix's placement): filter ``cali-th-``/
``cali-fh-`` (normal policy, profiles, failsafes) and ``cali-thfw-``/
``cali-fhfw-`` (``forward_tiers``, apply-on-forward); mangle ``cali-th-``
(normal egress for DNAT'd host traffic) and, when it has ``pre_dnat_tiers``,
``cali-fh-``; raw ``cali-th-``/``cali-fh-`` when it has ``untracked_tiers``
(not for ``*``: Felix ignores untracked policy there, with a warning).  This
manager owns the host dispatch chains in raw, mangle and filter (created at
start of day even with no host endpoint, since the static chains jump to
them); raw and mangle-ingress dispatch list only interfaces with such tiers.

BPF mode (``bpf_mode``, Felix's endpoint manager with ``bpfEnabled``): the programs enforce
normal, pre-DNAT and forward policy and the XDP program untracked ingress, so this manager renders
only untracked *egress* policy — raw ``cali-th-<iface>`` for each specific HEP with untracked
tiers, grouped from their egress policies only — and the raw ``cali-to-host-endpoint`` dispatch to
those; nothing goes to mangle or filter.  Resolution and status are the same in both modes.

Status per HEP and family, to the status combiner: ``up`` (resolved, every
interface oper-up), ``down`` (resolved, some interface down), ``error``
(resolved to no interface — e.g. the named interface does not exist yet),
``""`` when removed.

Bad input (an expected IP that does not parse) is logged with the HEP's ID and
skipped; the rest of that HEP is used.  Only records into the tables.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog

from felixpy.drivers.generictables.model import Chain
from felixpy.drivers.generictables.table import Table
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate
from felixpy.managers.groupchains import PolicyGroupChains, groups_to_program
from felixpy.managers.status import EndpointStatusCombiner
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyGroup, PolicyID, RuleRenderer, TierPolicyGroups, tiers_from_proto
from felixpy.rules.names import ALL_INTERFACES

log = structlog.get_logger(__name__)

WILDCARD_NAME = "*"  # HostEndpoint.name for an all-interfaces HEP


@dataclass(frozen=True, slots=True)
class ResolvedHEP:
    """What resolution needs of one HEP: its interface name, or its expected (canonical) addresses."""

    name: str
    expected: frozenset[str]

    @property
    def all_interfaces(self) -> bool:
        return self.name == WILDCARD_NAME


def _canonical(addr: str) -> str:
    return str(ipaddress.ip_address(addr.split("/")[0]))


def canonical_addrs(addrs: Iterable[str]) -> frozenset[str]:
    """An interface's addresses as resolution compares them; one that does not parse is left out."""
    out = set()
    for a in addrs:
        try:
            out.add(_canonical(a))
        except ValueError:
            continue
    return frozenset(out)


def record_host_addrs(addrs: dict[str, frozenset[str]], msg: IfaceAddrsUpdate,
                      workload_prefixes: tuple[str, ...]) -> bool:
    """Keep *addrs* (host interface -> canonical addresses) in step with *msg*; False when the
    interface is a workload's (host-endpoint resolution never looks at those)."""
    if msg.name.startswith(workload_prefixes):
        return False
    if msg.addrs is None:
        addrs.pop(msg.name, None)
    else:
        addrs[msg.name] = canonical_addrs(msg.addrs)
    return True


def resolution_input(hep_id: str, ep: pb.HostEndpoint) -> ResolvedHEP:
    """A HEP as resolution sees it; an expected address that does not parse is logged and skipped."""
    expected = set()
    for addr in (*ep.expected_ipv4_addrs, *ep.expected_ipv6_addrs):
        try:
            expected.add(_canonical(addr))
        except ValueError:
            log.error("Skipping bad expected IP of host endpoint", host_endpoint=hep_id, address=addr)
    return ResolvedHEP(ep.name, frozenset(expected))


def resolve_host_endpoints(heps: Mapping[str, ResolvedHEP], iface_addrs: Mapping[str, frozenset[str]]
                           ) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Felix's resolution: (interface → winning HEP ID, interface → shadowed HEP IDs).

    ``iface_addrs`` holds the host (non-workload) interfaces the monitor reported, with
    canonical addresses.  The ``*`` winner is keyed by :data:`ALL_INTERFACES`.
    """
    winners: dict[str, str] = {}
    shadowed: dict[str, list[str]] = {}
    for iface, addrs in iface_addrs.items():
        matching = sorted(hid for hid, h in heps.items() if not h.all_interfaces and
                          (h.name == iface if h.name else bool(h.expected & addrs)))
        if matching:
            winners[iface] = matching[0]
            if len(matching) > 1:
                shadowed[iface] = matching[1:]
    wildcards = sorted(hid for hid, h in heps.items() if h.all_interfaces)
    if wildcards:
        winners[ALL_INTERFACES] = wildcards[0]
        if len(wildcards) > 1:
            shadowed[ALL_INTERFACES] = wildcards[1:]
    return winners, shadowed


@dataclass(slots=True)
class _Programmed:
    """The chains programmed for one interface, per table name, and the groups they reference."""

    hep_id: str
    chains: dict[str, list[Chain]]
    groups: list[PolicyGroup]
    pre_dnat: bool


class HostEndpointManager:
    def __init__(self, ip_version: int, renderer: RuleRenderer, *, raw: Table, mangle: Table, filter: Table,
                 status: EndpointStatusCombiner, groups: PolicyGroupChains,
                 workload_prefixes: tuple[str, ...], bpf_mode: bool = False) -> None:
        self.ip_version = ip_version
        self._r, self._groups, self._wl_prefixes = renderer, groups, workload_prefixes
        self._bpf_mode = bpf_mode  # untracked egress policy only (see the module doc)
        self._tables: dict[str, Table] = {"raw": raw, "mangle": mangle, "filter": filter}
        self._status = status
        status.register_family(ip_version)

        self._heps: dict[str, pb.HostEndpoint] = {}
        self._ids: dict[str, pb.HostEndpointID] = {}
        self._inputs: dict[str, ResolvedHEP] = {}
        self._iface_addrs: dict[str, frozenset[str]] = {}
        self._up_ifaces: set[str] = set()
        self._selectors: dict[PolicyID, str] = {}
        self._dirty = True  # start of day: the (empty) dispatch chains
        self._changed_heps: set[str] = set()  # endpoint content changed: re-render its chains
        self._active: dict[str, _Programmed] = {}  # interface (or ALL_INTERFACES) → programmed
        self._iface_to_hep: dict[str, str] = {}
        self._hep_to_ifaces: dict[str, list[str]] = {}
        self._shadow_warned: dict[str, tuple[str, ...]] = {}
        self._dispatch: dict[str, dict[str, Chain]] = {"raw": {}, "mangle": {}, "filter": {}}
        self._status_dirty: set[str] = set()
        self._removed: dict[str, pb.HostEndpointID] = {}

    # ----------------------------------------------------------------------- updates
    update_types: tuple[type, ...] = (pb.HostEndpointUpdate, pb.HostEndpointRemove, IfaceAddrsUpdate, IfaceStateUpdate,
                    pb.ActivePolicyUpdate, pb.ActivePolicyRemove)  # what on_update acts on (managers/base.py)

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.HostEndpointUpdate):
            hid = msg.id.endpoint_id
            self._heps[hid] = msg.endpoint
            self._ids[hid] = msg.id
            self._inputs[hid] = resolution_input(hid, msg.endpoint)
            self._removed.pop(hid, None)
            self._changed_heps.add(hid)
            self._status_dirty.add(hid)
            self._dirty = True
        elif isinstance(msg, pb.HostEndpointRemove):
            hid = msg.id.endpoint_id
            if self._heps.pop(hid, None) is not None:
                self._inputs.pop(hid, None)
                self._ids.pop(hid, None)
                self._removed[hid] = msg.id
                self._status_dirty.add(hid)
                self._dirty = True
        elif isinstance(msg, IfaceAddrsUpdate):
            if record_host_addrs(self._iface_addrs, msg, self._wl_prefixes):
                self._dirty = True
        elif isinstance(msg, IfaceStateUpdate):
            if msg.state == IfaceState.UP:
                self._up_ifaces.add(msg.name)
            else:
                self._up_ifaces.discard(msg.name)
            holder = self._iface_to_hep.get(msg.name)
            if holder is not None:
                self._status_dirty.add(holder)
        elif isinstance(msg, pb.ActivePolicyUpdate):
            self._selectors[PolicyID.from_proto(msg.id)] = msg.policy.original_selector
        elif isinstance(msg, pb.ActivePolicyRemove):
            self._selectors.pop(PolicyID.from_proto(msg.id), None)

    # ------------------------------------------------------------------------- work
    def complete_deferred_work(self) -> None:
        if self._dirty:
            self._update()
            self._dirty = False
            self._changed_heps.clear()
        self._report_status()

    def _update(self) -> None:
        winners, shadowed = resolve_host_endpoints(self._inputs, self._iface_addrs)
        self._warn_shadowed(winners, shadowed)
        old_hep_to_ifaces = self._hep_to_ifaces
        for iface in [i for i in self._active if winners.get(i) is None]:
            log.info("Host interface no longer protected; removing its chains", iface=iface,
                     host_endpoint=self._active[iface].hep_id)
            self._unprogram(iface)
        for iface, hid in sorted(winners.items()):
            current = self._active.get(iface)
            if current is not None and current.hep_id == hid and hid not in self._changed_heps:
                continue
            self._program(iface, hid)
        self._iface_to_hep = dict(winners)
        hep_to_ifaces: dict[str, list[str]] = {}
        for iface, hid in sorted(winners.items()):
            hep_to_ifaces.setdefault(hid, []).append(iface)
        for hid in set(old_hep_to_ifaces) | set(hep_to_ifaces):
            if old_hep_to_ifaces.get(hid) != hep_to_ifaces.get(hid):
                self._status_dirty.add(hid)
        self._hep_to_ifaces = hep_to_ifaces
        self._update_dispatch()

    def _warn_shadowed(self, winners: Mapping[str, str], shadowed: Mapping[str, list[str]]) -> None:
        for iface, losers in shadowed.items():
            if self._shadow_warned.get(iface) != (winners[iface], *losers):
                log.warning("Several host endpoints match one interface; the lowest ID wins", iface=iface,
                            host_endpoint=winners[iface], shadowed=losers)
        self._shadow_warned = {i: (winners[i], *losers) for i, losers in shadowed.items()}

    def _tiers(self, tiers: Iterable[pb.TierInfo]) -> tuple[TierPolicyGroups, ...]:
        return tiers_from_proto(list(tiers), self._selectors)

    def _program(self, iface: str, hid: str) -> None:
        ep = self._heps[hid]
        untracked = self._tiers(ep.untracked_tiers)
        if untracked and iface == ALL_INTERFACES:
            log.warning("Untracked policy is not supported for a host endpoint with interface '*'; ignoring it",
                        host_endpoint=hid)
            untracked = ()
        if self._bpf_mode:
            groups, render = self._bpf_mode_chains(iface, untracked)
        else:
            groups, render = self._chains(iface, ep, untracked)
        try:
            chains = self._groups.render_holding(groups, render)
        except Exception:
            log.exception("Failed to render host endpoint chains; interface left as it was", host_endpoint=hid,
                          iface=iface)
            return
        old = self._active.get(iface)
        for name, new in chains.items():
            table, before = self._tables[name], old.chains[name] if old else []
            names = {c.name for c in new}
            for stale in before:
                if stale.name not in names:
                    table.remove_chain_by_name(stale.name)
            table.update_chains([c for c in new if c not in before])
        if old is not None:
            self._groups.decref(old.groups)
        self._active[iface] = _Programmed(hid, chains, groups, bool(ep.pre_dnat_tiers))

    def _chains(self, iface: str, ep: pb.HostEndpoint, untracked: tuple[TierPolicyGroups, ...]
                ) -> tuple[list[PolicyGroup], Callable[[], dict[str, list[Chain]]]]:
        """The *tables modes: (groups the chains use, their render per table)."""
        tiers, fwd, pre_dnat = self._tiers(ep.tiers), self._tiers(ep.forward_tiers), self._tiers(ep.pre_dnat_tiers)
        profiles = list(ep.profile_ids)

        def render() -> dict[str, list[Chain]]:
            r = self._r
            mangle = r.host_endpoint_mangle_egress_chains(iface, tiers, profiles)
            if pre_dnat:
                mangle += r.host_endpoint_mangle_ingress_chains(iface, pre_dnat)
            return {"filter": r.host_endpoint_filter_chains(iface, tiers, fwd, profiles), "mangle": mangle,
                    "raw": r.host_endpoint_raw_chains(iface, untracked) if untracked else []}

        return groups_to_program([*tiers, *fwd, *untracked, *pre_dnat]), render

    def _bpf_mode_chains(self, iface: str, untracked: tuple[TierPolicyGroups, ...]
                         ) -> tuple[list[PolicyGroup], Callable[[], dict[str, list[Chain]]]]:
        """BPF mode: the untracked tiers' egress groups, in raw ``cali-th-<iface>`` only."""
        egress = tuple(replace(t, ingress=()) for t in untracked)

        def render() -> dict[str, list[Chain]]:
            raw = [self._r.host_endpoint_raw_egress_chain(iface, egress)] if egress else []
            return {"filter": [], "mangle": [], "raw": raw}

        return groups_to_program(egress), render

    def _unprogram(self, iface: str) -> None:
        prog = self._active.pop(iface)
        for name, chains in prog.chains.items():
            for c in chains:
                self._tables[name].remove_chain_by_name(c.name)
        self._groups.decref(prog.groups)

    def _update_dispatch(self) -> None:
        specific = sorted(i for i in self._active if i != ALL_INTERFACES)
        default = ALL_INTERFACES if ALL_INTERFACES in self._active else ""
        untracked = [i for i in specific if self._active[i].chains["raw"]]
        r = self._r
        if self._bpf_mode:
            self._sync_dispatch("raw", r.to_host_dispatch_chains(untracked))
            return
        pre_dnat = [i for i in specific if self._active[i].pre_dnat]
        pre_dnat_default = default if default and self._active[ALL_INTERFACES].pre_dnat else ""
        self._sync_dispatch("raw", r.host_dispatch_chains(untracked))
        self._sync_dispatch("filter", r.host_dispatch_chains(specific, default, apply_on_forward=True))
        self._sync_dispatch("mangle", [*r.from_host_dispatch_chains(pre_dnat, pre_dnat_default),
                                       *r.to_host_dispatch_chains(specific, default)])

    def _sync_dispatch(self, key: str, chains: Sequence[Chain]) -> None:
        table, active = self._tables[key], self._dispatch[key]
        new = {c.name: c for c in chains}
        for name, chain in new.items():
            if active.get(name) != chain:
                table.update_chain(chain)
        for name in [n for n in active if n not in new]:
            table.remove_chain_by_name(name)
        self._dispatch[key] = new

    # ----------------------------------------------------------------------- status
    def _report_status(self) -> None:
        for hid in sorted(self._status_dirty):
            if hid not in self._heps:
                pid = self._removed.pop(hid, None)
                if pid is not None:
                    self._status.on_endpoint_status(self.ip_version, "host", hid, pid, "")
                continue
            ifaces = self._hep_to_ifaces.get(hid, [])
            if not ifaces:
                status = "error"
            elif all(i in self._up_ifaces for i in ifaces if i != ALL_INTERFACES):
                status = "up"
            else:
                status = "down"
            self._status.on_endpoint_status(self.ip_version, "host", hid, self._ids[hid], status)
        self._status_dirty.clear()

    # For tests, observability and a BPF endpoint manager: interface → winning HEP (and the HEP itself).
    def active_ifaces(self) -> dict[str, str]:
        return dict(self._iface_to_hep)

    def resolved_endpoints(self) -> dict[str, pb.HostEndpoint]:
        return {iface: self._heps[hid] for iface, hid in self._iface_to_hep.items()}
