"""The rule texts a table rendered to hash its changed chains, kept for the script that writes them.

A chain's hashes are Felix's hash chain over each rule's nft text (:func:`.render.rule_text`), and the
script that writes the chain is made of the very same texts.  Rendering them once for the hash when the
chain changes and again for the script cost a churn apply at the large node ~1.5 ms of its ~30
(docs/benchmarks.md, twelfth pass), so the table keeps them in between.

Rules of use:

* a text list is only ever handed out for the very rules tuple it was rendered from (an identity check:
  a chain replaced since is rendered afresh);
* at most ``limit`` texts are held in all (a chain that would pass the limit is not kept), so a cold
  start or a rebuild holds no more than before: those render their rules as they write them;
* the table drops everything at each commit, and a chain's entry when the chain is replaced or removed.
"""

from __future__ import annotations

from collections.abc import Sequence

from felixpy.drivers.generictables import model as m


class KeptTexts:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._by_chain: dict[str, tuple[tuple[m.Rule, ...], list[str]]] = {}
        self.count = 0   # texts held

    def keep(self, chain: str, rules: Sequence[m.Rule], texts: list[str]) -> None:
        """*texts* rendered from *rules* for *chain*, replacing what was kept for it, if the limit allows."""
        self.drop(chain)
        if self.count + len(texts) <= self.limit:
            self._by_chain[chain] = (tuple(rules), texts)
            self.count += len(texts)

    def get(self, chain: str, rules: tuple[m.Rule, ...]) -> list[str] | None:
        """The texts kept for *chain* if they were rendered from exactly *rules* (the same tuple)."""
        kept = self._by_chain.get(chain)
        return kept[1] if kept is not None and kept[0] is rules else None

    def drop(self, chain: str) -> None:
        kept = self._by_chain.pop(chain, None)
        if kept is not None:
            self.count -= len(kept[1])

    def clear(self) -> None:
        self._by_chain.clear()
        self.count = 0

    def chains(self) -> set[str]:
        return set(self._by_chain)
