"""A stateful fake of the :class:`~felixpy.drivers.generictables.table.Table` protocol for manager tests.

:class:`FakeTable` keeps two views, as the real tables do:

* the **desired** view, recorded by the update methods (``update_chain(s)``,
  ``remove_chain(s)``/``remove_chain_by_name``, ``insert_or_append_rules``,
  ``append_rules`` and, for nftables-style tables, the verdict maps of
  :class:`~felixpy.drivers.generictables.table.MapsDataplane`);
* the **programmed** view — what "the kernel" holds — which only
  :meth:`FakeTable.apply` changes, in one atomic step.

The reference rule is the real tables' one, computed here independently by
graph search rather than by refcounting (so it can serve as an oracle): a
chain is programmed only while it is reachable from a rule in a kernel chain
(``INPUT``, ``FORWARD``… inserted or appended) or from a verdict-map element,
through jumps and gotos of programmed chains.  A chain that is recorded but
unreferenced is remembered and programmed once something refers to it.

``apply()`` fails — raising :class:`DanglingReferenceError`, leaving the
programmed view untouched, as ``iptables-restore`` rejects the whole
transaction — when a reachable rule jumps to a chain nobody defined, and
raises :class:`InvalidRuleError` for a rule the kernel would refuse: a source or
destination net that is not a CIDR of the table's IP family.  Failure
injection: :attr:`FakeTable.fail_next_applies`, :attr:`FakeTable.fail_all_applies`.

Tests assert the programmed state (:meth:`FakeTable.is_programmed`,
:meth:`FakeTable.programmed_chain`, :meth:`FakeTable.kernel_rules`,
:meth:`FakeTable.referenced_ip_sets`), never the sequence of calls.
:attr:`FakeTable.apply_count` and :attr:`FakeTable.kernel_writes` exist so a
test can show that *nothing* reached the kernel (e.g. during ``on_update``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from felixpy.drivers.generictables.model import Action, Chain, DestNet, Goto, Jump, Rule, SourceNet, rule_targets
from felixpy.drivers.generictables.table import MapMetadata
from felixpy.errors import DataplaneError
from felixpy.rules.static import KERNEL_CHAINS

__all__ = ["DanglingReferenceError", "FakeTable", "FakeTableState", "InvalidRuleError", "rule_targets",
           "fake_tables"]


class DanglingReferenceError(DataplaneError):
    """A programmed rule would jump to a chain that is not defined (the restore would fail)."""


class InvalidRuleError(DataplaneError):
    """A programmed rule the kernel would refuse (the restore would fail)."""


@dataclass
class FakeTableState:
    """One snapshot of what the fake kernel holds for a table."""

    chains: dict[str, Chain] = field(default_factory=dict)
    kernel: dict[str, tuple[Rule, ...]] = field(default_factory=dict)  # kernel chain -> our rules, in order
    maps: dict[str, dict[str, Action]] = field(default_factory=dict)


class FakeTable:
    """See the module docstring.  ``insert_mode`` mirrors ``ChainInsertMode``."""

    def __init__(self, name: str, ip_version: int, *, insert_mode: str = "insert",
                 kernel_chains: Sequence[str] | None = None) -> None:
        if insert_mode not in ("insert", "append"):
            raise ValueError(f"unknown insert mode {insert_mode!r}")
        self.name = name
        self.ip_version = ip_version
        self.insert_mode = insert_mode
        self.kernel_chain_names: tuple[str, ...] = tuple(
            KERNEL_CHAINS.get(name, ()) if kernel_chains is None else kernel_chains)
        # Desired state.
        self._chains: dict[str, Chain] = {}
        self._inserts: dict[str, tuple[Rule, ...]] = {}
        self._appends: dict[str, tuple[Rule, ...]] = {}
        self._maps: dict[str, dict[str, Action]] = {}
        # Programmed ("kernel") state.
        self.state = FakeTableState()
        # Observability and failure injection.
        self.apply_count = 0
        self.kernel_writes = 0
        self.last_changed: set[str] = set()
        self.invalidations: list[str] = []
        self.fail_next_applies = 0
        self.fail_all_applies = False

    # ------------------------------------------------------------------ Table protocol
    def insert_or_append_rules(self, chain_name: str, rules: Sequence[Rule]) -> None:
        self._check_kernel_chain(chain_name)
        self._inserts[chain_name] = tuple(rules)

    def append_rules(self, chain_name: str, rules: Sequence[Rule]) -> None:
        self._check_kernel_chain(chain_name)
        self._appends[chain_name] = tuple(rules)

    def update_chain(self, chain: Chain) -> None:
        if chain.name in self.kernel_chain_names:
            raise ValueError(f"{chain.name} is a kernel chain: use insert_or_append_rules/append_rules")
        self._chains[chain.name] = chain

    def update_chains(self, chains: Iterable[Chain]) -> None:
        for c in chains:
            self.update_chain(c)

    def remove_chains(self, chains: Iterable[Chain]) -> None:
        for c in chains:
            self.remove_chain_by_name(c.name)

    def remove_chain_by_name(self, name: str) -> None:
        self._chains.pop(name, None)  # removing what is absent is not an error

    def invalidate_dataplane_cache(self, reason: str) -> None:
        self.invalidations.append(reason)

    def apply(self) -> float | None:
        self.apply_count += 1
        if self.fail_all_applies or self.fail_next_applies > 0:
            if self.fail_next_applies > 0:
                self.fail_next_applies -= 1
            raise DataplaneError(f"fake table {self.name}/v{self.ip_version}: injected apply failure")
        dangling = self.dangling_references()
        if dangling:
            raise DanglingReferenceError(
                f"fake table {self.name}/v{self.ip_version}: rules jump to undefined chains: "
                + ", ".join(f"{src}->{dst}" for src, dst in sorted(dangling)))
        self._check_rules()
        new = FakeTableState(
            chains={n: self._chains[n] for n in sorted(self.desired_programmed_names())},
            kernel={c: rules for c in self.kernel_chain_names if (rules := self._kernel_rules_desired(c))},
            maps={m: dict(members) for m, members in self._maps.items()},
        )
        old = self.state
        changed = {n for n in new.chains.keys() | old.chains.keys() if new.chains.get(n) != old.chains.get(n)}
        changed |= {c for c in new.kernel.keys() | old.kernel.keys() if new.kernel.get(c) != old.kernel.get(c)}
        changed |= {m for m in new.maps.keys() | old.maps.keys() if new.maps.get(m) != old.maps.get(m)}
        self.last_changed = changed
        if changed:
            self.kernel_writes += 1
        self.state = new
        return None

    # ---------------------------------------------------------------- MapsDataplane
    def add_or_replace_map(self, meta: MapMetadata, members: Mapping[str, Action]) -> None:
        self._maps[meta.name] = dict(members)

    def remove_map(self, name: str) -> None:
        self._maps.pop(name, None)

    # ------------------------------------------------------------------ desired view
    def _check_rules(self) -> None:
        chains = [(n, self._chains[n].rules) for n in self.desired_programmed_names()]
        chains += [(c, self._kernel_rules_desired(c)) for c in self.kernel_chain_names]
        for name, rules in chains:
            for i, r in enumerate(rules):
                for c in r.match.criteria:
                    if not isinstance(c, (SourceNet, DestNet)):
                        continue
                    try:
                        ok = ipaddress.ip_network(c.net, strict=False).version == self.ip_version
                    except ValueError:
                        ok = False
                    if not ok:
                        raise InvalidRuleError(f"fake table {self.name}/v{self.ip_version}: chain {name} rule {i}: "
                                               f"{c.net!r} is not an IPv{self.ip_version} CIDR")

    def _check_kernel_chain(self, chain_name: str) -> None:
        if chain_name not in self.kernel_chain_names:
            raise ValueError(f"{chain_name} is not a kernel chain of table {self.name}")

    def _kernel_rules_desired(self, chain_name: str) -> tuple[Rule, ...]:
        # Appends always go last; inserts go on top (insert mode) or after foreign rules.
        return self._inserts.get(chain_name, ()) + self._appends.get(chain_name, ())

    def recorded_chain(self, name: str) -> Chain | None:
        """The chain as last recorded (referenced or not), or None."""
        return self._chains.get(name)

    def recorded_names(self) -> set[str]:
        return set(self._chains)

    def _reach(self) -> tuple[set[str], set[tuple[str, str]]]:
        """(reachable chain names, dangling (source, target) pairs) of the desired view."""
        seen: set[str] = set()
        dangling: set[tuple[str, str]] = set()
        sources: list[tuple[str, str]] = []
        for c in self.kernel_chain_names:
            sources.extend((c, t) for t in rule_targets(self._kernel_rules_desired(c)))
        for m, members in self._maps.items():
            sources.extend((f"map:{m}", a.target) for a in members.values() if isinstance(a, (Jump, Goto)))
        while sources:
            src, name = sources.pop()
            if name in seen:
                continue
            chain = self._chains.get(name)
            if chain is None:
                if name not in self.kernel_chain_names:
                    dangling.add((src, name))
                continue
            seen.add(name)
            sources.extend((name, t) for t in rule_targets(chain.rules))
        return seen, dangling

    def desired_programmed_names(self) -> set[str]:
        """Chains the next successful apply() will program."""
        return self._reach()[0]

    def dangling_references(self) -> set[tuple[str, str]]:
        """(source chain, undefined target) pairs reachable from the kernel chains."""
        return self._reach()[1]

    # --------------------------------------------------------------- programmed view
    def is_programmed(self, name: str) -> bool:
        return name in self.state.chains

    def programmed_names(self) -> set[str]:
        return set(self.state.chains)

    def programmed_chain(self, name: str) -> Chain:
        """The programmed chain (KeyError if it is not in the kernel)."""
        return self.state.chains[name]

    def rules(self, name: str) -> tuple[Rule, ...]:
        """Rules of a programmed chain, or our rules in a kernel chain; () if absent."""
        if name in self.kernel_chain_names:
            return self.state.kernel.get(name, ())
        chain = self.state.chains.get(name)
        return chain.rules if chain is not None else ()

    def kernel_rules(self, chain_name: str) -> tuple[Rule, ...]:
        return self.state.kernel.get(chain_name, ())

    def programmed_map(self, name: str) -> dict[str, Action] | None:
        m = self.state.maps.get(name)
        return dict(m) if m is not None else None

    def targets_of(self, name: str) -> list[str]:
        """Jump/goto targets of a programmed (or kernel) chain, in order."""
        return rule_targets(self.rules(name))

    def referenced_ip_sets(self) -> set[str]:
        """Kernel IP-set names referenced by any programmed rule."""
        names: set[str] = set()
        for rules in [*(c.rules for c in self.state.chains.values()), *self.state.kernel.values()]:
            for r in rules:
                names.update(r.match.ip_set_names())
        return names

    def __repr__(self) -> str:
        return (f"FakeTable({self.name!r}, v{self.ip_version}, programmed={len(self.state.chains)}, "
                f"recorded={len(self._chains)})")


def fake_tables(ip_version: int, *, insert_mode: str = "insert",
                names: Sequence[str] = ("raw", "mangle", "filter", "nat")) -> dict[str, FakeTable]:
    """One FakeTable per table name for a family."""
    return {n: FakeTable(n, ip_version, insert_mode=insert_mode) for n in names}
