"""An in-memory ``/proc/sys`` for tests: only paths that "exist" can be written, as in the kernel."""

from __future__ import annotations


class FakeSysctls:
    """In-memory /proc/sys for tests: only paths that 'exist' can be written."""

    def __init__(self) -> None:
        # The global switches every kernel has.
        self.values: dict[str, str] = {"net/ipv4/ip_forward": "0", "net/ipv6/conf/all/forwarding": "0",
                                       "net/ipv4/conf/default/rp_filter": "1"}
        self.writes = 0

    def add_iface(self, name: str, v6: bool = True) -> None:
        for key in ("rp_filter", "route_localnet", "proxy_arp", "forwarding"):
            self.values.setdefault(f"net/ipv4/conf/{name}/{key}", "0")
        self.values.setdefault(f"net/ipv4/neigh/{name}/proxy_delay", "80")
        if v6:
            for key in ("proxy_ndp", "forwarding", "accept_ra"):
                self.values.setdefault(f"net/ipv6/conf/{name}/{key}", "1" if key == "accept_ra" else "0")

    def remove_iface(self, name: str) -> None:
        for k in [k for k in self.values if f"/{name}/" in k]:
            del self.values[k]

    def read(self, path: str) -> str | None:
        return self.values.get(path)

    def write(self, path: str, value: str) -> bool:
        if path not in self.values:
            return False
        if self.values[path] != value:
            self.values[path] = value
            self.writes += 1
        return True
