"""Kernel names of Calico IP sets, and how a restarted felixpy recognises its own.

Felix names a set ``cali`` + IP version + a one-character *format token* + the
Calico set ID, truncated to 31 characters (the kernel's limit): ``cali40s:abc…``
for IPv4, ``cali60s:abc…`` for IPv6.  Set IDs are already secure hashes, so the
truncation keeps the maximum entropy.  Temporary sets (used to change a set's
metadata without an empty moment) are ``cali4t<N>`` / ``cali6t<N>``.

Ownership is by name prefix, as Felix decides it: anything starting with the
versioned prefix (``cali4``/``cali6``), the historic pre-2.1 prefix
(``felix-4``/``felix-6``), or one of the two unversioned legacy IPv4 names is
ours, so a restarted daemon sweeps sets left by any earlier version.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from felixpy.rules.ipset_names import (  # the one source of Felix's set names
    IPSET_NAME_PREFIX,
    MAX_IPSET_NAME_LENGTH,
    is_temp_ipset_name,
    main_ipset_name,
    owns_ipset,
    temp_ipset_name,
)

__all__ = ["IPSET_NAME_PREFIX", "MAX_IPSET_NAME_LENGTH", "IPVersionConfig", "family_for_version"]


def family_for_version(ip_version: int) -> str:
    if ip_version == 4:
        return "inet"
    if ip_version == 6:
        return "inet6"
    raise ValueError(f"bad IP version {ip_version!r}")


@dataclass(frozen=True, slots=True)
class IPVersionConfig:
    """Naming for one IP family (Felix's ``IPVersionConfig``), over :mod:`felixpy.rules.ipset_names`."""

    ip_version: int
    family: str = field(init=False)
    main_prefix: str = field(init=False)
    temp_prefix: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", family_for_version(self.ip_version))
        object.__setattr__(self, "main_prefix", main_ipset_name("", self.ip_version))
        object.__setattr__(self, "temp_prefix", temp_ipset_name(0, self.ip_version)[:-1])

    def name_for_main(self, set_id: str) -> str:
        return main_ipset_name(set_id, self.ip_version)

    def name_for_temp(self, index: int) -> str:
        return temp_ipset_name(index, self.ip_version)

    def owns(self, name: str) -> bool:
        return owns_ipset(name, self.ip_version)

    def is_temp(self, name: str) -> bool:
        return is_temp_ipset_name(name, self.ip_version)

    def is_main(self, name: str) -> bool:
        return name.startswith(self.main_prefix)
