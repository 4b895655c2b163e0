"""Names in the ``calico`` nftables table: layers, base chains, sets and maps.

Felix keeps one nftables table per IP family (``ip calico`` / ``ip6 calico``)
and namespaces what the iptables world keeps in separate tables by *layer*:
every chain and verdict map is named ``<layer>-<name>`` (``filter-cali-tw-x``,
``nat-cali-POSTROUTING``), and jump/goto targets are rewritten the same way.
The kernel-owned chains of iptables (``INPUT``, ``FORWARD``…) become base
chains ``<layer>-<HOOK>`` that this table owns outright.  IP sets keep their
ipset names with ``:`` made legal (``cali40s:abc`` → ``cali40s-abc``).
"""

from __future__ import annotations

from dataclasses import dataclass

TABLE_NAME = "calico"
HASH_PREFIX = "cali:"
LAYERS = ("filter", "nat", "mangle", "raw")
MAX_COMMENT_LEN = 128
MAX_IPSET_NAME_LEN = 31

# Standard nftables priorities (the numbers nft's names stand for).
PRIO_RAW = -300
PRIO_MANGLE = -150
PRIO_DSTNAT = -100
PRIO_FILTER = 0
PRIO_SRCNAT = 100


@dataclass(frozen=True, slots=True)
class BaseChainSpec:
    """What makes a chain a base chain: type, hook, priority, policy."""

    type: str
    hook: str
    prio: int
    policy: str = "accept"


# Reference §5.  nat OUTPUT/POSTROUTING sit at srcnat+10 (110).
BASE_CHAINS: dict[str, BaseChainSpec] = {
    "filter-INPUT": BaseChainSpec("filter", "input", PRIO_FILTER),
    "filter-FORWARD": BaseChainSpec("filter", "forward", PRIO_FILTER),
    "filter-OUTPUT": BaseChainSpec("filter", "output", PRIO_FILTER),
    "nat-PREROUTING": BaseChainSpec("nat", "prerouting", PRIO_DSTNAT),
    "nat-INPUT": BaseChainSpec("nat", "input", PRIO_DSTNAT),
    "nat-OUTPUT": BaseChainSpec("nat", "output", PRIO_SRCNAT + 10),
    "nat-POSTROUTING": BaseChainSpec("nat", "postrouting", PRIO_SRCNAT + 10),
    "mangle-PREROUTING": BaseChainSpec("filter", "prerouting", PRIO_MANGLE),
    "mangle-INPUT": BaseChainSpec("filter", "input", PRIO_MANGLE),
    "mangle-FORWARD": BaseChainSpec("filter", "forward", PRIO_MANGLE),
    "mangle-OUTPUT": BaseChainSpec("route", "output", PRIO_MANGLE),
    "mangle-POSTROUTING": BaseChainSpec("filter", "postrouting", PRIO_MANGLE),
    "raw-PREROUTING": BaseChainSpec("filter", "prerouting", PRIO_RAW),
    "raw-OUTPUT": BaseChainSpec("filter", "output", PRIO_RAW),
}


def family_for(ip_version: int) -> str:
    if ip_version not in (4, 6):
        raise ValueError(f"bad IP version {ip_version}")
    return "ip" if ip_version == 4 else "ip6"


def namespaced(layer: str, name: str) -> str:
    """``<layer>-<name>``, leaving an already-namespaced name alone."""
    prefix = layer + "-"
    return name if name.startswith(prefix) else prefix + name


def legalise_set_name(name: str) -> str:
    return name.replace(":", "-")


def set_name_for_id(set_id: str, ip_version: int) -> str:
    """The nft set name Felix uses for a Calico set ID (``cali40`` + ID, 31 chars, ``:``→``-``)."""
    return legalise_set_name(f"cali{ip_version}0{set_id}"[:MAX_IPSET_NAME_LEN])


def map_name_for(layer: str, name: str) -> str:
    return namespaced(layer, legalise_set_name(name))


def hash_from_comment(comment: str | None) -> str:
    """The ``cali:`` hash in a listed rule's comment, or ``""`` for a rule that is not ours."""
    if not comment or not comment.startswith(HASH_PREFIX):
        return ""
    return comment.split(";", 1)[0][len(HASH_PREFIX):]
