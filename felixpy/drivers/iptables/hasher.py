"""The ``cali:`` hashes of one iptables table's chains, and the renderings they were computed from.

:class:`ChainHasher` belongs to one :class:`~felixpy.drivers.iptables.table.IptablesTable`: the table
decides what is desired, which chains are dirty and when to hash; the hasher holds what hashing produced
and runs the hashing that may be done ahead of the apply.  A chain's hashes are Felix's
(:func:`felixpy.drivers.iptables.render.rule_hashes_from_bodies`, docs/iptables.md): they name each rule,
its position and its predecessors, so comparing them with a read-back tells a right chain from one to
rewrite.

What it holds
    * The hash cache: each chain's hashes, as rendered with the features the cache was filled under.
      A chain's update or removal forgets its entry (:meth:`ChainHasher.forget`); other features forget
      every entry (:meth:`ChainHasher.take_features`).
    * The bodies rendered along with a cache entry, held until the apply that writes them, so a rule is
      rendered once for both its hash and its restore line; the apply lets go of them before its restore
      runs (:meth:`ChainHasher.drop_bodies`).
    * For as long, the same bodies by the rule tuple they render: endpoints with the same policies share
      one rule tuple (``rules/endpoints.py``), so their chains render it once; each chain still hashes
      from its own name.

Hashing ahead
    :meth:`ChainHasher.hash_ahead` renders and hashes the dirty chains on a thread of its own while the
    loop waits for the IP-set write (the loop's ``HashesAhead`` step).  The table calls
    :meth:`ChainHasher.finish` before it touches its desired state or these caches, so that thread never
    runs beside anything else of the table's and no hash of a replaced chain survives.

It owns no kernel object and runs no command.  Thread safety: one thread at a time, the table's or (while
the table waits for it) the hashing thread.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from felixpy.drivers.generictables.model import Chain, Rule
from felixpy.drivers.iptables import render
from felixpy.drivers.iptables.detect import Features
from felixpy.drivers.readahead import ReadAhead

# The table's view of a chain by name: as it should be programmed, or None if it should not exist.
DesiredChain = Callable[[str], Chain | None]


class ChainHasher:
    """One table's hash cache, the bodies rendered with it and its hashing ahead (see the module docstring).
    *log* is the table's bound logger, for a hashing ahead that fails."""

    def __init__(self, log: Any) -> None:
        self._cache: dict[str, list[str]] = {}
        # Bodies rendered along with a _cache entry, kept until the apply that
        # writes them (each rule is rendered once per change); dropped after each apply.
        self._fresh_bodies: dict[str, list[str]] = {}
        # The same bodies by the rules they render, for as long as _fresh_bodies holds them: endpoints with
        # the same policies share one rule tuple (rules/endpoints.py), so their chains render once.  Keyed
        # by the tuple's identity, with the tuple itself held (an id is never reused while it is).
        self._bodies_by_rules: dict[int, tuple[tuple[Rule, ...], list[str]]] = {}
        self._features: Features | None = None  # what the cache was rendered with; None before any hash
        # hash_ahead's: always on a thread of its own (not the table's start_background, whose jobs a
        # caller may hold back: everything of the table's waits for this one).
        self._hashing: ReadAhead[None] = ReadAhead("rule hashing", log, thread_name="hash-ahead")

    def cached(self, name: str) -> list[str] | None:
        """The chain's hashes if they are cached: a read-back equal to them keeps this list, not its own
        copy (reader.py)."""
        return self._cache.get(name)

    def forget(self, name: str) -> None:
        """The chain was updated or removed: what was hashed and rendered for it no longer holds."""
        self._cache.pop(name, None)
        self._fresh_bodies.pop(name, None)

    def take_features(self, features: Features) -> bool:
        """Hash with *features* from now on.  Hashes depend on the rendering, which depends on features,
        so other features than the cache's empty it.  True when they replace features hashed with before
        (not at the first hash): whatever renders differently now is to be rewritten."""
        if features == self._features:
            return False
        self._cache.clear()
        self._fresh_bodies.clear()
        self._bodies_by_rules.clear()
        replaced = self._features is not None
        self._features = features
        return replaced

    def chain_hashes(self, chain: Chain, features: Features,
                     keep_bodies: bool = True) -> tuple[list[str], list[str] | None]:
        """The chain's hashes (cached) and, if still held, its rendered bodies.

        Bodies are held from the hashing until the end of the next apply, so a
        rule is rendered once for both its hash and its restore line; chains with
        the very same rule tuple share one list of bodies (read only, never mutated).
        The hashes are each chain's own (they chain from its name).
        """
        name = chain.name
        cached = self._cache.get(name)
        if cached is not None:
            return cached, self._fresh_bodies.get(name)
        rules = chain.rules
        shared = self._bodies_by_rules.get(id(rules))
        if shared is not None and shared[0] is rules:
            bodies = shared[1]
        else:
            rb = render.render_body
            bodies = [rb(r, features) for r in rules]
            if keep_bodies:
                self._bodies_by_rules[id(rules)] = (rules, bodies)
        hashes = render.rule_hashes_from_bodies(name, bodies)
        self._cache[name] = hashes
        if keep_bodies:
            self._fresh_bodies[name] = bodies
        return hashes, bodies

    def drop_bodies(self) -> None:
        """The apply's hold on the rendered bodies ends (a retry renders again): a restore's input keeps only
        those of the chains it formats as it is written."""
        self._fresh_bodies = {}
        self._bodies_by_rules = {}

    def prehash(self, dirty: Iterable[str], desired: DesiredChain, features: Features) -> None:
        """Hash (and render) the *dirty* chains the coming apply will compare.

        Runs while ``*-save`` does (its ``while_running`` hook) or ahead of the
        apply (:meth:`hash_ahead`): the work is the same the apply would do right
        after, independent of what the save says, and overlapping it with the
        save's own run takes it off a restart's and a cold start's critical path.
        A rule that fails to render is left for the apply, which raises just as it
        would have without this step.
        """
        cache = self._cache
        try:
            for name in sorted(dirty):  # the order apply writes them in
                if name not in cache:
                    chain = desired(name)
                    if chain is not None:
                        self.chain_hashes(chain, features)
        except Exception:  # deferred: the apply re-renders that chain and raises there
            pass

    def hash_ahead(self, dirty: Collection[str], desired: DesiredChain,
                   features: Callable[[], Features]) -> None:
        """Run :meth:`prehash` of the *dirty* chains on the hashing thread, if one of them is not cached,
        with the *features* asked for on that thread; first waits for the previous one (:meth:`finish`).
        *dirty* is the table's own set, read when the thread runs (after *features*, which may add to it):
        nothing else of the table's touches it until the table has waited for that thread."""
        self.finish()
        if any(name not in self._cache for name in dirty):
            self._hashing.start(lambda: self.prehash(dirty, desired, features()))

    def finish(self) -> None:
        """Wait for the hashing ahead, if one was started."""
        if self._hashing.started:
            self._hashing.take()  # a failure is logged; the apply hashes what is left, as without it
