"""What the BPF endpoint manager asks of the BPF endpoint driver: values and a Protocol.

A workload interface is programmed per IP family: the manager computes, from the feed, the two
policy sets one family of one interface enforces (:class:`WorkloadPolicy`) and hands them to a
:class:`BPFEndpointsAPI`; the driver turns them into counters, policy jump slots, programs,
globals, attachments and ``cali_iface`` READY flags.  The manager reads back which interfaces
are READY for its family (programs in place on both hooks) to admit them to the *tables allow
list.  Nothing here touches the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from felixpy.bpf.policy_ir import PolicySet


@dataclass(frozen=True, slots=True)
class WorkloadPolicy:
    """One family's policy for one workload interface.

    ``to_workload`` is the policy *ingress* direction (run by the program on the kernel's TC
    egress of the host-side interface); ``from_workload`` the policy egress direction (TC
    ingress)."""

    to_workload: PolicySet
    from_workload: PolicySet
    # The endpoint's QoS DSCP (0-63) for what it sends out of the cluster, -1 for none: the programs
    # set it on the packets of such flows (the *tables modes' mangle cali-egress-dscp).
    dscp: int = -1


@dataclass(frozen=True, slots=True)
class HostEndpointPolicy:
    """One family's policy for one host data interface (a host endpoint's, or the ``*`` one's).

    Host endpoints have the natural relation between policy direction and kernel hook (Felix):
    ``ingress`` (traffic from the interface into the host, or forwarded from it) runs on TC
    ingress, ``egress`` on TC egress.  None leaves that hook's policy slot empty, which the main
    program takes as allow on a host interface (a data interface no host endpoint covers, as Felix
    programs one)."""

    ingress: PolicySet | None
    egress: PolicySet | None
    # The HEP's untracked (doNotTrack) ingress policy, run by an XDP program on the interface before
    # TC (None: no XDP program).  Its egress side is *tables raw OUTPUT's, not the programs'.
    xdp: PolicySet | None = None
    # The HEP's QoS DSCP (0-63) for what the host sends out of the cluster through it, -1 for none.
    dscp: int = -1


class BPFEndpointsAPI(Protocol):
    def set_workload(self, ip_version: int, iface: str, policy: WorkloadPolicy) -> None:
        """Record the desired policy of *iface* for one family (programmed in ``apply()``)."""

    def remove_workload(self, ip_version: int, iface: str) -> None:
        """*iface* no longer has a workload of this family."""

    def set_host_endpoint(self, ip_version: int, iface: str, policy: HostEndpointPolicy) -> None:
        """Record the host-endpoint policy of host interface *iface* for one family."""

    def remove_host_endpoint(self, ip_version: int, iface: str) -> None:
        """*iface* is no longer a host endpoint of this family (its programs go once no family wants them)."""

    def ready_interfaces(self, ip_version: int) -> frozenset[str]:
        """Interfaces whose programs are attached on both hooks with this family's policy."""
