"""Mark-bit allocation: the one place that decides which packet-mark bits felixpy uses.

Marks are a scarce resource shared with kube-proxy, other CNIs and the
Enterprise build, so no bit is ever hard-coded: everything is carved out of
``IptablesMarkMask`` / ``NftablesMarkMask`` (``Config.mark_mask``), lowest bit
first, in Felix's order (``felix/dataplane/driver.go``)::

    accept, pass, drop, scratch0, scratch1, [wireguard], endpoint block = every remaining bit

With the default mask ``0xffff0000`` that gives accept ``0x10000``, pass
``0x20000``, drop ``0x40000``, scratch0 ``0x80000``, scratch1 ``0x100000``,
WireGuard ``0x200000`` (only when WireGuard is on for either family) and the
rest as the endpoint-mark block used by the IPVS chains.  The non-Calico
endpoint mark is the lowest bit of that block.

In BPF mode the programs' own marks (``0x1FF00000``) come out of the mask first, as
Felix does: the default then gives accept ``0x10000``, pass ``0x20000``, drop
``0x40000``, scratch0 ``0x80000``, scratch1 ``0x20000000``, WireGuard ``0x40000000``.

:class:`MarkBitsManager` mirrors Felix's ``markbits.MarkBitsManager`` (bit
allocation plus the number↔mark mapping the endpoint-mark mapper uses).
:func:`allocate` is the startup entry point; a mask too small for the bits the
configuration needs raises :class:`~felixpy.errors.ConfigError` (Felix panics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from felixpy.errors import ConfigError

if TYPE_CHECKING:
    from felixpy.config import Config

__all__ = ["BPF_PROGRAM_MARKS", "MarkBits", "MarkBitsManager", "allocate", "bpf_allowed_mask", "from_config"]

#: The mark bits the BPF programs use whatever the configuration (Felix's ``tcdefs.MarksMask``;
#: ``felixpy.bpf.defs`` has the values).  BPF mode allocates around them.
BPF_PROGRAM_MARKS = 0x1FF00000


class MarkBitsManager:
    """Allocates single bits and bit blocks from a 32-bit mask, lowest bit first."""

    def __init__(self, mask: int, name: str = "felix-iptables") -> None:
        if not 0 <= mask <= 0xFFFFFFFF:
            raise ConfigError(f"{name}: mark mask {mask:#x} is not a 32-bit value")
        self.name = name
        self.mask = mask
        self._allocated = 0
        self._free = mask.bit_count()

    def available_bit_count(self) -> int:
        return self._free

    def _nth_bit(self, n: int) -> int:
        found = 0
        for shift in range(32):
            bit = 1 << shift
            if self.mask & bit:
                if found == n:
                    return bit
                found += 1
        return 0

    def next_single_bit(self) -> int:
        """The next free bit, or 0 when the mask is exhausted (as Felix's error return)."""
        bit = self._nth_bit(self._allocated)
        if bit:
            self._allocated += 1
            self._free -= 1
        return bit

    def next_block(self, size: int) -> tuple[int, int]:
        """Up to ``size`` further bits OR-ed together; returns (mark, bits actually allocated)."""
        mark = 0
        for got in range(size):
            bit = self.next_single_bit()
            if not bit:
                return mark, got
            mark |= bit
        return mark, size

    def current_free_number_of_marks(self) -> int:
        """How many distinct values the free bits can encode (including zero)."""
        return 1 << self._free if self._free > 0 else 0

    def map_number_to_mark(self, n: int) -> int:
        """Spread the bits of ``n`` over the mask's bits (lowest first); ValueError if it doesn't fit."""
        number, mark, bit_index = n, 0, 0
        for shift in range(32):
            if number <= 0:
                break
            candidate = 1 << shift
            if self.mask & candidate:
                value = number & (1 << bit_index)
                if value:
                    mark |= candidate
                    number -= value
                bit_index += 1
        if number > 0:
            raise ValueError(f"{self.name}: not enough mark bits in {self.mask:#x} for {n}")
        return mark

    def map_mark_to_number(self, mark: int) -> int:
        if mark & self.mask != mark:
            raise ValueError(f"{self.name}: mark {mark:#x} is outside mask {self.mask:#x}")
        number, bit_index = 0, 0
        for shift in range(32):
            bit = 1 << shift
            if self.mask & bit:
                if mark & bit:
                    number += 1 << bit_index
                bit_index += 1
        return number


@dataclass(frozen=True, slots=True)
class MarkBits:
    """The bits the rules layer may use; every field is a mask within ``mask``."""

    mask: int
    accept: int
    pass_: int
    drop: int
    scratch0: int
    scratch1: int
    wireguard: int = 0
    endpoint: int = 0

    @property
    def non_calico_endpoint(self) -> int:
        """Lowest bit of the endpoint block (reserved for non-Calico endpoints, IPVS only)."""
        return self.endpoint & -self.endpoint

    @property
    def all_calico(self) -> int:
        """The bits Calico's chains clear on entry (accept|pass|scratch0|scratch1; not drop)."""
        return self.accept | self.pass_ | self.scratch0 | self.scratch1


def allocate(mask: int, *, wireguard: bool = False, need_endpoint_bits: bool = False) -> MarkBits:
    """Carve Felix's mark bits out of ``mask``; ConfigError when it is too small."""
    mgr = MarkBitsManager(mask)
    accept = mgr.next_single_bit()
    pass_ = mgr.next_single_bit()
    drop = mgr.next_single_bit()
    scratch0 = mgr.next_single_bit()
    scratch1 = mgr.next_single_bit()
    required = {"accept": accept, "pass": pass_, "drop": drop, "scratch0": scratch0, "scratch1": scratch1}
    missing = [name for name, bit in required.items() if not bit]
    if missing:
        raise ConfigError(
            f"mark mask {mask:#010x} has {mask.bit_count()} bit(s) but felixpy needs at least 5 "
            f"(accept, pass, drop, scratch0, scratch1); cannot allocate: {', '.join(missing)}. "
            "Widen IptablesMarkMask/NftablesMarkMask.")
    wg = 0
    if wireguard:
        wg = mgr.next_single_bit()
        if not wg:
            raise ConfigError(
                f"mark mask {mask:#010x} has no bit left for WireGuard after accept, pass, drop, "
                "scratch0 and scratch1; widen IptablesMarkMask/NftablesMarkMask or disable WireGuard.")
    endpoint, got = mgr.next_block(mgr.available_bit_count())
    if need_endpoint_bits and got == 0:
        raise ConfigError(
            f"mark mask {mask:#010x} leaves no bits for the endpoint mark that kube-proxy IPVS "
            "support needs; widen IptablesMarkMask/NftablesMarkMask.")
    return MarkBits(mask=mask, accept=accept, pass_=pass_, drop=drop, scratch0=scratch0,
                    scratch1=scratch1, wireguard=wg, endpoint=endpoint)


def from_config(config: Config, *, need_endpoint_bits: bool = False) -> MarkBits:
    """Allocate from the active backend's mask; WireGuard bit if WG is on for either family.

    In BPF mode the programs own ``BPF_PROGRAM_MARKS`` unconditionally (their SEEN/BYPASS/NAT_OUT/...
    values are compiled in): the mask must cover them (Felix panics otherwise; a ConfigError here) and
    they are taken out of it before anything is allocated, so no *tables bit can alias a program mark.
    """
    mask = config.mark_mask
    if config.BPFEnabled:
        mask = bpf_allowed_mask(mask)
    return allocate(mask, wireguard=config.WireguardEnabled or config.WireguardEnabledV6,
                    need_endpoint_bits=need_endpoint_bits)


def bpf_allowed_mask(mask: int) -> int:
    """The bits left for *tables in BPF mode: ``mask`` less the programs' marks, which it must cover."""
    if mask & BPF_PROGRAM_MARKS != BPF_PROGRAM_MARKS:
        raise ConfigError(
            f"mark mask {mask:#010x} does not cover {BPF_PROGRAM_MARKS:#010x}, the bits the BPF programs "
            f"use unconditionally (missing {BPF_PROGRAM_MARKS & ~mask:#010x}); widen "
            "IptablesMarkMask/NftablesMarkMask or turn BPFEnabled off.")
    return mask & ~BPF_PROGRAM_MARKS
