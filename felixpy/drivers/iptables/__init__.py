"""The iptables backend of the *tables Table protocol (legacy and nft-backed iptables).

* :mod:`.table` — :class:`IptablesTable`, one per (table, IP version);
* :mod:`.render` — typed rules → Felix's exact iptables text and ``cali:`` hashes;
* :mod:`.savefile` — pure parsers of ``*-save`` output;
* :mod:`.saveworker` — the child process that saves and parses a big table;
* :mod:`.restore_buffer` — ``*-restore`` transactions;
* :mod:`.detect` — backend detection, binary lookup, feature flags;
* :mod:`.metrics` — ``felix_iptables_*`` metrics;
* :mod:`.fake` — a stateful fake of the tools for unit tests.

Tools run through the shared :mod:`felixpy.drivers.cmdshim`.  See ``docs/iptables.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from felixpy.drivers.iptables.detect import FeatureDetector, Features, StaticFeatures, detect_backend
    from felixpy.drivers.iptables.table import KERNEL_CHAINS, IptablesTable

__all__ = [
    "FeatureDetector", "Features", "StaticFeatures",
    "detect_backend", "IptablesTable", "KERNEL_CHAINS",
]

# Imported on first use, so that a submodule alone (the save worker, a child process started per big
# read) does not pay for the table, metrics and logging.
_HOME = {"FeatureDetector": "detect", "Features": "detect", "StaticFeatures": "detect",
         "detect_backend": "detect", "IptablesTable": "table", "KERNEL_CHAINS": "table"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
