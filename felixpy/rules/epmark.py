"""Endpoint marks for kube-proxy IPVS mode (Felix's ``felix/rules/epmark.go``).

Under IPVS, forwarded traffic traverses INPUT and OUTPUT instead of FORWARD;
OUTPUT cannot match the ingress interface, so INPUT stamps a per-endpoint
value into the endpoint-mark block and OUTPUT dispatches on it.

An endpoint's position is FNV-1 (32-bit) of its interface name modulo the
number of values the block encodes, linearly probed past taken positions;
position 0 is never used and the non-Calico mark is reserved up front.  This
is stateful bookkeeping (allocation order matters), owned by the endpoint
manager and passed to the renderer; it does no I/O.
"""

from __future__ import annotations

from felixpy.markbits import MarkBitsManager

__all__ = ["PSEUDO_NON_CALI_ENDPOINT", "EndpointMarkMapper", "fnv1_32"]

PSEUDO_NON_CALI_ENDPOINT = "/cali/Pseudo/NonCali/Endpoint/"


def fnv1_32(data: bytes) -> int:
    """FNV-1 (not 1a), as Go's ``hash/fnv.New32``."""
    h = 0x811C9DC5
    for b in data:
        h = (h * 0x01000193) & 0xFFFFFFFF
        h ^= b
    return h


class EndpointMarkMapper:
    def __init__(self, mask: int, non_cali_mark: int) -> None:
        self._bits = MarkBitsManager(mask, "endpoint-iptable-mark")
        self.mask = mask
        self._max_position = self._bits.current_free_number_of_marks()
        self._ep_to_pos: dict[str, int] = {}
        self._ep_to_mark: dict[str, int] = {}
        self._pos_to_ep: dict[int, str] = {}
        self._mark_to_ep: dict[int, str] = {}
        if not self.set_endpoint_mark(PSEUDO_NON_CALI_ENDPOINT, non_cali_mark):
            raise ValueError(f"cannot reserve non-Calico endpoint mark {non_cali_mark:#x} in {mask:#x}")

    def get_endpoint_mark(self, ep: str) -> int | None:
        """The endpoint's mark, allocating one if needed; None when none is left (or ep is empty)."""
        if not ep:
            return None
        if ep in self._ep_to_mark:
            return self._ep_to_mark[ep]
        total = fnv1_32(ep.encode())
        for i in range(self._max_position):
            prospect = (total + i) % self._max_position
            if prospect == 0 or prospect in self._pos_to_ep:
                continue
            try:
                mark = self._bits.map_number_to_mark(prospect)
            except ValueError:
                return None
            self._set(ep, prospect, mark)
            return mark
        return None

    def release_endpoint_mark(self, ep: str) -> None:
        if ep in self._ep_to_mark:
            mark = self._ep_to_mark.pop(ep)
            pos = self._ep_to_pos.pop(ep)
            self._pos_to_ep.pop(pos, None)
            self._mark_to_ep.pop(mark, None)

    def set_endpoint_mark(self, ep: str, mark: int) -> bool:
        """Record a previously allocated mark; False on a conflicting existing assignment."""
        if ep in self._ep_to_mark:
            return self._ep_to_mark[ep] == mark
        if mark in self._mark_to_ep:
            return self._mark_to_ep[mark] == ep
        try:
            pos = self._bits.map_mark_to_number(mark)
        except ValueError:
            return False
        self._set(ep, pos, mark)
        return True

    def _set(self, ep: str, pos: int, mark: int) -> None:
        self._pos_to_ep[pos] = ep
        self._ep_to_pos[ep] = pos
        self._ep_to_mark[ep] = mark
        self._mark_to_ep[mark] = ep
