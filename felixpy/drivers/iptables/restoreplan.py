"""What one apply writes to an iptables table: the ``*-restore`` input that holds only what differs.

:class:`RestorePlanner` belongs to one :class:`~felixpy.drivers.iptables.table.IptablesTable`.  The table
decides what is desired and what it believes the kernel holds; it runs the restore, retries it and keeps
the books.  The planner turns the dirty chains, their desired state and the dataplane's hashes into the
restore input (a :class:`~felixpy.drivers.iptables.restore_buffer.RestoreBuffer`) and into what the kernel
holds once that input is written (:class:`RestorePlan`).  It runs no command and holds nothing between
applies.

The input, in order (docs/iptables.md, ``apply()`` step 3)
    1. ``:<chain> - -`` for each chain to create, and to flush before it is rewritten whole (nft) or
       deleted (flushing first severs its references);
    2. the rules of the chains kept: a new or flushed chain appended whole, formatted only as the input
       is written; legacy, per position, ``-R`` where a hash differs, ``-D`` to trim and ``-A`` to grow,
       so rules before the first change keep their counters;
    3. our rules in foreign chains (the kernel's own, or any other not ours), where their hashes differ
       from what is expected: all of ours deleted by value (other writers may have moved them), then
       inserted or appended again;
    4. ``--delete-chain`` last; iptables-nft in a second transaction, since it sees a chain as
       unreferenced only at the start of one.

While nothing of ours is hooked into the kernel's chains, iptables-nft may take steps 1 and 2 in
transactions of about *split* lines, cut between chains (``IptablesTable._hooked`` says why); step 3,
which adds the hooks, comes after every chain is complete.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from felixpy.drivers.generictables.model import Chain
from felixpy.drivers.iptables import render
from felixpy.drivers.iptables.detect import Features
from felixpy.drivers.iptables.hasher import ChainHasher
from felixpy.drivers.iptables.restore_buffer import RestoreBuffer
from felixpy.drivers.iptables.savefile import FOREIGN_PLACEHOLDER
from felixpy.errors import DataplaneError

# IptablesTable._expected_insert_append: for a foreign chain and how many foreign rules it holds, (all its
# expected hashes, our inserts' hashes, their bodies, our appends' hashes, their bodies).
ExpectedInsertAppend = Callable[
    [str, int, Features], tuple[list[str], list[str], list[str], list[str], list[str]]]


class _DeleteRenderError(DataplaneError):
    """Our view of a foreign chain no longer matches (a rule to delete by value is unknown)."""


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """One apply's write: the restore input, and what the kernel holds once it has been written."""

    buffer: RestoreBuffer  # empty: nothing differs, no command to run
    written: dict[str, list[str] | None]  # the hashes of each chain written, None for one deleted
    full_rules: dict[str, list[str]]  # our rules' ``-A`` text in each foreign chain (deletes by value)


class RestorePlanner:
    """Works out one table's restore input from the difference (see the module docstring); *hasher* has
    the desired chains' hashes and bodies.  Nothing of the table's is held here, only passed to :meth:`plan`:
    the table holds the planner, and a reference back would make it a cycle only the collector frees."""

    def __init__(self, table: str, *, nft: bool, insert_mode: str, renderer: render.IptablesRenderer,
                 hasher: ChainHasher) -> None:
        self._table = table
        self._nft = nft
        self._insert_mode = insert_mode
        self._rnd = renderer
        self._hasher = hasher

    def plan(self, features: Features, *, wanted: Mapping[str, Chain | None], dirty: set[str],
             dirty_insert_append: Iterable[str], expected_insert_append: ExpectedInsertAppend,
             dp_hashes: dict[str, list[str]], dp_full_rules: Mapping[str, list[str]], split: int) -> RestorePlan:
        """The write that brings the dirty chains to *wanted* (each one's desired chain, None to delete it;
        written in its order) and the foreign chains in *dirty_insert_append* to what
        *expected_insert_append* says they should hold, from what the kernel holds: *dp_hashes*, and
        *dp_full_rules*, the text of our rules in foreign chains.  *split*: the lines per transaction an
        unhooked iptables-nft write may take (0: one transaction).

        What needs no write is settled in place, as the write itself would settle it: a chain that is
        to be deleted and is absent, or (nft) is already right, leaves *dirty*, and an nft chain already
        right takes the desired list in *dp_hashes* (one list for both: a read's copy is as big as the
        chain).  A rule that cannot be rendered raises; so does one of ours to delete by value whose text
        is unknown (a :class:`~felixpy.errors.DataplaneError`: the table re-reads and retries).
        """
        buf = RestoreBuffer()
        buf.start_transaction(self._table)
        written: dict[str, list[str] | None] = {}

        # Pass 1: create/flush chains we are about to (re)write or delete.
        for name, desired in wanted.items():
            present = name in dp_hashes
            if desired is None:
                if not present:
                    dirty.discard(name)  # nothing to delete
                    continue
                buf.write_forward_reference(name)  # flush first, to sever references
            elif self._nft:
                # iptables-nft: rewrite a changed chain whole (Felix works around an
                # iptables-nft-restore rule-index bug this way); skip it if already right.
                hashes, _ = self._hasher.chain_hashes(desired, features)
                if present and hashes == dp_hashes[name]:
                    dp_hashes[name] = hashes  # one list for both (a read's copy is as big as the chain)
                    dirty.discard(name)
                    continue
                buf.write_forward_reference(name)
                buf.split_if_over(split)
            elif not present:
                buf.write_forward_reference(name)

        # Pass 2: rule changes in the chains we keep.
        for name, chain in wanted.items():
            if name not in dirty or chain is None:
                continue
            hashes, bodies = self._hasher.chain_hashes(chain, features)
            prev: list[str] = [] if self._nft else dp_hashes.get(name, [])
            written[name] = hashes
            if prev != hashes:  # else legacy: already right (nft: only an empty chain gets here, nothing to write)
                self._write_rules(buf, name, chain, hashes, bodies, prev, features, split)

        # Pass 3: our inserts/appends in foreign chains.
        full_rules = self._write_foreign(buf, features, dirty_insert_append, expected_insert_append, dp_hashes,
                                         dp_full_rules, written)

        if self._nft:
            # iptables-nft-restore only sees a chain as unreferenced at the start of a
            # transaction: delete chains in a second one.
            buf.end_transaction()
            buf.start_transaction(self._table)
            for name, desired in wanted.items():
                if name in dirty and desired is None:
                    buf.write_forward_reference(name)
        for name, desired in wanted.items():
            if name in dirty and desired is None:
                buf.write_line(f"--delete-chain {name}")
                written[name] = None
        buf.end_transaction()
        return RestorePlan(buf, written, full_rules)

    def _write_rules(self, buf: RestoreBuffer, name: str, chain: Chain, hashes: list[str],
                     bodies: list[str] | None, prev: list[str], features: Features, split: int) -> None:
        """The lines that turn chain *name*, holding rules hashed *prev*, into *chain* hashed *hashes*.
        *bodies*: the rules' renderings if the hasher still holds them (else each is rendered here)."""
        rnd = self._rnd
        np, nc = len(prev), len(hashes)
        if np == 0:
            # A new or flushed chain: every rule is appended, in order.
            if bodies is None:
                bodies = [render.render_body(r, features) for r in chain.rules]
            # Formatted as the input is written (restore_buffer.py): never all of them at once.
            buf.write_lazy(len(hashes), functools.partial(rnd.append_lines, name, hashes, bodies))
            buf.split_if_over(split)
            return
        for i in range(max(np, nc)):
            if i < np and i < nc:
                if prev[i] == hashes[i]:
                    continue
                body = bodies[i] if bodies is not None else render.render_body(chain.rules[i], features)
                buf.write_line(rnd.replace_line(name, i + 1, hashes[i], body))
            elif i < np:
                buf.write_line(f"-D {name} {nc + 1}")  # trim the old tail
            else:
                body = bodies[i] if bodies is not None else render.render_body(chain.rules[i], features)
                buf.write_line(rnd.append_line(name, hashes[i], body))

    def _write_foreign(self, buf: RestoreBuffer, features: Features, dirty_insert_append: Iterable[str],
                       expected_insert_append: ExpectedInsertAppend, dp_hashes: Mapping[str, list[str]],
                       dp_full_rules: Mapping[str, list[str]],
                       written: dict[str, list[str] | None]) -> dict[str, list[str]]:
        """Our rules in the foreign chains of *dirty_insert_append* that differ from what is expected: all
        of ours deleted by value, then inserted/appended again.  Records each such chain's hashes in
        *written*; returns our rules' text in every foreign chain once this is written."""
        rnd = self._rnd
        new_full = dict(dp_full_rules)
        for name in sorted(dirty_insert_append):
            prev = dp_hashes.get(name, [])
            num_foreign = prev.count("")
            exp, ins_h, ins_b, app_h, app_b = expected_insert_append(name, num_foreign, features)
            if exp == prev:
                continue
            # Out of sync: delete all of ours (by value: other writers may have moved things), then re-add.
            full = dp_full_rules.get(name, [])
            for i, h in enumerate(prev):
                if h:
                    if i >= len(full) or not full[i].startswith("-A "):
                        raise _DeleteRenderError(f"rendering delete for unknown rule {i} in {name!r}")
                    buf.write_line("-D " + full[i][3:])
            foreign = [FOREIGN_PLACEHOLDER] * num_foreign
            ours_ins = [rnd.append_line(name, h, b) for h, b in zip(ins_h, ins_b)]
            if ins_h:
                if self._insert_mode == "insert":
                    for i in range(len(ins_h) - 1, -1, -1):  # each insert goes on top: reverse order
                        buf.write_line(rnd.insert_line(name, ins_h[i], ins_b[i]))
                else:
                    for line in ours_ins:
                        buf.write_line(line)
            ours_app = [rnd.append_line(name, h, b) for h, b in zip(app_h, app_b)]
            for line in ours_app:
                buf.write_line(line)
            if self._insert_mode == "insert":
                full_new = ours_ins + foreign + ours_app
            else:
                full_new = foreign + ours_ins + ours_app
            written[name] = exp
            if ins_h or app_h:
                new_full[name] = full_new
            else:
                new_full.pop(name, None)
        return new_full
