"""Reading the live kernel: one reader per dataplane mode behind :class:`Reader`, and :func:`read_kernel`.

Each reader runs the mode's own dump tool through the command shim (so a namespace
is just ``SubprocessRunner(netns=…)``) and recognises felixpy's state the way the
drivers do after a restart: ``cali-`` chains in ``ip[6]tables-save``, the ``calico``
table in nftables (whose chains, sets and maps a single answer reads over netlink,
:mod:`.nft_netlink`, when the runner is the real one).  :func:`read_kernel` reads them
side by side and takes the first, in the order nftables, iptables-nft, iptables-legacy, that
holds felixpy's state — or says that none does.  When that state is BPF mode's guards, :class:`BPFReader`
reads the programs' state from the pins (:mod:`.bpf`), and :mod:`.query` evaluates the
packet there, never against the guards alone.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from felixpy.drivers.cmdshim import CommandResult, CommandRunner
from felixpy.explain.host import HostView, host_view

if TYPE_CHECKING:
    from felixpy.explain.bpf_view import BPFView
    from felixpy.explain.nft_netlink import NftNetlink
    from felixpy.explain.ruleset import IPSetContents, Ruleset

# The parsers (and the rule model under them, ~0.1 s of class building) are imported where they are
# first needed, so that ``felixpy explain`` starts the kernel reads first and imports them while
# the dump tools run.
T = TypeVar("T")


def in_background(fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` on its own thread (a dump tool's wall time overlaps the rest)."""
    pool = ThreadPoolExecutor(max_workers=1)
    fut = pool.submit(fn)
    pool.shutdown(wait=False)
    return fut


class Reader(Protocol):
    """One dataplane mode's view of the kernel."""

    mode: str
    prefers_full: bool   # one whole dump costs about what listing a single chain does

    def read(self, runner: CommandRunner, ip_version: int, full: bool = False) -> Ruleset | None:
        """The family's ruleset, or None when this mode holds no felixpy state.

        ``full``: one dump of everything now (many packets against one read); otherwise each
        chain, set and map is listed when the packet first reaches it (one answer on a big node).
        """
        ...


class IptablesReader:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.mode = f"iptables-{backend}"
        # Legacy iptables hands userspace the whole table blob for any listing, even of one chain
        # (measured at 139k rules: -S of one chain 0.34 s, the whole save 0.40 s); iptables-nft
        # fetches just the chain asked for.
        self.prefers_full = backend == "legacy"

    def save_command(self, ip_version: int) -> list[str]:
        return [f"ip{'6' if ip_version == 6 else ''}tables-{self.backend}-save"]

    def _save(self, runner: CommandRunner, ip_version: int) -> str | dict[str, str] | None:
        """The whole save (iptables-nft: one netlink dump), or per table (legacy: each table is
        its own copy out of the kernel, so the tables are read in parallel); None: not felixpy's.

        Nothing is imported before the dumps start: in legacy mode the filter table's save *is*
        the answer's wall time (~0.5–1 s at 139k rules), and an import here would hold the GIL
        (and the import lock) while the other readers and the main thread import theirs."""
        if self.backend != "legacy":
            res = runner.run(self.save_command(ip_version))
            return res.stdout if res.ok and has_felixpy_chains(res.stdout) else None
        names = runner.run(["cat", f"/proc/net/ip{'6' if ip_version == 6 else ''}_tables_names"])
        tables = [t for t in table_names(names.stdout) if t in LEGACY_TABLES] if names.ok else []
        if "filter" not in tables:
            return None
        filt_fut = in_background(functools.partial(runner.run, [*self.save_command(ip_version), "-t", "filter"]))
        futs = {t: in_background(functools.partial(runner.run, [*self.save_command(ip_version), "-t", t]))
                for t in tables if t != "filter"}
        filt = filt_fut.result()
        if not filt.ok or not has_felixpy_chains(filt.stdout):
            return None
        out = {"filter": filt.stdout}
        for t, fut in futs.items():
            res = fut.result()
            if res.ok:
                out[t] = res.stdout
        return out

    def read(self, runner: CommandRunner, ip_version: int, full: bool = False) -> Ruleset | None:
        if full:
            # The IP sets, and (legacy) each table, are independent reads: run them side by side.
            sets_fut: Future[CommandResult] = in_background(lambda: runner.run(["ipset", "save"]))
            saved = self._save(runner, ip_version)
            sets = sets_fut.result()
            if saved is None:
                return None
            return from_iptables_text(saved, sets.stdout if sets.ok else "", ip_version, self.mode)
        from felixpy.explain import ipt_parse
        from felixpy.explain.ipset_parse import IPSetSave

        tool = f"ip{'6' if ip_version == 6 else ''}tables-{self.backend}"

        def list_chain(table: str, chain: str) -> str | None:
            res = runner.run([tool, "--wait", "-t", table, "-S", chain])
            return res.stdout if res.ok else None

        if list_chain("filter", FELIXPY_FILTER_CHAIN) is None:
            return None

        def ipset(name: str) -> IPSetContents | None:
            res = runner.run(["ipset", "save", name])
            return IPSetSave(res.stdout)(name) if res.ok else None

        return ipt_parse.lazy_ruleset(list_chain, ip_version, ipset, self.mode)


class NftablesReader:
    mode = "nftables"
    prefers_full = False

    def read(self, runner: CommandRunner, ip_version: int, full: bool = False) -> Ruleset | None:
        from felixpy.explain import nft_parse

        family = "ip" if ip_version == 4 else "ip6"
        if full:
            res = runner.run(["nft", "-j", "list", "table", family, nft_parse.TABLE])
            return from_nft_text(res.stdout, ip_version) if res.ok else None

        def list_object(kind: str, name: str) -> str | None:
            res = runner.run(["nft", "-j", "list", kind, family, nft_parse.TABLE, name])
            return res.stdout if res.ok else None

        fast = _netlink_reader(runner, ip_version)
        if fast is not None:
            # One filtered netlink dump per chain, set and map (the nft CLI only for what it cannot
            # decode); the probe is whether the table's forward chain exists.
            try:
                if fast.chain("filter-FORWARD") is None:
                    # Closed here, on the thread that opened it: pyroute2's socket owns an asyncio loop,
                    # which, left to the garbage collector at exit, prints a traceback from another thread.
                    fast.close()
                    return None
            except Exception:     # noqa: BLE001 — anything odd about the socket: the CLI alone
                fast.close()
                fast = None
            else:
                return nft_parse.lazy_ruleset(list_object, ip_version, _nft_base_chains(), fast=fast)

        probe = list_object("chain", "filter-FORWARD")
        if probe is None:
            return None
        first = {("chain", "filter-FORWARD"): probe}   # the probe is also the first listing needed

        def listing(kind: str, name: str) -> str | None:
            got = first.pop((kind, name), None)
            return got if got is not None else list_object(kind, name)

        return nft_parse.lazy_ruleset(listing, ip_version, _nft_base_chains())


def _netlink_reader(runner: CommandRunner, ip_version: int) -> NftNetlink | None:
    """A netlink reader in the runner's namespace — only for the real runner (a fake runner's
    kernel is its answers to command lines, not a socket), and only where the socket opens."""
    from felixpy.drivers.cmdshim import SubprocessRunner
    from felixpy.explain.nft_netlink import NftNetlink

    if type(runner) is not SubprocessRunner:
        return None
    try:
        return NftNetlink(runner.netns, ip_version)
    except OSError:
        return None


def from_iptables_text(save: str | dict[str, str], ipset_save: str, ip_version: int, mode: str) -> Ruleset:
    from felixpy.explain import ipt_parse
    from felixpy.explain.ipset_parse import IPSetSave

    return ipt_parse.ruleset_from_save(save, ip_version, IPSetSave(ipset_save), mode)


def from_nft_text(text: str, ip_version: int) -> Ruleset:
    from felixpy.explain import nft_parse

    objs = json.loads(text).get("nftables", [])
    return nft_parse.ruleset_from_json(objs, ip_version)


def has_felixpy_chains(text: str) -> bool:
    """Whether an ``ip[6]tables-save`` dump holds felixpy's chains (``:cali-…`` declarations)."""
    return "\n:cali-" in text


def table_names(proc_text: str) -> list[str]:
    """``/proc/net/ip[6]_tables_names`` → the tables that exist (a legacy table that does not exist
    yet would be *created* by listing it, so only these are read)."""
    return [line.strip() for line in proc_text.splitlines() if line.strip()]


FELIXPY_FILTER_CHAIN = "cali-FORWARD"
# The tables a packet meets (ipt_parse.TABLE_HOOKS); "security" is not felixpy's.
LEGACY_TABLES = ("raw", "mangle", "nat", "filter")   # felixpy's chain hooked into filter FORWARD in every iptables mode


def _nft_base_chains() -> dict[str, list[str]]:
    """Hook → felixpy's base chains in the ``calico`` table (imported here: the nftables driver
    package is heavy to import, and only nftables mode needs it)."""
    from felixpy.drivers.nftables.names import BASE_CHAINS

    out: dict[str, list[str]] = {}
    for name, spec in BASE_CHAINS.items():
        out.setdefault(spec.hook, []).append(name)
    return out

READERS: tuple[Reader, ...] = (NftablesReader(), IptablesReader("nft"), IptablesReader("legacy"))


@dataclass(slots=True)
class KernelState:
    """What one read of the kernel found for one IP family."""

    ip_version: int
    ruleset: Ruleset | None
    host: HostView
    bpf: BPFView | None = None        # BPF mode: the pins (None: not BPF mode, or no pins found)
    bpf_problem: str | None = None    # BPF mode without readable felixpy pins: why


def read_host(runner: CommandRunner, ip_version: int) -> HostView:
    addrs = runner.run(["ip", "-j", "addr"])
    routes = runner.run(["ip", f"-{ip_version}", "-j", "route", "show", "table", "main"])
    return host_view(addrs.stdout if addrs.ok else "[]", routes.stdout if routes.ok else "[]")


PIN_ROOT_ENV = "FELIXPY_BPF_PIN_ROOT"   # = felixpy.drivers.bpfendpoints.kernel.PIN_ROOT_ENV (a test checks)


class BPFReader:
    """BPF mode: the programs' state from the pins under ``pin_root`` (:mod:`.bpf`).  BPF maps are
    not per network namespace; interfaces are, so ifindexes come from the runner's namespace."""

    mode = "bpf"

    def __init__(self, pin_root: str | None = None) -> None:
        import os

        from felixpy.bpf.maps import DEFAULT_PIN_ROOT

        # The daemon's own choice (felixpy.drivers.bpfendpoints.kernel.configured_pin_root), not imported
        # from there: that package pulls in the driver and pyroute2 (~1 s of an answer).
        self.pin_root = pin_root or os.environ.get(PIN_ROOT_ENV, DEFAULT_PIN_ROOT)

    def read(self, runner: CommandRunner) -> BPFView:
        from felixpy.explain.bpf_view import read_pins

        links = runner.run(["ip", "-j", "link"])
        ifindex_of = {str(ln["ifname"]): int(ln["ifindex"]) for ln in json.loads(links.stdout or "[]")} \
            if links.ok else {}

        def route_back(v: int, addr: str) -> tuple[str, str] | None:
            """The host's route to ``addr``: (type, out interface), None when there is none."""
            res = runner.run(["ip", f"-{v}", "-j", "route", "get", addr])
            if not res.ok:
                return None
            try:
                got = json.loads(res.stdout or "[]")[0]
            except (ValueError, IndexError):
                return None
            kind = str(got.get("type", "unicast"))
            return None if kind in ("unreachable", "blackhole", "prohibit") else (kind, str(got.get("dev", "")))

        return read_pins(self.pin_root, ifindex_of, route_back)


def read_kernel(runner: CommandRunner, ip_version: int, readers: Sequence[Reader] = READERS,
                mode: str | None = None, full: bool | None = None,
                bpf_pin_root: str | None = None) -> KernelState:
    """Read the family's felixpy state from the first mode that holds it (or from ``mode``).

    Each mode is probed by its own reader, never with ``nft list tables``: nft 1.0.6 fills its whole
    cache for any listing, every rule of every table (measured: 20.8 s for ``nft list tables`` beside
    felixpy's 129k-rule ``calico`` table, 121 s for an explain that used it beside 139k iptables-nft rules).

    ``full``: True for one dump of everything (many packets against one read), False to list
    chains as the packet reaches them, None for what is cheaper in the mode (:attr:`Reader.prefers_full`).
    When the *tables hold BPF mode's guards, the BPF state is read from the pins under
    ``bpf_pin_root`` (default: the daemon's, ``$FELIXPY_BPF_PIN_ROOT`` or /sys/fs/bpf/tc/globals).
    """
    host_fut = in_background(lambda: read_host(runner, ip_version))   # beside the (slower) rule reads
    # Every candidate mode is read side by side and the first in order that holds felixpy's state wins:
    # a mode without it answers its probe in milliseconds, so in iptables-legacy mode the whole-table
    # saves no longer wait for the nftables probe (pyroute2's import, ~0.2 s) and the iptables-nft one.
    reads = [in_background(functools.partial(r.read, runner, ip_version, r.prefers_full if full is None else full))
             for r in readers if mode is None or r.mode == mode]
    found: Ruleset | None = None
    for fut in reads:
        rs = fut.result()
        if rs is not None:
            found = rs
            break
    host = host_fut.result()
    if found is not None:
        found.local_addrs = host.local_addrs
    state = KernelState(ip_version, found, host)
    if is_bpf_mode(state):
        from felixpy.explain.bpf_view import NotFelixpyPins

        bpf_reader = BPFReader(bpf_pin_root)
        try:
            state.bpf = bpf_reader.read(runner)
        except NotFelixpyPins as exc:
            state.bpf_problem = str(exc)
    return state


# The first rule of filter cali-FORWARD in BPF mode (felixpy.rules.bpfmode.forward_chain).
BPF_MODE_MARKER = "Pre-approved by BPF programs"


def is_bpf_mode(state: KernelState) -> bool:
    rs = state.ruleset
    if rs is None:
        return False
    for key in ("filter/cali-FORWARD", "filter-cali-FORWARD"):
        rules = rs.chains.get(key)
        if rules:
            return BPF_MODE_MARKER in rules[0].comments
    return False
