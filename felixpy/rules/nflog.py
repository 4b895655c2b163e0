"""NFLOG prefixes for flow logs (Felix's ``felix/rules/nflogprefix.go``).

Format ``<A|D|P><P|R><I|E><rule index>|<id>`` where the id is the policy's
``<kind>/[<ns>/]<name>`` or the profile name.  End-of-tier prefixes are
``DP<I|E>|<tier>`` (drop) / ``PP<I|E>|<tier>`` (pass); the no-profile-matched
prefix is ``DR<I|E>``.  A prefix of 63 characters or more (the kernel keeps 63
plus a NUL) becomes first 10 chars + hash + ``_`` + last 10 chars, 63 in all.
"""

from __future__ import annotations

from felixpy.rules.names import length_limited_id

__all__ = [
    "ACTION_ALLOW",
    "ACTION_DENY",
    "ACTION_PASS",
    "DIR_EGRESS",
    "DIR_INGRESS",
    "NFLOG_INBOUND_GROUP",
    "NFLOG_OUTBOUND_GROUP",
    "OWNER_POLICY",
    "OWNER_PROFILE",
    "end_of_tier_drop_prefix",
    "end_of_tier_pass_prefix",
    "maybe_hash",
    "no_profile_match_prefix",
    "rule_prefix",
]

NFLOG_INBOUND_GROUP = 1
NFLOG_OUTBOUND_GROUP = 2
NFLOG_PREFIX_MAX_LENGTH = 64
_MAX_WO_TERM = NFLOG_PREFIX_MAX_LENGTH - 1
_KEEP_PREFIX = 10
_KEEP_SUFFIX = 10
_HASH_LEN = _MAX_WO_TERM - _KEEP_PREFIX - _KEEP_SUFFIX - 1

ACTION_ALLOW = "A"
ACTION_DENY = "D"
ACTION_PASS = "P"
OWNER_POLICY = "P"
OWNER_PROFILE = "R"
DIR_INGRESS = "I"
DIR_EGRESS = "E"


def maybe_hash(prefix: str) -> str:
    """Shorten a prefix of >= 63 chars (== 63 too, so nobody can spoof a hashed one)."""
    if len(prefix) >= _MAX_WO_TERM:
        return prefix[:_KEEP_PREFIX] + length_limited_id("", prefix, _HASH_LEN) + "_" + prefix[-_KEEP_SUFFIX:]
    return prefix


def rule_prefix(action: str, owner: str, direction: str, index: int, ident: str) -> str:
    return maybe_hash(f"{action}{owner}{direction}{index}|{ident}")


def end_of_tier_drop_prefix(direction: str, tier: str) -> str:
    return maybe_hash(f"{ACTION_DENY}{OWNER_POLICY}{direction}|{tier}")


def end_of_tier_pass_prefix(direction: str, tier: str) -> str:
    return maybe_hash(f"{ACTION_PASS}{OWNER_POLICY}{direction}|{tier}")


def no_profile_match_prefix(direction: str) -> str:
    return f"{ACTION_DENY}{OWNER_PROFILE}{direction}"
