"""The BPF endpoint driver: workload interfaces programmed in Felix's attach order.

What it owns, per workload interface it is told about: the counters entries for both TC hooks;
one policy jump-map entry per (TC hook, IP family) and the policy programs in those slots (with
their pinned sources, :mod:`felixpy.bpf.policyload`, written while the attach runs, which an earlier
run's are swept after the first apply that programs every wanted interface); the
attach-point globals (``cali_ap_glob``); the preamble on both TC
hooks (through :class:`~felixpy.drivers.bpfendpoints.attacher.Attacher`); and the interface's
``cali_iface`` entry (WEP flag, READY flag per family, policy entry indices).

How a fresh process recognises them (the restart, on the first apply)
(:meth:`BPFEndpoints._restart_sync`): every ``cali_iface`` entry is keyed by ifindex and carries
the interface name and its policy entry indices. An entry whose ifindex is still an interface of
that name that the feed wants programmed is **reclaimed**: its entries are re-assigned to it in
the slot allocators, a slot already holding exactly the program this process would load keeps it
(:meth:`~felixpy.bpf.policyload.PolicyPrograms.adopt`: same instructions by tag, same maps; nothing is
loaded or written), any other gets the regenerated program swapped straight in (no default-deny
step: the slot already enforces the previous run's policy), and the entry keeps its READY
flags until it is rewritten. Its preambles are recognised by filter name / TCX link pin path (the
attacher) and are *not* re-attached when the program attached there is the same code over the same
maps as this process's preamble (same tag and map ids: :meth:`Attacher.is_current`); otherwise
they are replaced atomically (TC ``replace``, ``BPF_LINK_UPDATE``), so no interface is ever open
or unprogrammed while a new process takes over. Every other entry is stale: entries of vanished
ifindexes, of re-used ifindexes with another name and of interfaces the feed no longer wants are
deleted (the last also detached). Policy entries no reclaimed interface owns are cleared from both
jump maps (every sub-program part), higher parts a reclaimed entry no longer needs too (the routes
map is the routes driver's, which reads it back and sweeps it itself); TCX link pins of interfaces that no
longer exist are detached and unlinked; interfaces that exist but carry no wanted workload have
their preambles detached (only interfaces :meth:`Attacher.sweep_candidates` names are looked at:
in TC mode those with a clsact qdisc, from one qdisc listing). The conntrack map is never touched (it is reused by its pin,
:mod:`felixpy.bpf.maps`), so established flows survive the restart.

Apply contract (per interface, in Felix's order; an interface that fails stays dirty and is
retried on the next apply, the others are programmed regardless; steps 1-4 run for every dirty
interface, then step 5 for all of them in one :meth:`Attacher.attach_many` call -- TC mode sends
the clsact and filter requests in netlink batches -- then step 6 for each one that attached):

1. counters entries for both hooks (the programs drop packets without them);
2. a policy entry per hook and family (allocated once, kept while the interface is wanted);
3. a new entry first gets the default-deny program, then the generated policy program --
   a changed policy swaps only the program in the existing slot (no re-attach); the apply holds
   one reference to each default-deny program while it runs, so the one program serves every
   new slot of the batch (without it, each slot's policy released the last reference and the
   next slot loaded default-deny again: 4,000 loads at 1,000 dual-stack interfaces);
4. the attach-point globals (jump layout + policy entries);
5. the preamble on both TC hooks -- only on interfaces that exist and are up;
6. ``cali_iface`` with the WEP flag and each programmed family's READY flag.

Steps 1, 4 and 6 write only what differs from what this process last wrote for the interface (a
memo per ifindex and hook, forgotten with the interface): a policy change on a programmed interface
is then just the slot swaps of step 3.  :meth:`queue_resync` (the periodic refresh) forgets the memo,
so damage done behind the driver's back is rewritten there, as every write used to be; that pass also
checks each programmed interface's policy slots (the first part of each must still be in its jump map)
and hooks (the preamble still attached), and what it had to put back is drift, counted once repaired
as ``felixpy_drift_repairs{kind="bpf_policy"|"bpf_attachment"}`` (:mod:`felixpy.drivers.drift`).
The pass goes :data:`RESYNC_BATCH` interfaces an apply, the next apply coming at once
(:meth:`next_deadline`), so a refresh on a node of 5,000 workloads (~2.5 s of checks and rewrites)
never holds one apply, and the updates queued behind it, for seconds.

(The routes map -- the workload's addresses on this ifindex, which the from-workload source
check needs -- is the routes driver's, :mod:`felixpy.drivers.bpfroutes`, a device syncer that
runs before this one.)

Host endpoints (:meth:`set_host_endpoint`: a host data interface the manager resolved a HEP to) go
through the same steps with the HEP program variants, the natural hook/direction relation and
``cali_iface`` flag HEP (plus READY per family); a fresh process recognises and reclaims them exactly
as workload entries (name + ifindex + policy entries in ``cali_iface``, the TCX pin / filter name),
and detaches an existing interface that is no longer one.  Their removal has no deny phase (there is
no *tables allow list to leave, and removing a HEP must restore open traffic): detached and released
in one apply, the entry rewritten NOT_MANAGED.

Non-workload interfaces that are not host endpoints (names outside ``InterfacePrefix``: the uplink,
the VXLAN devices, ...) get a ``cali_iface`` entry flagged NOT_MANAGED, so ``fib_approve`` lets the programs forward to
them (off-node and overlay traffic); every other interface without an entry -- a workload
interface not attached yet, an unknown ``cali*`` -- is refused.

Only after that does :meth:`ready_interfaces` list the interface, so the manager admits it to
the *tables allow list after this driver's apply.  Removal runs the other way round: READY is
cleared and the slots are set to default-deny first; the preamble is detached on the next
apply (after the *tables have dropped the interface from the allow list), then slots and
globals are released.
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import structlog

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf import syscall as sc
from felixpy.bpf.attachpoint import AttachPoint, configure, unconfigure
from felixpy.bpf.build import XDP_METADATA_DETAIL, XDP_METADATA_FEATURE, EpType
from felixpy.bpf.errors import BPFSyscallError
from felixpy.bpf.policy_ir import DENY_ALL, PolicySet
from felixpy.bpf.policyload import PolicyProgram
from felixpy.bpf.polprog import XdpSlots
from felixpy.drivers.bpfendpoints.api import HostEndpointPolicy, WorkloadPolicy
from felixpy.drivers.bpfendpoints.attacher import HOOKS, AttachRequest
from felixpy.drivers.bpfendpoints.kernel import BPFKernel
from felixpy.drivers.drift import DriftTally
from felixpy.errors import UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceState

log = structlog.get_logger(__name__)

FAMILIES = (4, 6)
XDP = defs.HOOK_XDP
_READY = {4: defs.IFACE_STATE_V4_READY, 6: defs.IFACE_STATE_V6_READY}
# cali_iface's policy-entry field per hook (TC egress runs the policy ingress direction, Felix's naming).
_IFSTATE_FIELD = {defs.HOOK_TC_EGRESS: "ingress_policy", defs.HOOK_TC_INGRESS: "egress_policy", XDP: "xdp_policy"}


class EndpointProgrammingFailed(Exception):
    """Some interfaces could not be programmed this apply (each is retried)."""

    SHOWN = 5  # interfaces named in the message (3,000 failing at once made one error line 250 KB)

    def __init__(self, failures: dict[str, Exception]) -> None:
        self.failures = failures
        first = sorted(failures.items())[: self.SHOWN]
        detail = ", ".join(f"{iface}: {type(e).__name__}: {e}" for iface, e in first)
        more = f", and {len(failures) - len(first)} more" if len(failures) > len(first) else ""
        super().__init__(f"{len(failures)} BPF endpoint(s) not programmed ({detail}{more})")


@dataclass(slots=True)
class _Programmed:
    """What this driver has put in the kernel for one interface (one per interface: slotted, its keys
    the shared :data:`_HV` tuples, ``reclaimed`` empty as the one shared frozenset -- ~0.5 KiB less an
    interface, #17)."""

    ifindex: int
    slots: dict[tuple[int, int], int] = field(default_factory=dict)  # (hook, family) -> policy entry
    policy: dict[tuple[int, int], PolicySet | None] = field(default_factory=dict)  # None: left empty
    attached: bool = False
    ready: frozenset[int] = frozenset()
    pending_detach: bool = False
    reclaimed: frozenset[tuple[int, int]] = frozenset()  # slots taken over from an earlier run
    xdp_attached: bool = False  # the XDP preamble is on the interface (host endpoints with untracked policy)


# The (hook, family) keys of _Programmed.slots/.policy, one tuple each for every interface.
_HV: dict[tuple[int, int], tuple[int, int]] = {(h, v): (h, v) for h in (*HOOKS, XDP) for v in FAMILIES}


def _slot_steps(done: _Programmed, hv: tuple[int, int], ps: PolicySet) -> tuple[bool, bool]:
    """Steps 2-3 for slot *hv* wanting *ps*: whether it holds default-deny first (a fresh slot, not one
    taken over from an earlier run), and whether *ps*'s program goes in (or is adopted)."""
    return (hv not in done.policy and ps != DENY_ALL and hv not in done.reclaimed), done.policy.get(hv) != ps


def _slots_for_log(done: _Programmed) -> dict[str, int]:
    """The policy entries with string keys: the daemon's JSON log renderer refuses tuple keys (and a
    log call that raises would fail the whole step)."""
    return {f"hook{h}/v{v}": e for (h, v), e in sorted(done.slots.items())}


EndpointPolicy = WorkloadPolicy | HostEndpointPolicy


def _hook_policy(want: EndpointPolicy, hook: int) -> PolicySet | None:
    if isinstance(want, HostEndpointPolicy):  # host endpoints: the natural direction
        return want.ingress if hook == defs.HOOK_TC_INGRESS else want.egress
    # TC ingress of the host-side interface sees packets *from* the workload.
    return want.from_workload if hook == defs.HOOK_TC_INGRESS else want.to_workload


def _xdp_policy(want: dict[int, EndpointPolicy] | None) -> dict[int, PolicySet]:
    """The families of an interface that want an XDP program (untracked ingress policy)."""
    return {v: p.xdp for v, p in (want or {}).items() if isinstance(p, HostEndpointPolicy) and p.xdp is not None}


RESYNC_BATCH = 250  # interfaces a periodic resync checks and rewrites per apply (~0.1 s of work)


class BPFEndpoints:
    """Desired state per workload interface and family; one ordered reconcile per apply."""

    def __init__(self, kernel: BPFKernel, *, redirect_peer: bool = True, nat_exclude_hosts: bool = False,
                 hold_attach: Callable[[str], bool] | None = None,
                 workload_prefixes: tuple[str, ...] = ("cali",), enforce_rpf: str = "Loose",
                 resync_batch: int = RESYNC_BATCH) -> None:
        self.kernel = kernel
        self._wl_prefixes = workload_prefixes
        self._host_ifstate: dict[str, int] = {}  # non-workload interface -> ifindex written NOT_MANAGED
        # Test hook (the FV attach-gap test): an interface it names is programmed up to, but not
        # including, the attach (step 6), and retried on every apply until released.
        self._hold_attach = hold_attach
        self._flags = defs.GLOBALS_REDIRECT_PEER if redirect_peer else 0
        if nat_exclude_hosts:  # NATOutgoingExclusions=IPPoolsAndHostIPs
            self._flags |= defs.GLOBALS_NATOUTGOING_EXCLUDE_HOSTS
        # BPFEnforceRPF (the programs apply it to new flows arriving on host endpoints).
        if enforce_rpf.lower() in ("strict", "loose"):
            self._flags |= defs.GLOBALS_RPF_OPTION_ENABLED
        if enforce_rpf.lower() == "strict":
            self._flags |= defs.GLOBALS_RPF_OPTION_STRICT
        self._want: dict[str, dict[int, EndpointPolicy]] = {}
        self._ifaces: dict[str, tuple[int, bool]] = {}  # name -> (ifindex, oper up)
        self._done: dict[str, _Programmed] = {}
        self._dirty: set[str] = set()
        self._start_of_day = True
        self._deny_held: dict[tuple[int, int], PolicyProgram] = {}  # (hook, family), during an apply
        self._sweep_sources = True  # the earlier run's policy sources (felixpy explain's), after the first apply
        # What this process last wrote per interface, so a reconcile that only swaps policy programs
        # does not rewrite identical counters / globals / cali_iface entries (a policy change reaches its
        # slots sooner); forgotten with the interface and on queue_resync, which rewrites them all.
        self._counted: set[tuple[int, int]] = set()  # (ifindex, hook) with a counters entry
        self._globals: dict[tuple[int, int], AttachPoint] = {}  # (ifindex, hook) -> written from
        self._ifstate_written: dict[str, tuple[int, int, tuple[tuple[str, int], ...]]] = {}
        # Interfaces whose slots and hooks the next reconcile checks against the kernel (queue_resync),
        # and those the periodic resync has still to come to, taken resync_batch an apply.
        self._verify: set[str] = set()
        self._resync_todo: list[str] = []
        self._resync_batch = max(1, resync_batch)
        self._failing: dict[str, str] = {}  # interface -> the error last logged for it (until it is programmed)
        self._drift = DriftTally(structlog.get_logger(__name__), driver="bpf_endpoints")  # own proxy per instance

    # ------------------------------------------------------------------ desired state (API)
    def set_workload(self, ip_version: int, iface: str, policy: WorkloadPolicy) -> None:
        self._set(ip_version, iface, policy)

    def remove_workload(self, ip_version: int, iface: str) -> None:
        self._remove(ip_version, iface)

    def set_host_endpoint(self, ip_version: int, iface: str, policy: HostEndpointPolicy) -> None:
        self._set(ip_version, iface, policy)

    def remove_host_endpoint(self, ip_version: int, iface: str) -> None:
        self._remove(ip_version, iface)

    def _set(self, ip_version: int, iface: str, policy: EndpointPolicy) -> None:
        fams = self._want.setdefault(iface, {})
        if fams.get(ip_version) != policy:
            fams[ip_version] = policy
            self._dirty.add(iface)

    def _remove(self, ip_version: int, iface: str) -> None:
        fams = self._want.get(iface)
        if fams is not None and fams.pop(ip_version, None) is not None:
            if not fams:
                del self._want[iface]
            self._dirty.add(iface)

    def ready_interfaces(self, ip_version: int) -> frozenset[str]:
        return frozenset(n for n, p in self._done.items() if ip_version in p.ready)

    def on_iface_kind(self, name: str, index: int, kind: str) -> None:
        """The monitor's link kind: the attacher chooses the mode from it (netkit is refused)
        instead of asking the kernel per interface."""
        self.kernel.attacher.learn_kind(name, kind)

    def on_iface_state(self, name: str, state: IfaceState, index: int) -> None:
        if state is IfaceState.UNKNOWN or not index:
            self.kernel.attacher.learn_kind(name, None)
        if state is IfaceState.UNKNOWN:
            self._ifaces.pop(name, None)
        else:
            self._ifaces[name] = (index, state is IfaceState.UP)
        if name in self._want or name in self._done:
            self._dirty.add(name)

    def queue_resync(self) -> None:
        """Check and rewrite every interface, :attr:`_resync_batch` an apply (a refresh still under way
        starts over: every interface is in the new pass)."""
        self._resync_todo = sorted({*self._want, *self._done}, reverse=True)  # popped from the end

    def _take_resync_batch(self) -> None:
        """The next interfaces of the resync pass: checked against the kernel and rewritten in this apply."""
        for _ in range(min(self._resync_batch, len(self._resync_todo))):
            iface = self._resync_todo.pop()
            self._dirty.add(iface)
            done = self._done.get(iface)
            if done is None:
                continue
            self._verify.add(iface)
            self._ifstate_written.pop(iface, None)
            for hook in (*HOOKS, XDP):
                self._counted.discard((done.ifindex, hook))
                self._globals.pop((done.ifindex, hook), None)

    def next_deadline(self) -> float | None:
        """Detaches wait for the apply after the *tables dropped the interface, and a resync pass
        continues in the next apply: come back soon."""
        pending = self._resync_todo or any(p.pending_detach for p in self._done.values())
        return 0.0 if pending else None

    def status_counts(self) -> dict[str, int]:
        """For ``felixpy status``: policy programs loaded, and TC hooks carrying our preamble."""
        attached = sum(len(HOOKS) + p.xdp_attached for p in self._done.values() if p.attached and not p.pending_detach)
        return {"bpf_programs": self.kernel.policies.num_loaded(), "bpf_attach_points": attached}

    # ------------------------------------------------------------------------------ apply
    def apply(self) -> None:
        self.apply_during(lambda: None)

    def apply_during(self, during: Callable[[], None]) -> None:
        """:meth:`apply`, running *during* (the loop's device steps after this one) while the ``tc
        -batch`` child attaches, or after step 5 when no child runs -- always before step 6.

        The policy programs' sources and new bytecode-cache entries are written off the critical
        path: queued while the slots are programmed and written on the policy writer's thread, from
        when the ``tc`` child attaches (or the end of this step) on, while the loop goes on with its
        other steps; it joins them at the end of the apply (:meth:`background_writes`).
        (:meth:`PolicyPrograms.deferred_writes` says why a restart before they are written cannot
        keep a wrong program.)"""
        pol = self.kernel.policies

        def while_attaching() -> None:
            pol.flush_deferred(background=True)
            during()

        with pol.deferred_writes(background=True):
            unsupported = self._apply_during(while_attaching)
        if self._sweep_sources:
            # Every wanted slot now holds this run's program and its source is written: the earlier
            # run's sources can go.
            pol.sweep_sources()
            self._sweep_sources = False
        if unsupported:
            raise unsupported[0]

    def background_writes(self) -> Future[None] | None:
        """The sources' writes this apply left on the writer thread: the loop joins them before the
        apply ends (``FinishesInBackground``)."""
        return self.kernel.policies.background_writes()

    def _apply_during(self, during: Callable[[], None]) -> list[UnsupportedFeature]:
        """The apply; raises when interfaces failed, returns what the kernel cannot do."""
        if self._start_of_day:
            self._restart_sync()
            self._start_of_day = False
        self._take_resync_batch()
        self._sync_host_ifstate()
        for ep in (EpType.WEP, EpType.HEP):
            fams = sorted({v for iface, fam in self._want.items() if self._ep_type(iface) is ep for v in fam})
            if fams:
                self.kernel.programs.prefetch_tc(ep, [v == 6 for v in fams])  # one compile run per type
        failures: dict[str, Exception] = {}
        unsupported: list[UnsupportedFeature] = []
        todo = sorted(self._dirty)
        self._dirty.clear()

        def failed(iface: str, e: Exception) -> None:
            if isinstance(e, UnsupportedFeature):
                unsupported.append(e)  # not retried: the kernel cannot do it
                return
            # Once per interface and error, not on every retry (every apply: a full map failing 3,000
            # endpoints wrote 30,000 lines a second); the apply's own error line counts them each time.
            text = f"{type(e).__name__}: {e}"
            if self._failing.get(iface) != text:
                self._failing[iface] = text
                log.warning("BPF endpoint not programmed; will retry", iface=iface, error=str(e),
                            error_type=type(e).__name__)
            failures[iface] = e
            self._dirty.add(iface)

        try:
            attaching: dict[str, list[AttachRequest]] = {}
            with self.kernel.policies.loading_ahead(self._programs_ahead(todo)):
                for iface in todo:
                    try:
                        reqs = self._reconcile(iface)                               # steps 1-4
                        if reqs:
                            attaching[iface] = reqs
                        elif reqs is not None:
                            self._attached(iface)                                   # step 6
                    except Exception as e:  # one interface's failure must not stop the others
                        failed(iface, e)
            # Step 5 for every interface of the batch at once (TC mode: batched netlink requests).
            refused: dict[str, Exception] = {}
            if attaching:
                try:
                    refused = self.kernel.attacher.attach_many([r for reqs in attaching.values() for r in reqs],
                                                               while_running=during)
                except Exception as e:  # nothing is known about any of them: all are retried
                    refused = dict.fromkeys(attaching, e)
            during()
            for iface in attaching:
                try:
                    err = refused.get(iface)
                    if err is not None:
                        raise err
                    self._attached(iface)                                           # step 6
                except Exception as e:
                    failed(iface, e)
            for gone in [i for i in self._failing if i not in self._want]:
                del self._failing[gone]  # (no longer wanted: nothing to report about it)
            if not self.kernel.xdp_metadata() and any(p.xdp_attached for p in self._done.values()):
                unsupported.append(UnsupportedFeature(XDP_METADATA_FEATURE, XDP_METADATA_DETAIL))
        finally:
            for prog in self._deny_held.values():
                self.kernel.policies.release(prog)
            self._deny_held.clear()
        if failures:
            raise EndpointProgrammingFailed(failures)  # drift found stays pending: counted once repaired
        self._drift.repaired()
        return unsupported

    def _programs_ahead(self, todo: list[str]) -> Iterator[tuple[PolicySet, int, bool]]:
        """The TC policy programs steps 2-3 will acquire for *todo*, in the order they will: each fresh
        slot's default-deny, then every slot's new policy (for :meth:`PolicyPrograms.loading_ahead`,
        which loads them while the loop works).  A hint only: what the loop does not take is closed.
        Reclaimed slots are left out (a restart adopts what is already loaded there)."""
        for iface in todo:
            want = self._want.get(iface)
            link = self._ifaces.get(iface)
            if not want or link is None or not link[1]:
                continue
            done = self._done.get(iface)
            if done is None or done.ifindex != link[0]:
                done = _Programmed(link[0])  # new or re-created: programmed afresh
            for hook in HOOKS:
                for v in FAMILIES:
                    ps = _hook_policy(want[v], hook) if v in want else None
                    hv = _HV[hook, v]
                    if ps is None or hv in done.reclaimed:
                        continue
                    deny_first, new_program = _slot_steps(done, hv, ps)
                    if deny_first:
                        yield DENY_ALL, hook, v == 6
                    if new_program:
                        yield ps, hook, v == 6

    def _restart_sync(self) -> None:
        """Take over what an earlier run left (see the module docstring)."""
        k = self.kernel
        ifstate = k.maps.ifstate
        by_index = {i: n for n, (i, _up) in self._ifaces.items()}
        xdp_candidates: dict[str, int] = {}  # host endpoints of the earlier run: they may carry its XDP program
        for key, val in list(ifstate.items()):
            ifindex = int(key.value) if hasattr(key, "value") else int(key)
            name = bytes(val.name).split(b"\0", 1)[0].decode(errors="replace")
            if val.flags & defs.IFACE_STATE_HEP and by_index.get(ifindex) == name:
                xdp_candidates[name] = ifindex
            if by_index.get(ifindex) == name and name in self._want and name not in self._done:
                self._reclaim(name, ifindex, val)
            elif by_index.get(ifindex) == name and self._is_host_iface(name) and \
                    val.flags == defs.IFACE_STATE_NOT_MANAGED:
                self._host_ifstate[name] = ifindex  # still right: kept, so forwarding never pauses
            else:
                log.info("Deleting a stale cali_iface entry", ifindex=ifindex, iface=name,
                         now=by_index.get(ifindex))
                ifstate.delete(ctypes.c_uint32(ifindex))
        unwanted = {n: i for n, (i, _up) in self._ifaces.items() if n not in self._want}
        try:
            candidates = k.attacher.sweep_candidates(unwanted) if unwanted else set()
        except Exception as e:  # not narrowed down: every interface is checked
            log.warning("Could not narrow the sweep down", error=str(e), error_type=type(e).__name__)
            candidates = set(unwanted)
        for name, ifindex in unwanted.items():
            try:
                if name in candidates and any(self._attached_any(name, ifindex)):
                    log.info("Detaching BPF programs from an interface that is no longer a workload", iface=name)
                    k.attacher.detach(name, ifindex)
            except Exception as e:  # one interface must not keep every workload from being programmed
                log.warning("Could not sweep BPF programs from an interface", iface=name, error=str(e),
                            error_type=type(e).__name__)
        k.attacher.sweep({n: i for n, (i, _up) in self._ifaces.items()})
        for name, ifindex in xdp_candidates.items():
            if not _xdp_policy(self._want.get(name)):
                try:
                    k.xdp.detach(name, ifindex)
                except Exception as e:
                    log.warning("Could not sweep the XDP program from an interface", iface=name, error=str(e),
                                error_type=type(e).__name__)
        self._free_unowned_entries()

    def _reclaim(self, iface: str, ifindex: int, val: mt.IfStateValue) -> None:
        done = _Programmed(ifindex)
        reclaimed: set[tuple[int, int]] = set()
        xdp = _xdp_policy(self._want[iface])
        for hook in (*HOOKS, XDP):
            for v in FAMILIES:
                entry = int(getattr(val, f"{_IFSTATE_FIELD[hook]}_v{v}"))
                if 0 <= entry < self.kernel.slots[hook].size and v in (xdp if hook == XDP else self._want[iface]):
                    try:
                        self.kernel.slots[hook].assign(entry, f"{iface}/v{v}")
                    except ValueError:
                        log.warning("Policy entry claimed twice in cali_iface; allocating a new one",
                                    iface=iface, entry=entry)
                        continue
                    done.slots[_HV[hook, v]] = entry
                    reclaimed.add(_HV[hook, v])
        done.reclaimed = frozenset(reclaimed)
        done.ready = frozenset(v for v in FAMILIES if val.flags & _READY[v] and v in self._want[iface])
        done.attached = False  # checked against this process's preamble in _reconcile
        self._done[iface] = done
        self._dirty.add(iface)
        log.info("Reclaimed a BPF endpoint from the previous run", iface=iface, ifindex=ifindex,
                 slots=_slots_for_log(done))

    def _free_unowned_entries(self) -> None:
        """Clear every policy entry (all its parts) that no interface of this run owns."""
        for hook in (*HOOKS, XDP):
            jm = self.kernel.maps.jumps(hook)
            if jm.created_empty:
                continue  # made by this process: no earlier run's entry can be in it (10,000 lookups saved)
            alloc = self.kernel.slots[hook]
            owned = {e for p in self._done.values() for (h, _v), e in p.slots.items() if h == hook}
            stride = self.kernel.policies.stride(hook)
            freed = 0
            for entry in range(alloc.size):
                if entry in owned or jm.get(ctypes.c_uint32(entry)) is None:
                    continue
                for part in range(defs.MAX_POLICY_SUBPROGS):
                    jm.delete(ctypes.c_uint32(entry + part * stride))
                freed += 1
            if freed:
                log.info("Freed policy entries left by an earlier run", hook=hook, entries=freed)

    def _is_host_iface(self, name: str) -> bool:
        return not name.startswith(self._wl_prefixes)

    def _ep_type(self, name: str) -> EpType:
        return EpType.HEP if self._is_host_iface(name) else EpType.WEP

    def _sync_host_ifstate(self) -> None:
        """NOT_MANAGED entries for exactly the existing non-workload interfaces that are not host
        endpoints (minimal delta); a host endpoint's entry is written by its reconcile."""
        want = {n: i for n, (i, _up) in self._ifaces.items()
                if self._is_host_iface(n) and n not in self._want and n not in self._done}
        ifstate = self.kernel.maps.ifstate
        for name, idx in list(self._host_ifstate.items()):
            if want.get(name) != idx:
                link = self._ifaces.get(name)
                if name not in self._want or link is None or link[0] != idx:
                    ifstate.delete(ctypes.c_uint32(idx))  # (a new host endpoint's reconcile overwrites it)
                del self._host_ifstate[name]
                for wl in [w for w, rec in self._ifstate_written.items() if rec[0] == idx]:
                    del self._ifstate_written[wl]  # an entry re-used at this ifindex: not ours to trust now
        for name, idx in want.items():
            if name not in self._host_ifstate:
                self._mark_not_managed(name, idx)

    def _mark_not_managed(self, name: str, idx: int) -> None:
        """A host interface without programs: NOT_MANAGED, so forwarding to it stays approved."""
        self.kernel.maps.ifstate.set(ctypes.c_uint32(idx), mt.ifstate_value(defs.IFACE_STATE_NOT_MANAGED, name))
        self._host_ifstate[name] = idx

    def _attached_any(self, name: str, ifindex: int) -> Iterable[bool]:
        for hook in HOOKS:
            try:
                yield self.kernel.attacher.is_attached(name, ifindex, hook)
            except (OSError, UnsupportedFeature):
                yield False

    def _reconcile(self, iface: str) -> list[AttachRequest] | None:
        """Steps 1-4 for *iface*; returns the attaches step 5 needs (the caller makes them, with
        every other interface's, then calls :meth:`_attached`), or None when nothing more is to
        be done this apply (removed, not up, attach held)."""
        want = self._want.get(iface)
        link = self._ifaces.get(iface)
        done = self._done.get(iface)
        if done is not None and (link is None or link[0] != done.ifindex):
            self._forget(iface, done, detach=False)  # the interface went away (or was re-created)
            done = None
        if not want or link is None or not link[1]:
            if done is not None:
                self._retire(iface, done)
            return None
        ifindex = link[0]
        if done is None:
            done = self._done[iface] = _Programmed(ifindex)
        done.pending_detach = False
        k = self.kernel
        verify = iface in self._verify
        self._verify.discard(iface)
        for hook in HOOKS:                                                          # 1
            self._ensure_counters(ifindex, hook)
        for hook in HOOKS:                                                          # 2, 3
            for v in FAMILIES:
                if v in want:
                    self._program_slot(iface, done, hook, v, _hook_policy(want[v], hook), verify=verify)
                else:
                    self._release_slot(done, hook, v)
        for hook in HOOKS:                                                          # 4
            self._ensure_globals(iface, done, hook)
        self._reconcile_xdp(iface, done, want, verify=verify)                      # untracked ingress
        if self._hold_attach is not None and self._hold_attach(iface) and not done.attached:
            log.info("BPF attach held back (test hook)", iface=iface)
            self._dirty.add(iface)
            return None
        reqs: list[AttachRequest] = []
        if done.attached and verify:
            # Our current preamble, as a restart checks it (TC: libbpf's filter query and the program's
            # tag; a dump of the hook's filters through pyroute2 was ~1 ms a hook, ~2.5 s of a 5,000
            # workload refresh).  Another program there is lost too, and re-attached over.
            lost = sum(1 for hook in HOOKS
                       if not k.attacher.is_current(iface, ifindex, hook, k.programs.preamble_fd(hook)))
            if lost:
                log.warning("BPF preamble found detached; re-attaching", iface=iface, hooks_lost=lost)
                self._drift.found("bpf_attachment", lost)
                done.attached = False  # a failed re-attach is retried, not counted again
        if not done.attached:                                                        # 5
            # (An attachment lost behind our back is found by the refresh's check above, not on
            # every reconcile: asking the kernel cost ~2 ms an interface on each policy change.)
            for hook in HOOKS:
                fd = k.programs.preamble_fd(hook)
                if done.reclaimed and k.attacher.is_current(iface, ifindex, hook, fd):
                    continue  # the previous run's preamble: the same code over the same maps
                reqs.append(AttachRequest(iface, ifindex, hook, fd))
        return reqs

    def _attached(self, iface: str) -> None:
        """After step 5 (both hooks carry the preamble): step 6, READY for each programmed family."""
        done = self._done[iface]
        want = self._want[iface]
        done.attached = True
        if self._failing.pop(iface, None) is not None:
            log.info("BPF endpoint programmed after earlier failures", iface=iface)
        done.reclaimed = frozenset()
        ready = frozenset(want)
        self._write_ifstate(iface, done, ready)                                     # 6
        done.ready = ready
        log.debug("BPF endpoint programmed", iface=iface, ifindex=done.ifindex, families=sorted(ready),
                  slots=_slots_for_log(done))

    # ------------------------------------------------------------------------------ steps
    def _ensure_counters(self, ifindex: int, hook: int) -> None:
        if (ifindex, hook) in self._counted:
            return
        try:
            self.kernel.maps.counters.set(mt.CountersKey(ifindex, hook), mt.CountersValue(), sc.NOEXIST)
        except BPFSyscallError as e:
            if e.errno != errno.EEXIST:
                raise
        self._counted.add((ifindex, hook))

    def _program_slot(self, iface: str, done: _Programmed, hook: int, v: int, ps: PolicySet | None, *,
                      verify: bool = False) -> None:
        pol = self.kernel.policies
        hv = _HV[hook, v]
        entry = done.slots.get(hv)
        if verify and ps is not None and entry is not None and done.policy.get(hv) is not None and \
                self.kernel.maps.jumps(hook).get(ctypes.c_uint32(entry)) is None:
            log.warning("BPF policy slot found empty; reinstalling", iface=iface, hook=hook, ip_version=v,
                        entry=entry)
            self._drift.found("bpf_policy")
            done.policy.pop(hv, None)  # reinstalled below (no default-deny step: it was enforcing)
            self._install(hook, entry, v, ps)
            done.policy[hv] = ps
        if entry is None:
            entry = self.kernel.slots[hook].get(f"{iface}/v{v}")
            done.slots[hv] = entry
            done.policy.pop(hv, None)
        reclaimed = hv in done.reclaimed
        if ps is None:
            # An empty slot: the main program allows when its tail call finds nothing there (host
            # interfaces only).  Whatever this or an earlier run installed goes, every part of it; no
            # default-deny step, since an empty slot is open anyway.
            if done.policy.get(hv) is not None or hv not in done.policy:
                pol.uninstall(hook, entry)
                if reclaimed:
                    self._clear_parts_after(hook, entry, 1)
                done.policy[hv] = None
            return
        deny_first, new_program = _slot_steps(done, hv, ps)
        if deny_first:
            if hv not in self._deny_held:  # kept loaded for the rest of this apply
                self._deny_held[hv] = pol.acquire(DENY_ALL, hook=hook, v6=(v == 6))
            self._install(hook, entry, v, DENY_ALL)  # a fresh slot holds default-deny first
        if new_program:
            # A reclaimed slot that already holds this very program is taken over as it is: no load,
            # no write (the restart rewrites nothing that is right).
            adopted = reclaimed and hv not in done.policy and \
                pol.adopt(ps, hook=hook, v6=(v == 6), entry=entry)
            if not adopted:
                self._install(hook, entry, v, ps)
            done.policy[hv] = ps
            # The previous run's program may have had more parts -- but not an adopted one: adopt() read
            # the parts up to the first empty one and found exactly ours (a part past a gap is never
            # jumped to).  At 10,000 reclaimed slots the clearing was 230,000 deletes, ~0.7 s of a restart.
            if reclaimed and not adopted:
                prog = pol.installed(hook, entry)
                self._clear_parts_after(hook, entry, len(prog.fds) if prog else 1)
        assert pol.installed(hook, entry) is not None

    def _install(self, hook: int, entry: int, v: int, ps: PolicySet, xdp: XdpSlots | None = None) -> None:
        pol = self.kernel.policies
        prog = pol.acquire(ps, hook=hook, v6=(v == 6), xdp=xdp)
        try:
            pol.install(hook, entry, prog)
        except Exception:
            pol.release(prog)
            raise

    def _clear_parts_after(self, hook: int, entry: int, first: int) -> None:
        """Delete the policy entry's parts from *first* on (a previous run's program may have had more)."""
        jm = self.kernel.maps.jumps(hook)
        stride = self.kernel.policies.stride(hook)
        for part in range(first, defs.MAX_POLICY_SUBPROGS):
            jm.delete(ctypes.c_uint32(entry + part * stride))

    def _release_slot(self, done: _Programmed, hook: int, v: int) -> None:
        entry = done.slots.pop((hook, v), None)
        done.policy.pop((hook, v), None)
        if entry is not None:
            self.kernel.policies.uninstall(hook, entry)
            self.kernel.slots[hook].put(entry)

    # ------------------------------------------------------------------ XDP (untracked ingress)
    def _reconcile_xdp(self, iface: str, done: _Programmed, want: dict[int, EndpointPolicy], *,
                       verify: bool) -> None:
        """A host endpoint's untracked ingress policy: the XDP program on its interface -- counters
        entry, a policy entry per family in ``xdp_cali_jump``, the ``xdp_cali_glob`` globals, then the
        preamble (Felix's order).  No default-deny step: an XDP slot that is empty, or whose policy
        does not match, passes the packet on to TC, whose tracked policy still applies, so a new or
        half-programmed XDP hook is never more open than no XDP at all."""
        xdp = _xdp_policy(want)
        if not xdp:
            self._drop_xdp(iface, done, detach=True)
            return
        k = self.kernel
        ifindex = done.ifindex
        self._ensure_counters(ifindex, XDP)
        for v in FAMILIES:
            if v in xdp:
                self._program_xdp_slot(iface, done, v, xdp[v], verify=verify)
            else:
                self._release_slot(done, XDP, v)
        self._ensure_globals(iface, done, XDP)
        fd = k.programs.preamble_fd(XDP)
        if done.xdp_attached and verify and not k.xdp.is_attached(iface, ifindex):
            log.warning("XDP preamble found detached; re-attaching", iface=iface)
            self._drift.found("bpf_attachment")
            done.xdp_attached = False
        if not done.xdp_attached:
            if not k.xdp.is_current(iface, ifindex, fd):  # an earlier run's, same code over the same maps
                k.xdp.attach(iface, ifindex, fd)
            done.xdp_attached = True

    def _program_xdp_slot(self, iface: str, done: _Programmed, v: int, ps: PolicySet, *, verify: bool) -> None:
        pol = self.kernel.policies
        hv = _HV[XDP, v]
        entry = done.slots.get(hv)
        if entry is None:
            entry = self.kernel.slots[XDP].get(f"{iface}/v{v}")
            done.slots[hv] = entry
            done.policy.pop(hv, None)
        elif verify and done.policy.get(hv) is not None and \
                self.kernel.maps.jumps(XDP).get(ctypes.c_uint32(entry)) is None:
            log.warning("XDP policy slot found empty; reinstalling", iface=iface, ip_version=v, entry=entry)
            self._drift.found("bpf_policy")
            done.policy.pop(hv, None)
        if done.policy.get(hv) == ps:
            return
        # The policy program tail-calls the XDP main program's "allowed" or "drop" sub-program.
        allow, deny = self.kernel.programs.xdp_continuations(v == 6, False)
        self._install(XDP, entry, v, ps, XdpSlots(allow, deny, entry))
        done.policy[hv] = ps
        if hv in done.reclaimed:  # the previous run's program may have had more parts
            prog = pol.installed(XDP, entry)
            self._clear_parts_after(XDP, entry, len(prog.fds) if prog else 1)

    def _drop_xdp(self, iface: str, done: _Programmed, *, detach: bool) -> None:
        """The interface no longer wants XDP (or goes): preamble off first, then slots and globals."""
        slots = [v for (hook, v) in done.slots if hook == XDP]
        if not (done.xdp_attached or slots or (done.ifindex, XDP) in self._globals):
            return
        k = self.kernel
        if detach and done.xdp_attached:
            k.xdp.detach(iface, done.ifindex)
        done.xdp_attached = False
        for v in slots:
            self._release_slot(done, XDP, v)
        self._globals.pop((done.ifindex, XDP), None)
        self._counted.discard((done.ifindex, XDP))
        unconfigure(AttachPoint(iface, done.ifindex, XDP), k.maps)
        k.maps.counters.delete(mt.CountersKey(done.ifindex, XDP))

    def _ensure_globals(self, iface: str, done: _Programmed, hook: int) -> None:
        """The hook's preamble globals for this interface, written when they differ from the last write."""
        ap = self._attach_point(iface, done, hook)
        if self._globals.get((done.ifindex, hook)) != ap:
            self._globals.pop((done.ifindex, hook), None)  # unknown until written
            # (The counters entry is step 1's, written before the slots: not asked for again, which
            # at 1,000 interfaces was 2,000 more syscalls, each failing EEXIST.)
            configure(ap, self.kernel.programs, self.kernel.maps, counters=False)
            self._globals[(done.ifindex, hook)] = ap

    def _attach_point(self, iface: str, done: _Programmed, hook: int) -> AttachPoint:
        return AttachPoint(iface, done.ifindex, hook, self._ep_type(iface),
                           ipv4=(hook, 4) in done.slots, ipv6=(hook, 6) in done.slots,
                           policy_idx_v4=done.slots.get((hook, 4), -1),
                           policy_idx_v6=done.slots.get((hook, 6), -1), flags=self._flags,
                           dscp=self._egress_dscp(iface, hook))

    def _egress_dscp(self, iface: str, hook: int) -> int:
        """The endpoint's DSCP on the hook its traffic leaves by -- a workload's from-workload program
        (TC ingress), a host endpoint's TC egress -- else -1; both families' managers read it from the
        same endpoint."""
        leaves_by = defs.HOOK_TC_EGRESS if self._is_host_iface(iface) else defs.HOOK_TC_INGRESS
        if hook != leaves_by:
            return -1
        return max((p.dscp for p in self._want.get(iface, {}).values()), default=-1)

    def _write_ifstate(self, iface: str, done: _Programmed, ready: frozenset[int]) -> None:
        flags = defs.IFACE_STATE_HEP if self._is_host_iface(iface) else defs.IFACE_STATE_WEP
        for v in ready:
            flags |= _READY[v]
        idx = {f"{_IFSTATE_FIELD[hook]}_v{v}": e for (hook, v), e in done.slots.items()}
        written = (done.ifindex, flags, tuple(sorted(idx.items())))
        if self._ifstate_written.get(iface) == written:
            return
        self._ifstate_written.pop(iface, None)  # unknown until written
        self.kernel.maps.ifstate.set(ctypes.c_uint32(done.ifindex), mt.ifstate_value(flags, iface, **idx))
        self._ifstate_written[iface] = written

    def _retire(self, iface: str, done: _Programmed) -> None:
        """Phase 1 of removal: not READY, slots deny; phase 2 (next apply): detach and release.

        A host endpoint has no *tables allow list to leave first and must not pass through deny
        (removing it restores open traffic): detached and released at once, its interface back to
        NOT_MANAGED."""
        if self._is_host_iface(iface):
            self._forget(iface, done, detach=True)
            return
        if done.ready or not done.pending_detach:
            self._write_ifstate(iface, done, frozenset())
            for (hook, v), entry in done.slots.items():
                if done.policy.get((hook, v)) != DENY_ALL:
                    self._install(hook, entry, v, DENY_ALL)
                    done.policy[(hook, v)] = DENY_ALL
            done.ready = frozenset()
            done.pending_detach = True
            self._dirty.add(iface)  # come back for phase 2
            return
        self._forget(iface, done, detach=True)

    def _forget(self, iface: str, done: _Programmed, *, detach: bool) -> None:
        k = self.kernel
        self._drop_xdp(iface, done, detach=detach)
        if detach and done.attached:
            k.attacher.detach(iface, done.ifindex)
        for hook, v in list(done.slots):
            self._release_slot(done, hook, v)
        for hook in HOOKS:
            self._globals.pop((done.ifindex, hook), None)
            self._counted.discard((done.ifindex, hook))
            unconfigure(AttachPoint(iface, done.ifindex, hook), k.maps)
            k.maps.counters.delete(mt.CountersKey(done.ifindex, hook))
        self._ifstate_written.pop(iface, None)
        link = self._ifaces.get(iface)
        if self._is_host_iface(iface) and link is not None and link[0] == done.ifindex:
            self._mark_not_managed(iface, done.ifindex)  # a host interface that stops being a host endpoint
        else:
            k.maps.ifstate.delete(ctypes.c_uint32(done.ifindex))
        del self._done[iface]
        log.info("BPF endpoint removed", iface=iface, ifindex=done.ifindex)
