"""Chain names, name prefixes and policy/profile identities (Felix's ``rule_defs.go``, ``types/``).

Every chain felixpy owns starts with ``cali-``.  Per-endpoint, policy and
profile chains embed a user-controlled string, so they go through
:func:`length_limited_id` (libcalico-go ``hash.GetLengthLimitedID``): if
``prefix + suffix`` is longer than the limit (28 for iptables, 256 for
nftables), or exactly at the limit with a suffix that starts with ``_``, the
name becomes ``prefix + "_" + <URL-safe unpadded base64 of SHA-256(suffix)>``
cut to the limit.  An empty suffix is treated as ``_``.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from felixpy.proto import felixbackend_pb2 as pb

__all__ = [
    "ALL_INTERFACES",
    "IPTABLES_MAX_CHAIN_NAME_LENGTH",
    "KIND_SHORT_NAMES",
    "NFTABLES_MAX_CHAIN_NAME_LENGTH",
    "OWNED_CHAIN_PREFIXES",
    "STAGED_KINDS",
    "PolicyID",
    "ProfileID",
    "endpoint_chain_name",
    "kind_is_staged",
    "length_limited_id",
    "policy_chain_name",
    "profile_chain_name",
]

IPTABLES_MAX_CHAIN_NAME_LENGTH = 28
NFTABLES_MAX_CHAIN_NAME_LENGTH = 256

CHAIN_NAME_PREFIX = "cali-"
# Every prefix Felix has ever used for its chains (for cleanup of old chains).
OWNED_CHAIN_PREFIXES = ("cali-", "califw-", "calitw-", "califh-", "calith-", "calipi-", "calipo-", "felix-")

CHAIN_FILTER_INPUT = "cali-INPUT"
CHAIN_FILTER_FORWARD = "cali-FORWARD"
CHAIN_FILTER_OUTPUT = "cali-OUTPUT"
CHAIN_RAW_PREROUTING = "cali-PREROUTING"
CHAIN_RAW_OUTPUT = "cali-OUTPUT"
CHAIN_RAW_UNTRACKED_FLOWS = "cali-untracked-flows"  # BPF mode
CHAIN_RAW_BPF_UNTRACKED_POLICY = "cali-untracked-policy"  # BPF mode
CHAIN_NAT_PREROUTING = "cali-PREROUTING"
CHAIN_NAT_POSTROUTING = "cali-POSTROUTING"
CHAIN_NAT_OUTPUT = "cali-OUTPUT"
CHAIN_NAT_OUTGOING = "cali-nat-outgoing"
CHAIN_MANGLE_PREROUTING = "cali-PREROUTING"
CHAIN_MANGLE_POSTROUTING = "cali-POSTROUTING"
CHAIN_FAILSAFE_IN = "cali-failsafe-in"
CHAIN_FAILSAFE_OUT = "cali-failsafe-out"
CHAIN_EGRESS_DSCP = "cali-egress-dscp"
CHAIN_FIP_DNAT = "cali-fip-dnat"
CHAIN_FIP_SNAT = "cali-fip-snat"
CHAIN_CIDR_BLOCK = "cali-cidr-block"
CHAIN_WORKLOAD_TO_HOST = "cali-wl-to-host"
CHAIN_FROM_WORKLOAD_DISPATCH = "cali-from-wl-dispatch"
CHAIN_TO_WORKLOAD_DISPATCH = "cali-to-wl-dispatch"
NFT_FROM_WORKLOAD_DISPATCH_MAP = "cali-from-wl-dispatch"
NFT_TO_WORKLOAD_DISPATCH_MAP = "cali-to-wl-dispatch"
CHAIN_DISPATCH_TO_HOST_ENDPOINT = "cali-to-host-endpoint"
CHAIN_DISPATCH_FROM_HOST_ENDPOINT = "cali-from-host-endpoint"
CHAIN_DISPATCH_TO_HOST_ENDPOINT_FORWARD = "cali-to-hep-forward"
CHAIN_DISPATCH_FROM_HOST_ENDPOINT_FORWARD = "cali-from-hep-forward"
CHAIN_DISPATCH_SET_ENDPOINT_MARK = "cali-set-endpoint-mark"
CHAIN_DISPATCH_FROM_ENDPOINT_MARK = "cali-from-endpoint-mark"
CHAIN_FORWARD_CHECK = "cali-forward-check"
CHAIN_FORWARD_ENDPOINT_MARK = "cali-forward-endpoint-mark"
CHAIN_SET_WIREGUARD_INCOMING_MARK = "cali-wireguard-incoming-mark"
CHAIN_RPF_SKIP = "cali-rpf-skip"

POLICY_INBOUND_PFX = "cali-pi-"
POLICY_OUTBOUND_PFX = "cali-po-"
PROFILE_INBOUND_PFX = "cali-pri-"
PROFILE_OUTBOUND_PFX = "cali-pro-"
POLICY_GROUP_INBOUND_PFX = "cali-gi-"
POLICY_GROUP_OUTBOUND_PFX = "cali-go-"

WORKLOAD_TO_ENDPOINT_PFX = "cali-tw-"
WORKLOAD_FROM_ENDPOINT_PFX = "cali-fw-"
SET_ENDPOINT_MARK_PFX = "cali-sm-"
HOST_TO_ENDPOINT_PFX = "cali-th-"
HOST_FROM_ENDPOINT_PFX = "cali-fh-"
HOST_TO_ENDPOINT_FORWARD_PFX = "cali-thfw-"
HOST_FROM_ENDPOINT_FORWARD_PFX = "cali-fhfw-"

# The pseudo-interface standing for a "*" (all-interfaces) host endpoint.  Longer than
# IFNAMSIZ on purpose, so it can never collide with a real interface.
ALL_INTERFACES = "any-interface-at-all"

_SHORTENED_PREFIX = "_"


def length_limited_id(fixed_prefix: str, suffix: str, max_length: int) -> str:
    """libcalico-go ``GetLengthLimitedID``: prefix+suffix, or prefix+"_"+hash when too long."""
    if not suffix:
        suffix = _SHORTENED_PREFIX
    # Go measures bytes; identical for the ASCII names Kubernetes allows.
    total = len(fixed_prefix.encode()) + len(suffix.encode())
    if total > max_length or (total == max_length and suffix.startswith(_SHORTENED_PREFIX)):
        digest = hashlib.sha256(suffix.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).decode().rstrip("=")
        chars_left = max_length - 1 - len(fixed_prefix.encode())
        if chars_left <= 0:
            raise ValueError(f"max length {max_length} too small for prefix {fixed_prefix!r}")
        return fixed_prefix + _SHORTENED_PREFIX + encoded[:chars_left]
    return fixed_prefix + suffix


def endpoint_chain_name(prefix: str, iface: str, max_length: int) -> str:
    # Interned (as the policy and profile chain names): one string per name however many
    # chains, dispatch rules and IP families hold it.
    return sys.intern(length_limited_id(prefix, iface, max_length))


# ------------------------------------------------------------------------------ identities
KIND_SHORT_NAMES = {
    "NetworkPolicy": "np",
    "GlobalNetworkPolicy": "gnp",
    "StagedNetworkPolicy": "snp",
    "StagedGlobalNetworkPolicy": "sgnp",
    "StagedKubernetesNetworkPolicy": "sknp",
    "KubernetesNetworkPolicy": "knp",
    "KubernetesClusterNetworkPolicy": "kcnp",
}
STAGED_KINDS = frozenset({"StagedNetworkPolicy", "StagedGlobalNetworkPolicy", "StagedKubernetesNetworkPolicy"})


def kind_is_staged(kind: str) -> bool:
    return kind in STAGED_KINDS


_POLICY_IDS_MAX = 65536
_POLICY_IDS: dict[tuple[str, str, str], PolicyID] = {}  # (name, namespace, kind) → the shared PolicyID


@dataclass(frozen=True, slots=True, order=True)
class PolicyID:
    """Felix's ``types.PolicyID``: hashable, unlike the proto message."""

    name: str
    namespace: str = ""
    kind: str = ""

    @classmethod
    def from_proto(cls, p: pb.PolicyID) -> PolicyID:
        """The id of *p*, one shared object per distinct id (a policy update reaches ~6 managers, each
        asking: building and interning the frozen value every time was ~5 % of a flood's runner thread)."""
        key = (p.name, p.namespace, p.kind)
        found = _POLICY_IDS.get(key) if cls is PolicyID else None
        if found is None:
            intern = sys.intern  # each proto access is a new string; kinds and namespaces repeat
            found = cls(name=intern(key[0]), namespace=intern(key[1]), kind=intern(key[2]))
            if cls is PolicyID:
                if len(_POLICY_IDS) >= _POLICY_IDS_MAX:
                    _POLICY_IDS.clear()  # bounded: ids of policies long gone do not accumulate
                _POLICY_IDS[key] = found
        return found

    @property
    def kind_short_name(self) -> str:
        """``np``, ``gnp``…; an unknown kind is used as-is (Felix warns and does the same)."""
        return KIND_SHORT_NAMES.get(self.kind, self.kind)

    @property
    def staged(self) -> bool:
        return kind_is_staged(self.kind)

    def id(self) -> str:
        """``<kind>/<ns>/<name>`` or ``<kind>/<name>``: the chain-name suffix and NFLOG id."""
        if self.namespace:
            return f"{self.kind_short_name}/{self.namespace}/{self.name}"
        return f"{self.kind_short_name}/{self.name}"

    def go_string(self) -> str:
        """Felix's ``PolicyID.String()``, hashed into policy-group chain names."""
        return f"{{Name: {self.name}, Namespace: {self.namespace}, Kind: {self.kind}}}"

    def describe(self) -> str:
        """``<Kind> [<ns>/]<name>``: the first-rule comment stem and log identity."""
        if self.namespace:
            return f"{self.kind} {self.namespace}/{self.name}"
        return f"{self.kind} {self.name}"


@dataclass(frozen=True, slots=True, order=True)
class ProfileID:
    name: str

    @classmethod
    def from_proto(cls, p: pb.ProfileID) -> ProfileID:
        return cls(name=p.name)

    def id(self) -> str:
        return self.name

    def describe(self) -> str:
        return f"Profile {self.name}"


def policy_chain_name(prefix: str, policy: PolicyID, max_length: int) -> str:
    return sys.intern(length_limited_id(prefix, policy.id(), max_length))


def profile_chain_name(prefix: str, profile: ProfileID | str, max_length: int) -> str:
    name = profile if isinstance(profile, str) else profile.name
    return sys.intern(length_limited_id(prefix, name, max_length))
