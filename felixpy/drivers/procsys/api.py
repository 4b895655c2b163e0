"""The interface-sysctls contract, as the endpoint manager sees it (no kernel access)."""

from __future__ import annotations

import enum
from typing import Protocol


class IfaceConfig(enum.Enum):
    DONE = "done"
    PENDING = "pending"  # not written yet, or the interface's files were missing
    FAILED = "failed"  # a write failed; retried at the next apply


class InterfaceConfigurer(Protocol):
    """:class:`~felixpy.drivers.procsys.syncer.InterfaceSysctls`, as the endpoint manager uses it."""

    ip_version: int

    def configure(self, iface: str, *, allow_spoofing: bool = False) -> None: ...

    def forget(self, iface: str) -> None: ...

    def state(self, iface: str) -> IfaceConfig | None: ...
