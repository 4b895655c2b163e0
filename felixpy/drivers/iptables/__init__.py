"""The iptables backend of the *tables Table protocol (legacy and nft-backed iptables).

* :mod:`.table` — :class:`IptablesTable`, one per (table, IP version);
* :mod:`.render` — typed rules → Felix's exact iptables text and ``cali:`` hashes;
* :mod:`.savefile` — pure parsers of ``*-save`` output;
* :mod:`.restore_buffer` — ``*-restore`` transactions;
* :mod:`.detect` — backend detection, binary lookup, feature flags;
* :mod:`.cmdshim` — the command runner (optionally inside a network namespace);
* :mod:`.metrics` — ``felix_iptables_*`` metrics;
* :mod:`.fake` — a stateful fake of the tools for unit tests.

See ``docs/iptables.md``.
"""

from felixpy.drivers.iptables.cmdshim import CommandResult, CommandRunner, RealRunner
from felixpy.drivers.iptables.detect import FeatureDetector, Features, StaticFeatures, detect_backend
from felixpy.drivers.iptables.table import KERNEL_CHAINS, IptablesTable

__all__ = [
    "CommandResult", "CommandRunner", "RealRunner", "FeatureDetector", "Features", "StaticFeatures",
    "detect_backend", "IptablesTable", "KERNEL_CHAINS",
]
