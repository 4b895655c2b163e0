"""A foreign hand on a running node: what it changes (drift) and what it adds that is not ours (foreign).

Per family, in the node's namespace, with the mode's own tools (``ip[6]tables-<backend>-restore --noflush
--wait``, ``ipset``, ``nft``, ``ip route``):

* **chain** — one of our policy chains deleted (the rules jumping to it first, as the kernel requires);
* **rule** — one rule of another of our policy chains replaced by a different one;
* **set member** — one member removed from one of our IP sets;
* **route** — our VXLAN route to the remote block deleted;
* **fdb**, **neighbour** — the remote VTEP's FDB entry and ARP/NDP entry deleted from our VXLAN device;
* **device** — (a second round) our ``vxlan.calico`` deleted: it, its FDB/ARP entries and the route via it
  come back;
* **insert above our jump** — iptables modes: a foreign rule inserted at the top of ``FORWARD``, above our
  jump (ours must go back on top, the foreign rule must stay); nftables mode: a foreign rule inserted at
  the top of our ``calico`` table's ``filter-FORWARD`` (the table is ours: it must go).

Foreign objects that must stay untouched (and are not drift): a foreign chain with a rule (iptables modes),
a foreign ``inet`` table with a forward hook (nftables mode), a foreign route per family via ``eth0``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from felixpy.testing import netns as nsmod

FOREIGN_SRC = {4: "192.0.2.1/32", 6: "2001:db8::1/128"}
FOREIGN_ROUTE = {4: "203.0.113.0/24", 6: "2001:db8:1::/64"}
ALTERED_SRC = {4: "192.0.2.77/32", 6: "2001:db8::77/128"}


@dataclass
class Hand:
    """The foreign hand for one node namespace and mode."""

    netns: str
    mode: str
    done: list[str] = field(default_factory=list)  # what it did, for failure messages

    def _run(self, *argv: str, stdin: str | None = None) -> str:
        res = nsmod.run_in(self.netns, *argv, input=stdin, check=False)
        if res.returncode != 0:
            raise AssertionError(f"foreign hand: {' '.join(argv)} failed: {res.stderr.strip()}\n{stdin or ''}")
        return str(res.stdout)

    @property
    def nft(self) -> bool:
        return self.mode == "nftables"

    # ------------------------------------------------------------------------- iptables modes
    def _ipt(self, v: int, tool: str) -> str:
        backend = self.mode.split("-")[1]
        return f"ip{'6' if v == 6 else ''}tables-{backend}-{tool}" if tool in ("save", "restore") else \
            f"ip{'6' if v == 6 else ''}tables-{backend}"

    def _restore(self, v: int, *lines: str) -> None:
        self._run(self._ipt(v, "restore"), "--noflush", "--wait", stdin="*filter\n" + "\n".join(lines) + "\nCOMMIT\n")

    def _save(self, v: int) -> list[str]:
        return self._run(self._ipt(v, "save"), "-t", "filter").splitlines()

    # ---------------------------------------------------------------------------- nftables
    def _nft_objs(self, v: int) -> list[dict[str, Any]]:
        fam = "ip" if v == 4 else "ip6"
        objs: list[dict[str, Any]] = json.loads(self._run("nft", "-j", "list", "table", fam, "calico"))["nftables"]
        return objs

    @staticmethod
    def _fam(v: int) -> str:
        return "ip" if v == 4 else "ip6"

    # ------------------------------------------------------------------------------- foreign
    def add_foreign(self, v: int) -> None:
        """Foreign objects that are not ours and must survive everything the daemon does."""
        src = FOREIGN_SRC[v].replace("1/", "2/")
        if self.nft:
            t = "fpyforeign"
            if v == 4:
                self._run("nft", "add", "table", "inet", t)
                self._run("nft", "add chain inet fpyforeign foreignfwd "
                                 "{ type filter hook forward priority 10 ; policy accept ; }")
            self._run("nft", "add", "rule", "inet", t, "foreignfwd", "ip" if v == 4 else "ip6", "saddr", src, "accept")
        else:
            # (Not appended to FORWARD: below our always-appended rules it would make the daemon move them
            # back to the end — a repair, rightly counted as drift.)
            self._restore(v, ":FPY-FOREIGN - [0:0]", f"-A FPY-FOREIGN -s {src} -j ACCEPT")
        self._run("ip", f"-{v}", "route", "add", FOREIGN_ROUTE[v], "dev", "eth0", "proto", "static")
        self.done.append(f"v{v}: foreign objects added")

    # --------------------------------------------------------------------------------- drift
    def delete_policy_chain(self, v: int) -> str:
        if self.nft:
            objs = self._nft_objs(v)
            chains = [o["chain"]["name"] for o in objs
                      if "chain" in o and o["chain"]["name"].startswith("filter-cali-pi-")]
            name = chains[0]
            refs = [o["rule"] for o in objs if "rule" in o and f'"target": "{name}"' in json.dumps(o["rule"])]
            for r in refs:
                self._run("nft", "delete", "rule", self._fam(v), "calico", r["chain"], "handle", str(r["handle"]))
            self._run("nft", "delete", "chain", self._fam(v), "calico", name)
        else:
            save = self._save(v)
            name = next(ln.split()[0][1:] for ln in save if ln.startswith(":cali-pi-"))
            refs = [ln for ln in save if ln.startswith("-A ") and re.search(rf" -[jg] {re.escape(name)}( |$)", ln)]
            assert refs, f"nothing jumps to {name}"
            self._restore(v, *(f"-D {ln[3:]}" for ln in refs), f"-F {name}")
            self._restore(v, f"-X {name}")  # iptables-nft: a chain is unreferenced only at a transaction's start
        self.done.append(f"v{v}: deleted chain {name} and the rule(s) jumping to it")
        return name

    def alter_policy_rule(self, v: int, not_chain: str) -> str:
        src = ALTERED_SRC[v]
        if self.nft:
            objs = self._nft_objs(v)
            rule = next(o["rule"] for o in objs if "rule" in o and o["rule"]["chain"].startswith("filter-cali-pi-")
                        and o["rule"]["chain"] != not_chain)
            self._run("nft", "replace", "rule", self._fam(v), "calico", rule["chain"], "handle", str(rule["handle"]),
                      "ip" if v == 4 else "ip6", "saddr", src, "return")
            chain = rule["chain"]
        else:
            save = self._save(v)
            chain = next(ln.split()[1] for ln in save if ln.startswith("-A cali-pi-") and ln.split()[1] != not_chain)
            self._restore(v, f"-R {chain} 1 -s {src} -j RETURN")
        self.done.append(f"v{v}: replaced rule 1 of {chain}")
        return chain

    def remove_set_member(self, v: int) -> tuple[str, str]:
        if self.nft:
            objs = self._nft_objs(v)
            s = next(o["set"] for o in objs if "set" in o and o["set"]["name"].startswith(f"cali{v}0s")
                     and o["set"].get("elem"))
            elem = s["elem"][0]
            member = elem if isinstance(elem, str) else f"{elem['prefix']['addr']}/{elem['prefix']['len']}"
            self._run("nft", "delete", "element", self._fam(v), "calico", s["name"], "{", member, "}")
            name = s["name"]
        else:
            names = [n for n in self._run("ipset", "list", "-name").split() if n.startswith(f"cali{v}0s")]
            name = member = ""
            for n in names:
                members = self._run("ipset", "list", n).split("Members:\n", 1)[1].split()
                if members:
                    name, member = n, members[0]
                    break
            assert name, "no IP set with members"
            self._run("ipset", "del", name, member)
        self.done.append(f"v{v}: removed {member} from {name}")
        return name, member

    def delete_route(self, v: int, dst: str) -> None:
        self._run("ip", f"-{v}", "route", "del", dst)
        self.done.append(f"v{v}: deleted route {dst}")

    def delete_fdb(self, v: int, vtep: dict[str, str]) -> None:
        dev = "vxlan.calico" if v == 4 else "vxlan-v6.calico"
        mac, dst = (vtep["mac"], vtep["parent_device_ip"]) if v == 4 else (vtep["mac_v6"], vtep["parent_device_ipv6"])
        self._run("bridge", "fdb", "del", mac, "dev", dev, "dst", dst)
        self.done.append(f"v{v}: deleted the FDB entry {mac} → {dst} on {dev}")

    def delete_neighbour(self, v: int, vtep: dict[str, str]) -> None:
        dev = "vxlan.calico" if v == 4 else "vxlan-v6.calico"
        tunnel = vtep["ipv4_addr"] if v == 4 else vtep["ipv6_addr"]
        self._run("ip", f"-{v}", "neigh", "del", tunnel, "dev", dev)
        self.done.append(f"v{v}: deleted the neighbour {tunnel} on {dev}")

    def delete_device(self, name: str) -> None:
        self._run("ip", "link", "del", name)
        self.done.append(f"deleted device {name}")

    def insert_above_our_jump(self, v: int) -> None:
        src = FOREIGN_SRC[v]
        if self.nft:
            self._run("nft", "insert", "rule", self._fam(v), "calico", "filter-FORWARD", "ip" if v == 4 else "ip6",
                      "saddr", src, "accept")
        else:
            self._run(self._ipt(v, ""), "-w", "-I", "FORWARD", "1", "-s", src, "-j", "ACCEPT")
        self.done.append(f"v{v}: inserted a foreign rule at the top of FORWARD")


def without_foreign_insert(dump: dict[str, list[str]]) -> dict[str, list[str]]:
    """The dump without the foreign rule :meth:`Hand.insert_above_our_jump` adds (iptables modes: it stays)."""
    pats = [s.split("/")[0] for s in FOREIGN_SRC.values()]
    return {k: [ln for ln in v if not any(f"-s {p}/" in ln and ln.startswith("-A FORWARD") for p in pats)]
            for k, v in dump.items()}
