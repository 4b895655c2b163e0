"""Cleanup-only driver: removes what an earlier run left in an iptables backend we no longer use.

Felix registers "cleanup tables" for the backend it is *not* running (in
nftables mode the iptables tables, in iptables mode the nftables ``calico``
table) so that a restart with a different backend leaves nothing of the old
one behind.  :class:`IptablesBackendCleanup` is that driver for one iptables
backend (``legacy`` or ``nft``) of one IP family; wiring registers one per
backend that is not the active one (in ``iptables-legacy`` mode the nft
backend, in ``iptables-nft`` mode the legacy one, in nftables mode both).

What it owns
    Nothing that should exist: every Calico object in the backend is stale.
    It removes exactly two kinds of object, both provably ours:

    * chains whose name has one of Felix's owned prefixes (``cali-``,
      ``califw-``… :data:`~.savefile.DEFAULT_OWNED_PREFIXES`), flushed and
      deleted;
    * rules in any other chain (the kernel's ``INPUT``/``FORWARD``…, or a
      foreign chain) that carry our ``cali:<hash>`` comment, or that jump to one
      of our chains (Felix's historic unhashed inserts: the jump targets a chain
      we are deleting, so it cannot stay), deleted by value.

    Every other rule and chain is foreign and is never touched; neither are the
    kernel chains' policies.

How a fresh process recognises them
    With no memory at all: one ``ip[6]tables-<backend>-save`` without ``-t``
    (which lists only tables that already exist, so it never instantiates a
    legacy table) is parsed for the two kinds above (:func:`plan_cleanup`).
    The explicit ``-legacy``/``-nft`` binaries are used, never the unsuffixed
    ones (which may be either backend); a missing binary means the backend
    cannot hold anything of ours.

Apply contract
    Runs only after the active backend's tables were written successfully in
    the same apply (the loop's cleanup step, after the tables), so the new
    backend is complete and failing closed before anything of the old one goes.
    Its first read may start when the apply begins (:meth:`prefetch`, on a thread of
    its own: ``drivers/readahead.py``), since nothing the apply writes before this
    step is in this backend; at a large node's restart that read (~30 ms) was on the
    critical path after the tables.
    One ``ip[6]tables-<backend>-restore --noflush --wait`` per apply holds every
    deletion (per table: ``-D`` our rules in foreign chains, ``-F`` then ``-X``
    our chains); then the backend is read again, and the driver is done once a
    read finds nothing of ours.  A failure raises
    :class:`~felixpy.errors.DataplaneError`: the loop keeps the step dirty and
    retries it on the next apply.  It is never fatal: while both backends hold
    rules a packet must pass both, so the stale backend can only drop more, never
    let through what the active one denies.  :meth:`queue_resync` re-arms it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import shutil

import structlog

from felixpy.drivers.cmdshim import CommandRunner
from felixpy.drivers.iptables.savefile import DEFAULT_OWNED_PREFIXES, hash_comment_regex, owned_chain_regex
from felixpy.drivers.readahead import ReadAhead, StartBackground
from felixpy.errors import DataplaneError

log = structlog.get_logger(__name__)

BACKENDS = ("legacy", "nft")
MAX_PASSES = 3


@dataclass
class TablePlan:
    """What to remove from one table."""

    name: str
    rules: list[str] = field(default_factory=list)  # "-D <chain> <spec>" lines
    chains: list[str] = field(default_factory=list)  # owned chains to flush and delete

    def restore_lines(self) -> list[str]:
        return [f"*{self.name}", *self.rules, *(f"-F {c}" for c in self.chains),
                *(f"-X {c}" for c in self.chains), "COMMIT"]


def plan_cleanup(save_text: str, *, owned_prefixes: Sequence[str] = DEFAULT_OWNED_PREFIXES,
                 hash_prefix: str = "cali:") -> list[TablePlan]:
    """Per table in a full ``*-save``, the objects of ours to remove (tables with none are left out)."""
    owned_re = owned_chain_regex(owned_prefixes)
    hash_re = hash_comment_regex(hash_prefix)
    jump_re = re.compile(r"(?:^| )(?:-j|--jump|-g|--goto) (?:" + "|".join(re.escape(p) for p in owned_prefixes)
                         + r")\S*")
    plans: list[TablePlan] = []
    current: TablePlan | None = None
    for line in save_text.splitlines():
        if line.startswith("*"):
            current = TablePlan(line[1:].strip())
        elif line == "COMMIT":
            if current is not None and (current.rules or current.chains):
                plans.append(current)
            current = None
        elif current is None:
            continue
        elif line.startswith(":"):
            chain = line[1:].split(" ", 1)[0]
            if owned_re.match(chain):
                current.chains.append(chain)
        elif line.startswith("-A "):
            chain, _, spec = line[3:].partition(" ")
            if owned_re.match(chain):
                continue  # goes with its chain
            if hash_re.search(spec) or jump_re.search(spec):
                current.rules.append(f"-D {chain} {spec}")
    return plans


class IptablesBackendCleanup:
    """Removes every Calico chain and rule from one iptables backend of one family (see module doc)."""

    def __init__(self, ip_version: int, backend: str, *, runner: CommandRunner,
                 owned_prefixes: Sequence[str] = DEFAULT_OWNED_PREFIXES, hash_prefix: str = "cali:",
                 which: Callable[[str], str | None] | None = None,
                 start_background: StartBackground | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown iptables backend {backend!r}")
        self.ip_version = ip_version
        self.backend = backend
        self.name = f"iptables-{backend}"
        self._runner = runner
        self._owned_prefixes = tuple(owned_prefixes)
        self._hash_prefix = hash_prefix
        six = "6" if ip_version == 6 else ""
        self._save_cmd = f"ip{six}tables-{backend}-save"
        self._restore_cmd = f"ip{six}tables-{backend}-restore"
        self._which = which or getattr(runner, "which", None) or shutil.which
        self.done = False
        self.removed_chains = 0
        self.removed_rules = 0
        self._ahead: ReadAhead[list[TablePlan]] = ReadAhead(f"'{self._save_cmd}'", log.bind(backend=backend),
                                                           start_background, "cleanup-read-ahead")

    def queue_resync(self) -> None:
        self.done = False

    def _installed(self) -> bool:
        return self._which(self._save_cmd) is not None and self._which(self._restore_cmd) is not None

    def prefetch(self) -> None:
        """``PrefetchesReadBack`` (managers/base.py): this apply's first read started now, beside the
        managers' renders and the active backend's writes, which never touch this backend.  Reads only."""
        self._ahead.drop()
        if not self.done and self._installed():
            self._ahead.start(self._read)

    def _read(self) -> list[TablePlan]:
        res = self._runner.run([self._save_cmd])
        if not res.ok:
            raise DataplaneError(f"{self._save_cmd} exited {res.returncode}: {res.stderr.strip()[:300]}")
        return plan_cleanup(res.stdout, owned_prefixes=self._owned_prefixes, hash_prefix=self._hash_prefix)

    def apply(self) -> None:
        if self.done:
            return
        ahead = self._ahead.take()
        if not self._installed():
            log.info("iptables backend not installed; nothing to clean up", backend=self.backend,
                     ip_version=self.ip_version)
            self.done = True
            return
        for _ in range(MAX_PASSES):
            plans = self._read() if ahead is None else ahead
            ahead = None  # a pass after a removal reads afresh
            if not plans:
                self.done = True
                return
            text = "".join(ln + "\n" for p in plans for ln in p.restore_lines())
            chains = sum(len(p.chains) for p in plans)
            rules = sum(len(p.rules) for p in plans)
            log.info("Removing Calico objects left in an iptables backend we no longer use",
                     backend=self.backend, ip_version=self.ip_version, chains=chains, rules=rules,
                     tables=[p.name for p in plans])
            res = self._runner.run([self._restore_cmd, "--noflush", "--wait"], stdin=text)
            if not res.ok:
                raise DataplaneError(f"{self._restore_cmd} exited {res.returncode} removing stale Calico "
                                     f"objects: {res.stderr.strip()[:300]}")
            self.removed_chains += chains
            self.removed_rules += rules
        raise DataplaneError(f"{self._save_cmd} still lists Calico objects after {MAX_PASSES} cleanup passes")
