"""Reading the live kernel: one reader per dataplane mode behind :class:`Reader`, and :func:`read_kernel`.

Each reader runs the mode's own dump tool through the command shim (so a namespace
is just ``SubprocessRunner(netns=…)``) and recognises felixpy's state the way the
drivers do after a restart: ``cali-`` chains in ``ip[6]tables-save``, the ``calico``
table in nftables.  :func:`read_kernel` tries them in turn (nftables, iptables-nft,
iptables-legacy) and says which one holds felixpy's state — or that none does.  A
BPF reader (maps, ifstate, the policy programs' IR) is another :class:`Reader`; BPF
mode is not a daemon mode yet, so there is none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from felixpy.drivers.cmdshim import CommandRunner
from felixpy.explain import ipt_parse, nft_parse
from felixpy.explain.host import HostView, host_view
from felixpy.explain.ipset_parse import IPSetSave
from felixpy.explain.ruleset import IPSetContents, Ruleset


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
        # (measured: -S of one chain 0.78 s, the whole save 1.4 s at 139k rules); iptables-nft
        # fetches just the chain asked for.
        self.prefers_full = backend == "legacy"

    def save_command(self, ip_version: int) -> list[str]:
        return [f"ip{'6' if ip_version == 6 else ''}tables-{self.backend}-save"]

    def read(self, runner: CommandRunner, ip_version: int, full: bool = False) -> Ruleset | None:
        if full:
            res = runner.run(self.save_command(ip_version))
            if not res.ok or not ipt_parse.has_felixpy_chains(res.stdout):
                return None
            sets = runner.run(["ipset", "save"])
            return from_iptables_text(res.stdout, sets.stdout if sets.ok else "", ip_version, self.mode)
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
        family = "ip" if ip_version == 4 else "ip6"
        if full:
            res = runner.run(["nft", "-j", "list", "table", family, nft_parse.TABLE])
            return from_nft_text(res.stdout, ip_version) if res.ok else None

        def list_object(kind: str, name: str) -> str | None:
            res = runner.run(["nft", "-j", "list", kind, family, nft_parse.TABLE, name])
            return res.stdout if res.ok else None

        probe = list_object("chain", "filter-FORWARD")
        if probe is None:
            return None
        first = {("chain", "filter-FORWARD"): probe}   # the probe is also the first listing needed

        def listing(kind: str, name: str) -> str | None:
            got = first.pop((kind, name), None)
            return got if got is not None else list_object(kind, name)

        return nft_parse.lazy_ruleset(listing, ip_version, _nft_base_chains())


def from_iptables_text(save: str, ipset_save: str, ip_version: int, mode: str) -> Ruleset:
    return ipt_parse.ruleset_from_save(save, ip_version, IPSetSave(ipset_save), mode)


def from_nft_text(text: str, ip_version: int) -> Ruleset:
    objs = json.loads(text).get("nftables", [])
    return nft_parse.ruleset_from_json(objs, ip_version)


FELIXPY_FILTER_CHAIN = "cali-FORWARD"   # felixpy's chain hooked into filter FORWARD in every iptables mode


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


def read_host(runner: CommandRunner, ip_version: int) -> HostView:
    addrs = runner.run(["ip", "-j", "addr"])
    routes = runner.run(["ip", f"-{ip_version}", "-j", "route", "show", "table", "main"])
    return host_view(addrs.stdout if addrs.ok else "[]", routes.stdout if routes.ok else "[]")


def read_kernel(runner: CommandRunner, ip_version: int, readers: Sequence[Reader] = READERS,
                mode: str | None = None, full: bool | None = None) -> KernelState:
    """Read the family's felixpy state from the first mode that holds it (or from ``mode``).

    ``full``: True for one dump of everything (many packets against one read), False to list
    chains as the packet reaches them, None for what is cheaper in the mode (:attr:`Reader.prefers_full`).
    """
    host = read_host(runner, ip_version)
    found: Ruleset | None = None
    for reader in readers:
        if mode is not None and reader.mode != mode:
            continue
        rs = reader.read(runner, ip_version, reader.prefers_full if full is None else full)
        if rs is None:
            continue
        found = rs
        break
    if found is not None:
        found.local_addrs = host.local_addrs
    return KernelState(ip_version, found, host)
