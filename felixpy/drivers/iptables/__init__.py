"""The iptables backend of the *tables Table protocol (legacy and nft-backed iptables).

* :mod:`.table` — :class:`IptablesTable`, one per (table, IP version);
* :mod:`.render` — typed rules → Felix's exact iptables text and ``cali:`` hashes;
* :mod:`.savefile` — pure parsers of ``*-save`` output;
* :mod:`.restore_buffer` — ``*-restore`` transactions;
* :mod:`.detect` — backend detection, binary lookup, feature flags;
* :mod:`.metrics` — ``felix_iptables_*`` metrics;
* :mod:`.fake` — a stateful fake of the tools for unit tests.

Tools run through the shared :mod:`felixpy.drivers.cmdshim`.  See ``docs/iptables.md``.
"""

from felixpy.drivers.iptables.detect import FeatureDetector, Features, StaticFeatures, detect_backend
from felixpy.drivers.iptables.table import KERNEL_CHAINS, IptablesTable

__all__ = [
    "FeatureDetector", "Features", "StaticFeatures",
    "detect_backend", "IptablesTable", "KERNEL_CHAINS",
]
