"""What the failsafe manager asks of the failsafe-map driver: values and a Protocol.

A failsafe port lets traffic to (inbound) or from (outbound) this host through the host
endpoint programs without policy, so a bad policy cannot cut the node off: inbound entries
match (protocol, destination port, source address), outbound ones (protocol, destination
port, destination address), Felix's key layout (``bpf-gpl/failsafe_types.h``).  Nothing here
touches the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True, order=True)
class FailsafePort:
    """One map entry: ``ip_proto`` 6/17, ``port``, the peer ``cidr`` (this family) and direction."""

    ip_proto: int
    port: int
    cidr: str
    outbound: bool


class BPFFailsafesAPI(Protocol):
    ip_version: int

    def set_ports(self, ports: frozenset[FailsafePort]) -> None:
        """The complete set of failsafe entries of this family (written in ``apply()``)."""
