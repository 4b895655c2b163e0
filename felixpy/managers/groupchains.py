"""Policy-group chains shared by every endpoint kind (one owner for ``cali-gi-``/``cali-go-``).

Workload and host endpoints that match the same group jump to the same group
chain, so one refcount per chain name decides when it exists: the first user
pushes it, the last one to go removes it.  The chain is handed to every table
given (raw, mangle, filter): the tables program a chain only while some rule
references it, so a workload's group stays out of raw and mangle while an
untracked or pre-DNAT host endpoint's group reaches them.  In BPF mode wiring
gives it the real raw table and discarded mangle and filter ones: the only groups
used there are those of untracked egress policy.  Only records into the tables
(no kernel I/O).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from felixpy.drivers.generictables.table import Table
from felixpy.rules import PolicyGroup, RuleRenderer, TierPolicyGroups


T = TypeVar("T")


def groups_to_program(tiers: Iterable[TierPolicyGroups]) -> list[PolicyGroup]:
    """The groups of *tiers* that get a chain of their own (the others are inlined)."""
    return [g for t in tiers for g in (*t.ingress, *t.egress) if not g.should_be_inlined()]


class PolicyGroupChains:
    def __init__(self, renderer: RuleRenderer, tables: Sequence[Table]) -> None:
        self._r = renderer
        self._tables = tuple(tables)
        self._refs: dict[str, int] = {}

    def incref(self, groups: Iterable[PolicyGroup]) -> None:
        for g in groups:
            name = g.chain_name()
            n = self._refs.get(name, 0)
            if n == 0:
                chain = self._r.policy_group_chain(g)
                for table in self._tables:
                    table.update_chain(chain)
            self._refs[name] = n + 1

    def render_holding(self, groups: Sequence[PolicyGroup], render: Callable[[], T]) -> T:
        """Hold a reference on *groups* for the chains *render* returns; none is kept if it raises."""
        self.incref(groups)
        try:
            return render()
        except Exception:
            self.decref(groups)
            raise

    def decref(self, groups: Iterable[PolicyGroup]) -> None:
        for g in groups:
            name = g.chain_name()
            n = self._refs.get(name, 0) - 1
            if n <= 0:
                self._refs.pop(name, None)
                for table in self._tables:
                    table.remove_chain_by_name(name)
            else:
                self._refs[name] = n

    def refcount(self, name: str) -> int:
        return self._refs.get(name, 0)
