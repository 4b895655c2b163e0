"""Endpoint manager (per IP family): workload endpoints → endpoint chains, dispatch, routes, sysctls, status.

Felix's ``endpointManager`` for workloads (host endpoints, their chains and
the host dispatch chains belong to :mod:`felixpy.managers.hostendpoints`):

* ``on_update`` only records: pending endpoint updates/removals, interface
  states, and each active policy's selector (for policy groups).
* ``resolve_update_batch`` moves interface states into the active set and marks
  workload interfaces that came up for reconfiguration.
* ``complete_deferred_work`` resolves endpoints — two endpoints with one
  interface name: the lower ID wins and the other is shadowed until it is
  removed — renders ``cali-tw-``/``cali-fw-`` chains (and the policy-group
  chains they reference, refcounted, released when no endpoint uses them),
  rebuilds the fail-closed dispatch chains (or nftables verdict maps) when the
  endpoint set changed, the rpf-skip chain for workloads allowed to spoof,
  sets the LocalWorkload routes (only while admin-up; static ARP from the MAC;
  with ``FloatingIPs=Enabled``, or for OpenStack endpoints, also each floating
  IP of this family so the DNAT'd packets reach the workload),
  and asks the interface-sysctls syncer to configure workload interfaces that
  are oper-up (an endpoint whose interface does not exist yet is remembered and
  configured when it appears).
* ``on_devices_applied`` (after the syncer's apply) reports each changed
  endpoint's status for this family to the status combiner: ``up`` (admin-up,
  oper-up, configured), ``down``, ``error`` (interface configuration keeps
  failing; ``next_deadline`` asks the loop to retry it), ``""`` (removed).

This manager never touches the kernel: tables, the route table and the
sysctls syncer only record here, and reconcile in their own ``apply()``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from felixpy.drivers.generictables.model import Chain
from felixpy.drivers.generictables.table import MapsDataplane, Table
from felixpy.drivers.procsys.api import IfaceConfig, InterfaceConfigurer
from felixpy.drivers.routetable.api import RouteTableAPI
from felixpy.drivers.routetable.defs import Target
from felixpy.ifacemonitor.events import IfaceState, IfaceStateUpdate
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.managers.groupchains import PolicyGroupChains, groups_to_program
from felixpy.managers.status import EndpointStatusCombiner
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyGroup, PolicyID, RuleRenderer, tiers_from_proto
from felixpy.rules.policy import cidr_problem

log = structlog.get_logger(__name__)

WlKey = tuple[str, str, str]

ORCHESTRATOR_OPENSTACK = "openstack"  # its endpoints' floating IPs are always programmed (as Felix)
_NO_CHAINS: list[str] = []  # BPF mode's endpoints render no chains: one shared empty list, never changed
_NO_GROUPS: list[PolicyGroup] = []
IFACE_RETRY_INTERVAL = 1.0  # seconds before retrying a workload interface whose /proc/sys writes failed


def wl_key(wid: pb.WorkloadEndpointID) -> WlKey:
    # Interned: each proto access is a new string, and both families' managers and the status
    # combiner keep the key (orchestrator and endpoint IDs repeat across all workloads).
    intern = sys.intern
    return (intern(wid.orchestrator_id), intern(wid.workload_id), intern(wid.endpoint_id))


def proto_id(key: WlKey) -> pb.WorkloadEndpointID:
    """The endpoint's id as a message, built from its key when it is needed (a status report, a takeover):
    one held per endpoint, its own small arena each, was ~1 KiB an endpoint (#17)."""
    return pb.WorkloadEndpointID(orchestrator_id=key[0], workload_id=key[1], endpoint_id=key[2])


@dataclass(slots=True)
class _Active:
    # Not the parsed endpoint message: it stays resident at ~2.4 KiB (its id alone keeps all of it), 12 MiB
    # at 5,000 workloads (#17).  What is read later: its name and admin state; the whole of it only when
    # another endpoint takes its interface (parsed again from its wire bytes); its id is its key's
    # (proto_id).
    name: str
    active: bool
    wire: bytes
    chains: list[str]
    groups: list[PolicyGroup]
    # Everything the endpoint's chains are rendered from (see _chain_inputs): an update that keeps
    # these (new addresses, a new MAC, labels…) leaves the chains, and the tables, alone.
    inputs: tuple[Any, ...] = ()
    # Likewise for its routes (see _route_inputs): a policy-only update leaves them alone.
    route_inputs: tuple[Any, ...] = ()


def _active(iface: str, ep: pb.WorkloadEndpoint, chains: list[str], groups: list[PolicyGroup],
            inputs: tuple[Any, ...], route_inputs: tuple[Any, ...]) -> _Active:
    return _Active(iface, ep.state == "active", ep.SerializeToString(), chains, groups, inputs, route_inputs)


def _chain_inputs(ep: pb.WorkloadEndpoint, tiers: tuple[Any, ...]) -> tuple[Any, ...]:
    """The inputs of ``RuleRenderer.workload_endpoint_chains`` (the renderer's context aside)."""
    qos = ep.qos_controls.SerializeToString(deterministic=True) if ep.HasField("qos_controls") else None
    return (ep.name, ep.state == "active", tiers, tuple(ep.profile_ids), qos)


def _cidr_version(cidr: str) -> int:
    """4 or 6 for a CIDR ``cidr_problem`` accepted: it parsed, so a colon means IPv6 (a third parse
    of every workload address, after ``cidr_problem`` and the route's canonical form, cost ~30 us)."""
    return 6 if ":" in cidr else 4


class EndpointManager:
    def __init__(self, ip_version: int, renderer: RuleRenderer, *, raw: Table, mangle: Table, filter: Table,
                 route_table: RouteTableAPI, sysctls: InterfaceConfigurer, status: EndpointStatusCombiner,
                 maps: MapsDataplane | None = None, route_priority: int = 0,
                 groups: PolicyGroupChains | None = None, floating_ips: bool = False,
                 render_chains: bool = True) -> None:
        self.ip_version = ip_version
        # False in BPF mode: the programs enforce the endpoints' policy and these tables are discarded,
        # so only routes, interface configuration and status are this manager's work there.
        self._render_chains = render_chains
        if not render_chains:  # the policies' selectors only name the chains' comments: not wanted here
            self.update_types = (pb.WorkloadEndpointUpdate, pb.WorkloadEndpointRemove, IfaceStateUpdate)
        self._r = renderer
        self._raw, self._mangle, self._filter = raw, mangle, filter
        self._routes = route_table
        self._sysctls = sysctls
        self._status = status
        self._maps = maps
        self._route_priority = route_priority
        self._floating_ips = floating_ips
        self._groups = groups or PolicyGroupChains(renderer, [filter])
        status.register_family(ip_version)

        self._pending: dict[WlKey, tuple[pb.WorkloadEndpointID, pb.WorkloadEndpoint | None]] = {}
        self._pending_ifaces: dict[str, IfaceState] = {}
        self._active: dict[WlKey, _Active] = {}
        self._iface_to_key: dict[str, WlKey] = {}
        self._shadowed: dict[WlKey, tuple[pb.WorkloadEndpointID, pb.WorkloadEndpoint]] = {}
        self._up_ifaces: set[str] = set()
        self._to_reconfigure: set[str] = set()
        self._status_dirty: set[WlKey] = set()
        self._removed_ids: dict[WlKey, pb.WorkloadEndpointID] = {}
        self._spoofing: dict[str, tuple[str, ...]] = {}
        self._rpf_dirty = True
        self._dispatch_dirty = True  # start-of-day: program the (empty, fail-closed) dispatch chains
        self._dispatch_chains: dict[str, Chain] = {}
        self._dispatch_maps: set[str] = set()
        # The interface names the dispatch chains/maps were last rendered for: they are a function of
        # those names alone, so an endpoint update that keeps its interface (the common case under
        # churn) skips the re-render (at 250 workloads it was half of every churn apply).
        self._dispatch_names: list[str] | None = None
        self._selectors: dict[PolicyID, str] = {}

    # ----------------------------------------------------------------------- updates
    update_types: tuple[type, ...] = (pb.WorkloadEndpointUpdate, pb.WorkloadEndpointRemove, IfaceStateUpdate,
                    pb.ActivePolicyUpdate, pb.ActivePolicyRemove)  # what on_update acts on (managers/base.py)

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.WorkloadEndpointUpdate):
            self._pending[wl_key(msg.id)] = (msg.id, msg.endpoint)
        elif isinstance(msg, pb.WorkloadEndpointRemove):
            self._pending[wl_key(msg.id)] = (msg.id, None)
        elif isinstance(msg, IfaceStateUpdate):
            self._pending_ifaces[msg.name] = msg.state
        elif isinstance(msg, pb.ActivePolicyUpdate):
            self._selectors[PolicyID.from_proto(msg.id)] = msg.policy.original_selector
        elif isinstance(msg, pb.ActivePolicyRemove):
            self._selectors.pop(PolicyID.from_proto(msg.id), None)

    def resolve_update_batch(self) -> None:
        for name, state in self._pending_ifaces.items():
            if state == IfaceState.UP:
                self._up_ifaces.add(name)
                if name in self._iface_to_key or self._r.ctx.config.InterfacePrefix and \
                        name.startswith(self._r.ctx.workload_prefixes):
                    self._to_reconfigure.add(name)
            else:
                self._up_ifaces.discard(name)
                self._sysctls.forget(name)
            key = self._iface_to_key.get(name)
            if key is not None:
                self._status_dirty.add(key)
        self._pending_ifaces.clear()

    # ------------------------------------------------------------------------- work
    def render_ahead(self) -> None:
        """Before the first ``InSync`` (managers/base.py): the endpoints that arrived so far, their chains,
        routes and the dispatch chains that reference them rendered into the desired state; only the
        interfaces' configuration waits for the apply.  At a 5,000-workload start of day this was
        ~0.8-1.3 s of the first apply.  The dispatch chains are rendered here too (~35 ms at 5,000
        interfaces, again whenever more endpoints have arrived) so that the tables see, before the apply,
        which chains it will program: a table whose read starts before InSync hashes those and only those
        ahead (iptables-nft's raw and mangle tables also hold every policy's chains, unreferenced)."""
        self._render_desired()

    def complete_deferred_work(self) -> None:
        self._render_desired()
        self._request_interface_config()

    def _render_desired(self) -> None:
        self._resolve_workloads()
        if self._dispatch_dirty:
            if self._render_chains:
                self._update_dispatch()
            self._dispatch_dirty = False
        if self._rpf_dirty:
            self._raw.update_chain(self._r.rpf_skip_chain(self._spoofing))
            self._rpf_dirty = False

    sets_no_routes_after_devices = True  # on_devices_applied() only reports status (managers/base.py)

    def on_devices_applied(self) -> None:
        """The sysctls syncer has applied: report the status of changed endpoints."""
        self._report_status()

    def next_deadline(self) -> float | None:
        """Seconds until the loop should apply again: interface configuration that failed is
        retried without waiting for another event."""
        failed = any(self._sysctls.state(i) is IfaceConfig.FAILED for i in self._iface_to_key)
        return IFACE_RETRY_INTERVAL if failed else None

    def _resolve_workloads(self) -> None:
        if self._pending:
            self._dispatch_dirty = True
        while self._pending:
            key, (pid, ep) = self._pending.popitem()
            if ep is not None:
                self._upsert(key, pid, ep)
            else:
                self._remove(key, pid)
            self._status_dirty.add(key)

    def _upsert(self, key: WlKey, pid: pb.WorkloadEndpointID, ep: pb.WorkloadEndpoint) -> None:
        iface = sys.intern(ep.name)  # kept as a key in several maps here and in the route table
        holder = self._iface_to_key.get(iface)
        if holder is not None and holder != key:
            if holder < key:
                log.info("Endpoint shares an interface with an existing one; existing wins", iface=iface,
                         endpoint=key, existing=holder)
                self._shadowed[key] = (pid, ep)
                return
            log.info("Endpoint shares an interface with an existing one; new one wins", iface=iface,
                     endpoint=key, existing=holder)
            loser = self._active[holder]
            self._shadowed[holder] = (proto_id(holder), pb.WorkloadEndpoint.FromString(loser.wire))
            self._deactivate(holder)
            self._status_dirty.add(holder)
        previous = self._active.get(key)
        if previous is not None and previous.name != iface:
            self._deactivate(key)
            self._promote_shadowed(previous.name)  # the old interface is free now
        old = self._active.get(key)
        route_inputs = self._route_inputs(pid, ep, iface)
        if not self._render_chains:
            self._active[key] = _active(iface, ep, _NO_CHAINS, _NO_GROUPS, (), route_inputs)
        elif not self._chains_for(key, pid, ep, iface, old, route_inputs):
            return
        self._iface_to_key[iface] = key
        self._shadowed.pop(key, None)
        spoof = self._allowed_spoofing(key, ep)
        if spoof != self._spoofing.get(iface, ()):
            if spoof:
                self._spoofing[iface] = spoof
            else:
                self._spoofing.pop(iface, None)
            self._rpf_dirty = True
        # While this key stays active on this interface nothing else sets the interface's routes (a
        # takeover or removal deactivates it first), so equal inputs mean the routes are already these.
        if old is None or old.route_inputs != route_inputs:
            self._set_routes(pid, route_inputs)
        self._to_reconfigure.add(iface)

    def _chains_for(self, key: WlKey, pid: pb.WorkloadEndpointID, ep: pb.WorkloadEndpoint, iface: str,
                    old: _Active | None, route_inputs: tuple[Any, ...]) -> bool:
        """Render the endpoint's chains into the tables unless their inputs are unchanged; False if
        they could not be rendered (the endpoint is left as it was)."""
        tiers = tiers_from_proto(ep.tiers, self._selectors)
        inputs = _chain_inputs(ep, tiers)
        if old is not None and old.inputs == inputs:
            # Same interface, policies (and their groups), profiles, admin state and QoS: the chains the
            # tables hold are already these; only addresses/MAC/etc. changed (routes below).
            self._active[key] = _active(iface, ep, old.chains, old.groups, inputs, route_inputs)
        else:
            new_groups = groups_to_program(tiers)
            try:
                chains = self._groups.render_holding(new_groups,
                                                     lambda: self._r.workload_endpoint_chains(ep, tiers))
            except Exception:
                log.exception("Failed to render endpoint chains; endpoint left as it was", endpoint=key,
                              iface=iface)
                return False
            names = [c.name for c in chains]
            if old is not None:
                for stale in old.chains:
                    if stale not in names:
                        self._filter.remove_chain_by_name(stale)
                self._groups.decref(old.groups)
            self._filter.update_chains(chains)
            self._active[key] = _active(iface, ep, names, new_groups, inputs, route_inputs)
        return True

    def _allowed_spoofing(self, key: WlKey, ep: pb.WorkloadEndpoint) -> tuple[str, ...]:
        """The endpoint's ``allow_spoofed_source_prefixes`` if ``WorkloadSourceSpoofing=Any``.

        With ``Disabled`` (the default) they are ignored: the workload keeps strict RPF.
        (Felix's calc graph goes further and drops such an endpoint before the dataplane sees it.)
        """
        prefixes = tuple(ep.allow_spoofed_source_prefixes)
        if prefixes and self._r.ctx.config.WorkloadSourceSpoofing != "Any":
            log.warning("Endpoint asks to allow spoofed source prefixes but WorkloadSourceSpoofing is "
                        "Disabled; ignoring them", endpoint=key, prefixes=list(prefixes))
            return ()
        return prefixes

    def _floating(self, pid: pb.WorkloadEndpointID) -> bool:
        return self._floating_ips or pid.orchestrator_id == ORCHESTRATOR_OPENSTACK

    def _route_inputs(self, pid: pb.WorkloadEndpointID, ep: pb.WorkloadEndpoint, iface: str) -> tuple[Any, ...]:
        """Everything ``_set_routes`` reads (the family and route priority are the manager's own): the
        interface (*iface*, the interned ``ep.name``), the admin state (interned), the addresses, the
        floating IPs (only when they are routed) and the MAC -- the strings the routes then hold too."""
        v4 = self.ip_version == 4
        nat = tuple(n.ext_ip for n in (ep.ipv4_nat if v4 else ep.ipv6_nat)) if self._floating(pid) else ()
        return (iface, sys.intern(ep.state), tuple(ep.ipv4_nets if v4 else ep.ipv6_nets), nat, ep.mac)

    def _set_routes(self, pid: pb.WorkloadEndpointID, route_inputs: tuple[Any, ...]) -> None:
        iface, state, addrs, nat, mac = route_inputs
        targets = []
        if state == "active":
            # The floating IPs (routed only when _route_inputs kept them) are DNAT'd to the workload.
            for net in (*addrs, *nat):
                cidr = net if "/" in net else f"{net}/{32 if self.ip_version == 4 else 128}"
                try:
                    if (why := cidr_problem(cidr)) is not None:
                        raise ValueError(why)
                    if _cidr_version(cidr) != self.ip_version:
                        raise ValueError(f"not an IPv{self.ip_version} address")
                    targets.append(Target(cidr=cidr, dest_mac=mac or None,
                                          priority=self._route_priority or None))
                except (ValueError, TypeError) as exc:
                    log.error("Skipping bad workload address", endpoint=wl_key(pid), iface=iface, cidr=net,
                              error=str(exc))
        self._routes.set_routes(RouteClass.LOCAL_WORKLOAD, iface, targets)

    def _remove(self, key: WlKey, pid: pb.WorkloadEndpointID) -> None:
        self._shadowed.pop(key, None)
        if key not in self._active:
            self._removed_ids[key] = pid
            return
        iface = self._active[key].name
        self._removed_ids[key] = pid
        self._deactivate(key)
        self._promote_shadowed(iface)

    def _promote_shadowed(self, iface: str) -> None:
        """A shadowed endpoint with this interface takes over (lowest ID first); one with a
        pending update or removal in this batch is left to that (a newer state wins)."""
        for k in sorted(k for k, (_, ep) in self._shadowed.items() if ep.name == iface):
            pending = self._pending.get(k)
            if pending is None:
                self._pending[k] = self._shadowed.pop(k)
                return
            if pending[1] is not None and pending[1].name == iface:
                return  # its own pending update will claim the interface

    def _deactivate(self, key: WlKey) -> None:
        act = self._active.pop(key)
        for name in act.chains:
            self._filter.remove_chain_by_name(name)
        self._groups.decref(act.groups)
        iface = act.name
        if self._iface_to_key.get(iface) == key:
            del self._iface_to_key[iface]
        self._routes.set_routes(RouteClass.LOCAL_WORKLOAD, iface, [])
        self._to_reconfigure.discard(iface)
        if self._spoofing.pop(iface, None) is not None:
            self._rpf_dirty = True
        self._dispatch_dirty = True

    # ------------------------------------------------------------------- dispatch
    def _update_dispatch(self) -> None:
        names = sorted(self._iface_to_key)
        if names == self._dispatch_names:
            return
        new = {c.name: c for c in self._r.workload_dispatch_chains(names)}
        self._dispatch_names = names  # only once rendered: a render that raised is tried again
        for name, chain in new.items():
            if self._dispatch_chains.get(name) != chain:
                self._filter.update_chain(chain)
        for name in [n for n in self._dispatch_chains if n not in new]:
            self._filter.remove_chain_by_name(name)
        self._dispatch_chains = new
        if self._maps is not None:
            seen = set()
            for meta, members in self._r.workload_dispatch_maps(names):
                self._maps.add_or_replace_map(meta, members)
                seen.add(meta.name)
            for stale in self._dispatch_maps - seen:
                self._maps.remove_map(stale)
            self._dispatch_maps = seen

    def route_table_syncers(self) -> list[RouteTableAPI]:
        return [self._routes]

    # ------------------------------------------------------------- interfaces, status
    def _request_interface_config(self) -> None:
        for iface in sorted(self._to_reconfigure):
            if iface in self._up_ifaces:  # configured when it comes up (Felix skips oper-down interfaces)
                self._sysctls.configure(iface, allow_spoofing=iface in self._spoofing)
                self._to_reconfigure.discard(iface)

    def _report_status(self) -> None:
        for key in list(self._status_dirty):
            act = self._active.get(key)
            if act is None:
                pid = self._removed_ids.pop(key, None)
                if pid is not None:
                    self._status.on_endpoint_status(self.ip_version, "workload", key, pid, "")
                continue
            iface = act.name
            config = self._sysctls.state(iface)
            if config is IfaceConfig.FAILED:
                status = "error"
            elif act.active and iface in self._up_ifaces and config is IfaceConfig.DONE:
                status = "up"
            else:
                status = "down"
            self._status.on_endpoint_status(self.ip_version, "workload", key, proto_id(key), status)
        self._status_dirty.clear()
        # An interface still waiting to be configured will be retried; keep its status fresh.
        for iface, key in self._iface_to_key.items():
            if iface in self._up_ifaces and self._sysctls.state(iface) is not IfaceConfig.DONE:
                self._status_dirty.add(key)

    # For tests and observability.
    def active_ifaces(self) -> Mapping[str, WlKey]:
        return dict(self._iface_to_key)
