"""felixpy's error hierarchy, drawn once.

    FelixpyError
    ├── ConfigError                 bad configuration that cannot fall back (startup)
    ├── FramingError (feed)         malformed frames on a feed: drop that feed only
    ├── DataplaneError              a kernel write or read failed (kept dirty, retried)
    │   ├── CommandError            a tool (iptables-restore, ipset, nft) exited non-zero
    │   └── NetlinkError            a netlink call failed
    ├── UnsupportedFeature          the kernel lacks a feature (IPIP, WireGuard, netkit...)
    └── FatalDataplaneError         retries exhausted: the daemon must exit non-zero
                                     (fail closed, as Felix panics)

Drivers translate exit codes and errno into these at their shim boundary;
reconcile operations are idempotent ("deleting what is absent is not an error").
Only invariant violations and FatalDataplaneError end the process.
"""

from __future__ import annotations


class FelixpyError(Exception):
    """Base class of every error felixpy raises on purpose."""


class ConfigError(FelixpyError):
    """Configuration that cannot be used, even with defaults."""


class DataplaneError(FelixpyError):
    """A kernel read or write failed; the work stays dirty and is retried."""


class CommandError(DataplaneError):
    def __init__(self, argv: list[str], returncode: int, stderr: str, stdin_excerpt: str = "") -> None:
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr
        self.stdin_excerpt = stdin_excerpt
        super().__init__(f"{' '.join(argv)} exited {returncode}: {stderr.strip()[:500]}")


class NetlinkError(DataplaneError):
    """A netlink operation failed."""


class UnsupportedFeature(FelixpyError):
    """The running kernel cannot do what the configuration asks (reported by name)."""

    def __init__(self, feature: str, detail: str = "") -> None:
        self.feature = feature
        super().__init__(f"{feature} is not supported on this node{': ' + detail if detail else ''}")


class FatalDataplaneError(FelixpyError):
    """Retries exhausted on a security-relevant write: exit non-zero (fail closed)."""
