"""Prometheus metrics of the nftables backend (Felix's ``felix_nft_*`` names).

Registered once per process in the default registry; importing this module
twice (tests, reloads) reuses the collectors already registered instead of
failing with "Duplicated timeseries".
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import REGISTRY, Counter, Gauge

_C = TypeVar("_C", Counter, Gauge)


def _get_or_create(cls: type[_C], name: str, doc: str, labels: tuple[str, ...] = ()) -> _C:
    existing: object = getattr(REGISTRY, "_names_to_collectors", {}).get(name)
    if existing is None and cls is Counter:
        existing = getattr(REGISTRY, "_names_to_collectors", {}).get(name + "_total")
    if existing is not None:
        if not isinstance(existing, cls):
            raise TypeError(f"metric {name} already registered as {type(existing).__name__}")
        return existing
    try:
        return cls(name, doc, labels)
    except ValueError:  # lost a race with another import: fetch the winner
        found = REGISTRY._names_to_collectors.get(name) or REGISTRY._names_to_collectors[name + "_total"]
        if not isinstance(found, cls):
            raise TypeError(f"metric {name} already registered as {type(found).__name__}") from None
        return found


NFT_CALLS = _get_or_create(Counter, "felix_nft_calls", "Number of nft transactions run.")
NFT_ERRORS = _get_or_create(Counter, "felix_nft_errors", "Number of nft transactions that failed.")
NFT_LIST_CALLS = _get_or_create(Counter, "felix_nft_list_calls", "Number of nft list calls.")
NFT_LIST_ERRORS = _get_or_create(Counter, "felix_nft_list_errors", "Number of nft list errors.")
NFT_CHAINS = _get_or_create(Gauge, "felix_nft_chains", "Number of active nft chains.", ("ip_version", "table"))
NFT_RULES = _get_or_create(Gauge, "felix_nft_rules", "Number of active nftables rules.", ("ip_version", "table"))
NFT_LINES = _get_or_create(Counter, "felix_nft_lines_executed", "Number of nftables commands executed.",
                           ("ip_version", "table"))
NFT_SETS = _get_or_create(Gauge, "felix_nft_sets", "Number of active Calico nftables sets.", ("ip_version",))
NFT_SET_CALLS = _get_or_create(Counter, "felix_nft_set_calls", "Number of transactions that updated sets.")
NFT_SET_ERRORS = _get_or_create(Counter, "felix_nft_set_errors", "Number of failed transactions that updated sets.")
NFT_MAPS = _get_or_create(Gauge, "felix_nft_maps", "Number of active Calico nftables maps.", ("ip_version",))
