"""Contracts between the event loop and the managers.

``on_update(msg)`` receives each proto *payload* message (e.g. a
``felix.IPSetUpdate``, not the ``ToDataplane`` envelope) and the interface
monitor's :class:`IfaceStateUpdate` / :class:`IfaceAddrsUpdate`.  It must be
cheap and must not touch the kernel: stash the data, mark things dirty.  It may
push desired state into driver objects (tables, IP sets), which only record it.

``complete_deferred_work()`` walks the dirty set and pushes desired state into
the drivers.  It may raise; the loop then keeps the dataplane marked as needing
sync and calls it again on the next apply.

A manager may declare the message types its ``on_update`` acts on, as a class attribute
``update_types`` (a tuple of types; subclasses count): the loop then hands it only those (under a
flood most managers ignore most messages, and calling each one's ``isinstance`` chain for every
message was a sixth of the runner thread).  Without it a manager gets every message.
``tests/test_update_types.py`` checks each declaration against the ``isinstance`` checks of the
manager's ``on_update`` and the methods it calls.

A manager whose ``complete_deferred_work()`` hands desired sets to an IP-set dataplane
declares it with the class attribute ``writes_ip_sets = True``.  The loop runs those managers
first, starts the IP-set write on a worker, and renders every other manager's rules while the set
write runs (the sets still reach the kernel before the tables that use them).  So a manager
*without* the declaration must not touch an IP-set dataplane in ``complete_deferred_work()``, and
no manager may in ``on_devices_applied()`` (the write is joined only before the tables): IP-set
dataplanes are single-threaded by contract.
``tests/test_update_types.py`` checks every manager's source against its declaration.

A manager may define ``render_ahead()``: the part of its deferred work that only renders into
desired state -- no kernel, no other manager's results, no IP-set dataplane, and interface state only
where a later change of it re-dirties what was computed from it (the BPF route manager's ifindexes).
Before the first ``InSync`` the loop runs it as the feed arrives
(:meth:`~felixpy.dataplane.core.InternalDataplane.render_ahead`), so the start of day's first apply
finds it done: the policy manager's is all of ``complete_deferred_work()`` (Felix's policy manager
renders in ``OnUpdate`` itself); the endpoint manager's is each endpoint's chains and routes and the
dispatch chains that reference them, not the interfaces' configuration.  Nothing is written until the
apply after ``InSync``.

Optional extras are discovered structurally (``isinstance`` on the runtime
checkable protocols below):

* :class:`UpdateBatchResolver` — ``resolve_update_batch()`` settles
  cross-manager state before any programming;
* :class:`ManagerWithRouteTables` / :class:`ManagerWithRouteRules` — expose
  route/rule syncers the loop applies in parallel with the tables;
* :class:`ManagerWithStatus` — endpoint status to report after an apply;
* :class:`DevicesConsumer` — ``on_devices_applied()`` runs after the tunnel
  devices and interface sysctls were reconciled (and before IP sets, tables
  and routes), to read the syncers' results (MTU, ifindex, keys, interface
  configuration) — never the kernel;
* :class:`FeedReporter` — other messages for the feed (``WireguardStatusUpdate``).

A devices consumer whose ``on_devices_applied()`` reads only the tunnel devices' syncer (the VXLAN,
IPIP and WireGuard managers: the device's MTU, ifindex, key) declares it with the class attribute
``reads_only_tunnel_devices = True``, and that syncer declares ``tunnel_device_syncer = True``.
When a device syncer waits on a child (BPF mode's attach), the loop runs those consumers, then the
FDB and the routes' start, before that wait rather than after it -- only if every tunnel-device
syncer comes before the waiting one, else the usual order holds.  A consumer with the declaration
must read nothing else another device syncer makes (interface configuration, attach state).  Any
other consumer that owns routes or rules keeps the routes after it unless it declares
``sets_no_routes_after_devices = True`` (the endpoint manager: it only reports status there).

Drivers the loop applies declare their optional hooks the same way:
:class:`HasDeadline` (``next_deadline()``: seconds until the loop should apply
again — grace periods, device re-checks, retries) and :class:`WatchesIfaces`
(``on_iface_state()``: interface state, forwarded by the loop as Felix does), and
:class:`WatchesLinkKinds` (``on_iface_kind()``: the link kind the monitor decoded, given just
before the state of the same update).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from felixpy.ifacemonitor.events import IfaceState


@runtime_checkable
class Manager(Protocol):
    def on_update(self, msg: Any) -> None: ...

    def complete_deferred_work(self) -> None: ...


@runtime_checkable
class UpdateBatchResolver(Protocol):
    def resolve_update_batch(self) -> None: ...


@runtime_checkable
class Syncer(Protocol):
    """A driver the loop applies as one unit (route table, rule set, FDB)."""

    def queue_resync(self) -> None: ...

    def apply(self) -> None: ...


class NamedSyncer(Syncer, Protocol):
    """A syncer named for its step in the apply report (the cleanup-only drivers)."""

    name: str
    ip_version: int


@runtime_checkable
class ManagerWithRouteTables(Protocol):
    def route_table_syncers(self) -> Sequence[Syncer]: ...


@runtime_checkable
class ManagerWithRouteRules(Protocol):
    def route_rule_syncers(self) -> Sequence[Syncer]: ...


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    """Status to report for one endpoint; ``status`` "" means remove the report."""

    kind: str  # "workload" | "host"
    endpoint_id: Any  # proto WorkloadEndpointID / HostEndpointID
    status: str  # "up" | "down" | "error" | ""


@runtime_checkable
class ManagerWithStatus(Protocol):
    def pop_status_updates(self) -> list[EndpointStatus]: ...


@runtime_checkable
class DevicesConsumer(Protocol):
    def on_devices_applied(self) -> None: ...


@runtime_checkable
class FeedReporter(Protocol):
    def pop_feed_messages(self) -> list[Any]:
        """``FromDataplane`` payload messages to send (e.g. ``WireguardStatusUpdate``)."""
        ...


@runtime_checkable
class HasDeadline(Protocol):
    def next_deadline(self) -> float | None: ...


@runtime_checkable
class PrefetchesReadBack(Protocol):
    """A driver whose next apply must first read the kernel back (start of day, after a failure) and
    can start that read now, off the apply thread, so that it overlaps the managers' work.  Reads only;
    a driver with nothing to read does nothing."""

    def prefetch(self) -> None: ...


@runtime_checkable
class PrefetchesBeforeInSync(Protocol):
    """A driver whose start-of-day read-back is long enough to start before ``InSync``, while the feed
    still arrives (the loop's ``render_ahead``).  Returns whether it started one; the first apply then
    takes that read instead of prefetching another.  The read is older than the apply that takes it, so
    the driver checks it again in the background once that apply is done (docs/iptables.md)."""

    def prefetch_before_insync(self) -> bool: ...


@runtime_checkable
class HashesAhead(Protocol):
    """A table that can render and hash its changed chains now, on a thread of its own: the work its
    apply starts with, pure computation, begun once the managers are done with it for this apply so that
    it overlaps the IP-set write the tables wait for.  The table finishes it before anything else of its
    own runs (its apply, or a manager's next update); a table with nothing to hash does nothing."""

    def hash_ahead(self) -> None: ...


@runtime_checkable
class WaitsOnChild(Protocol):
    """A device syncer whose apply waits on a child process (BPF mode's ``tc -batch`` attach) and can
    let *during* -- the device steps registered after it -- run on this thread while it waits.
    *during* runs its work once however often it is called; ``apply_during`` calls it before anything it
    does after the wait, and the loop calls it afterwards in case it did not (a failure before then)."""

    def apply_during(self, during: Callable[[], None]) -> None: ...


@runtime_checkable
class FinishesInBackground(Protocol):
    """A device syncer whose apply leaves writes running on a thread of its own (BPF mode's policy
    program sources): the loop joins them with the routes, at the end of the same apply, so every
    kernel write is still inside ``apply()`` and behind the apply's status reports."""

    def background_writes(self) -> Future[None] | None: ...


@runtime_checkable
class WatchesIfaces(Protocol):
    def on_iface_state(self, name: str, state: IfaceState, index: int) -> None: ...


@runtime_checkable
class WatchesLinkKinds(Protocol):
    def on_iface_kind(self, name: str, index: int, kind: str) -> None:
        """Interface *name* at *index* has link kind *kind* ("" for none), from the monitor's
        RTM_NEWLINK; only for updates that carry a kind (not for a vanished interface)."""
        ...
