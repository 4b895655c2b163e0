"""Prometheus metrics of the nftables backend (Felix's ``felix_nft_*`` names).

Registered once per process in the default registry (:func:`felixpy.metrics.get_or_create`);
exposed under these exact names by :func:`felixpy.metrics.exposition`.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from felixpy.metrics import get_or_create

NFT_CALLS = get_or_create(Counter, "felix_nft_calls", "Number of nft transactions run.")
NFT_ERRORS = get_or_create(Counter, "felix_nft_errors", "Number of nft transactions that failed.")
NFT_LIST_CALLS = get_or_create(Counter, "felix_nft_list_calls", "Number of nft list calls.")
NFT_LIST_ERRORS = get_or_create(Counter, "felix_nft_list_errors", "Number of nft list errors.")
NFT_CHAINS = get_or_create(Gauge, "felix_nft_chains", "Number of active nft chains.", ("ip_version", "table"))
NFT_RULES = get_or_create(Gauge, "felix_nft_rules", "Number of active nftables rules.", ("ip_version", "table"))
NFT_LINES = get_or_create(Counter, "felix_nft_lines_executed", "Number of nftables commands executed.",
                          ("ip_version", "table"))
NFT_SETS = get_or_create(Gauge, "felix_nft_sets", "Number of active Calico nftables sets.", ("ip_version",))
NFT_SET_CALLS = get_or_create(Counter, "felix_nft_set_calls", "Number of transactions that updated sets.")
NFT_SET_ERRORS = get_or_create(Counter, "felix_nft_set_errors", "Number of failed transactions that updated sets.")
NFT_MAPS = get_or_create(Gauge, "felix_nft_maps", "Number of active Calico nftables maps.", ("ip_version",))
