"""Helpers shared by the nftables tests: a harness, a typical desired state, state readers (shim protocol only)."""

from __future__ import annotations

import os
import threading
from typing import Any

from felixpy.drivers.generictables.model import (
    Accept, Chain, Drop, Goto, Jump, Masquerade, Match, NoTrack, PortRange, Return, Rule, SetMark,
)
from felixpy.drivers.generictables.table import MapMetadata
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.nftables.layer import NftablesLayer
from felixpy.drivers.nftables.members import member_from_element
from felixpy.drivers.nftables.names import LAYERS
from felixpy.drivers.nftables.shim import NftShim
from felixpy.drivers.nftables.table import NftablesTable
from felixpy.testing.clock import FakeClock


def family(v: int) -> str:
    return "ip" if v == 4 else "ip6"


def listing(shim: NftShim, v: int) -> list[dict[str, Any]]:
    objs = shim.list_table(family(v), "calico")
    assert objs is not None, "table calico missing"
    return objs


def chains(shim: NftShim, v: int) -> dict[str, dict[str, Any]]:
    """chain name -> {"base": (type, hook, prio) or None, "rules": [(handle, comment, packets)]}."""
    out: dict[str, dict[str, Any]] = {}
    for o in listing(shim, v):
        if "chain" in o:
            c = o["chain"]
            base = (c["type"], c["hook"], c["prio"]) if "hook" in c else None
            out[c["name"]] = {"base": base, "rules": []}
        elif "rule" in o:
            r = o["rule"]
            packets = next((e["counter"]["packets"] for e in r["expr"] if "counter" in e), None)
            out[r["chain"]]["rules"].append((r["handle"], r.get("comment", ""), packets))
    return out


def handles(shim: NftShim, v: int) -> dict[str, list[int]]:
    return {name: [h for h, _, _ in c["rules"]] for name, c in chains(shim, v).items()}


def sets(shim: NftShim, v: int) -> dict[str, set[str]]:
    out = {}
    for o in listing(shim, v):
        if "set" in o:
            out[o["set"]["name"]] = {member_from_element(e, v) or repr(e) for e in o["set"].get("elem", ())}
    return out


def set_types(shim: NftShim, v: int) -> dict[str, tuple[Any, tuple[str, ...]]]:
    out = {}
    for o in listing(shim, v):
        if "set" in o:
            s = o["set"]
            out[s["name"]] = (s["type"], tuple(s.get("flags", ())))
    return out


def maps(shim: NftShim, v: int) -> dict[str, dict[str, Any]]:
    out = {}
    for o in listing(shim, v):
        if "map" in o:
            out[o["map"]["name"]] = {k: val for k, val in o["map"].get("elem", ())}
    return out


def rule_handle(shim: NftShim, v: int, chain: str, index: int) -> int:
    handle: int = chains(shim, v)[chain]["rules"][index][0]
    return handle


def tbl(v: int) -> dict[str, str]:
    return {"family": family(v), "table": "calico"}


class Harness:
    """A root table and its layers over some shim, on a fake clock (its sleeps advance it and are recorded)."""

    def __init__(self, ip_version: int, shim: NftShim, clock: FakeClock, **kw: Any) -> None:
        self.ip_version = ip_version
        self.shim = shim
        self.clock = clock
        self.root = NftablesTable(ip_version, shim, sleep=clock.sleep, now=clock.monotonic, **kw)
        self.layers = {name: NftablesLayer(name, self.root) for name in LAYERS}

    @property
    def sleeps(self) -> list[float]:
        return self.clock.sleeps

    @property
    def filter(self) -> NftablesLayer:
        return self.layers["filter"]

    @property
    def nat(self) -> NftablesLayer:
        return self.layers["nat"]

    def addr(self, n: int) -> str:
        return f"10.0.0.{n}" if self.ip_version == 4 else f"fd00::{n:x}"

    def net(self, n: int) -> str:
        return f"10.{n}.0.0/16" if self.ip_version == 4 else f"fd{n:02x}::/64"


def program_typical(h: Harness) -> None:
    """A small but representative desired state: hooks, policy chains, sets, a verdict map, NAT, raw."""
    f, nat = h.filter, h.nat
    p = f"cali{h.ip_version}0"
    h.root.add_or_replace_ip_set(IPSetMetadata("s:web", IPSetType.HASH_NET), [h.net(1), h.addr(5)])
    h.root.add_or_replace_ip_set(IPSetMetadata("s:hosts", IPSetType.HASH_IP), [h.addr(1), h.addr(2)])
    h.root.add_or_replace_ip_set(IPSetMetadata("n:ports", IPSetType.HASH_IP_PORT),
                                 [f"{h.addr(3)},tcp:80", f"{h.addr(3)},udp:53"])
    f.insert_or_append_rules("INPUT", [Rule(Match(), Jump("cali-INPUT"))])
    f.insert_or_append_rules("FORWARD", [Rule(Match(), Jump("cali-FORWARD"))])
    f.append_rules("FORWARD", [Rule(Match().mark_single_bit_set(0x10000), Accept())])
    f.update_chain(Chain("cali-INPUT", (
        Rule(Match().source_ip_set(f"{p}s:web").protocol("tcp").dest_ports(80, PortRange(8000, 8080)), Accept()),
        Rule(Match().source_ip_set(f"{p}s:hosts"), Accept(), ("host traffic",)),
        Rule(Match().protocol("tcp").dest_ip_port_set(f"{p}n:ports"), Accept()),
        Rule(Match(), Drop()),
    )))
    f.update_chain(Chain("cali-FORWARD", (
        Rule(Match().in_interface_vmap("cali-from-wl-dispatch"), None),
        Rule(Match().in_interface("cali+"), Drop(), ("Unknown interface",)),
    )))
    f.add_or_replace_map(MapMetadata("cali-from-wl-dispatch"), {"cali1234": Goto("cali-fw-cali1234"),
                                                                 "cali5678": Goto("cali-fw-cali5678")})
    f.update_chain(Chain("cali-fw-cali1234", (Rule(Match(), SetMark(0x10000)), Rule(Match(), Return()))))
    f.update_chain(Chain("cali-fw-cali5678", (Rule(Match().source_ip_set(f"{p}s:web"), Drop()),)))
    f.update_chain(Chain("cali-unused", (Rule(Match(), Accept()),)))    # never referenced
    nat.insert_or_append_rules("POSTROUTING", [Rule(Match(), Jump("cali-nat-outgoing"))])
    nat.update_chain(Chain("cali-nat-outgoing", (Rule(Match().source_ip_set(f"{p}s:web"), Masquerade()),)))
    h.layers["raw"].insert_or_append_rules("PREROUTING", [Rule(Match().in_interface("lo"), NoTrack())])


def inside_netns(name: str) -> bool:
    """Is the calling thread in the throwaway namespace *name*?"""
    st = os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net")
    ns = os.stat(f"/run/netns/{name}")
    return (st.st_dev, st.st_ino) == (ns.st_dev, ns.st_ino)
