"""A table that programs nothing: where BPF mode sends the *tables chains of managers it keeps
for their other work (the endpoint manager's routes, sysctls and status).

What it owns: no kernel object.

How a fresh process recognises them: there is nothing to recognise; the real tables of BPF mode
own (and sweep) every ``cali-`` chain.

Apply contract: every update is dropped; ``apply()`` does nothing and asks for no retry.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from felixpy.drivers.generictables.model import Chain, Rule


class DiscardTable:
    def __init__(self, name: str, ip_version: int) -> None:
        self.name = name
        self.ip_version = ip_version

    def insert_or_append_rules(self, chain_name: str, rules: Sequence[Rule]) -> None:
        pass

    def append_rules(self, chain_name: str, rules: Sequence[Rule]) -> None:
        pass

    def update_chain(self, chain: Chain) -> None:
        pass

    def update_chains(self, chains: Iterable[Chain]) -> None:
        pass

    def remove_chains(self, chains: Iterable[Chain]) -> None:
        pass

    def remove_chain_by_name(self, name: str) -> None:
        pass

    def invalidate_dataplane_cache(self, reason: str) -> None:
        pass

    def apply(self) -> float | None:
        return None
