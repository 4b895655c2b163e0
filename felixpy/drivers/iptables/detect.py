"""Backend detection, binary lookup and the feature flags that change rendering.

* :func:`detect_backend` is Felix's ``DetectBackend`` (``IptablesBackend=auto``):
  kube's hint chains in the nft ``mangle`` tables ⇒ ``nft``; else the same check
  on the legacy tables ⇒ ``legacy``; else whichever backend holds more rules
  (ties go to ``legacy``).  An explicit ``legacy``/``nft`` always wins (a
  mismatch with what was detected is only logged).  The legacy ``-t mangle``
  probe runs only when ``/proc/net/ip[6]_tables_names`` lists a table: asking a
  legacy ``*-save`` for a table instantiates it, and an empty legacy table next
  to nft-backed rules makes every ``iptables-nft-save`` print a warning.
* :func:`find_best_binary` is Felix's ``FindBestBinary``: the explicit
  ``ip[6]tables-<mode>-<save|restore>`` first, then ``ip[6]tables-<save|restore>``.
* :class:`FeatureDetector` computes Felix's :class:`Features` from the
  ``iptables --version`` and kernel versions, then applies
  ``FeatureDetectOverride`` (``Name=bool,...``; unknown names are ignored).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from felixpy.drivers.cmdshim import CommandRunner
from felixpy.errors import ConfigError

log = structlog.get_logger(__name__)

_VERSION_RE = re.compile(r"v(\d+\.\d+\.\d+)")
_KERNEL_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_KUBE_HINTS = ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY")

IPTABLES_1_4_7 = (1, 4, 7)   # oldest iptables Felix ever supported (the "unknown" fallback)
IPTABLES_1_6_0 = (1, 6, 0)   # SNAT --random-fully
IPTABLES_1_6_2 = (1, 6, 2)   # MASQUERADE --random-fully; iptables-restore takes the xtables lock
KERNEL_3_10 = (3, 10, 0)     # oldest kernel (the "unknown" fallback)
KERNEL_3_14 = (3, 14, 0)     # --random-fully in the kernel
KERNEL_4_8 = (4, 8, 0)       # NFLOG --nflog-size
KERNEL_5_7 = (5, 7, 0)       # checksum offload fix


@dataclass(frozen=True, slots=True)
class Features:  # noqa: N815 - field names are Felix's (FeatureDetectOverride uses them)
    SNATFullyRandom: bool = False
    MASQFullyRandom: bool = False
    RestoreSupportsLock: bool = False
    ChecksumOffloadBroken: bool = False
    NFLogSize: bool = False


FEATURE_NAMES = tuple(f.name for f in dataclasses.fields(Features))


def parse_iptables_version(text: str) -> tuple[int, int, int] | None:
    m = _VERSION_RE.search(text)
    if not m:
        return None
    a, b, c = (int(x) for x in m.group(1).split("."))
    return (a, b, c)


def parse_kernel_version(release: str) -> tuple[int, int, int] | None:
    m = _KERNEL_RE.match(release.strip())
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def parse_overrides(raw: str | Mapping[str, str] | None) -> dict[str, str]:
    """``FeatureDetectOverride`` text (``A=true,B=false``) → mapping."""
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    out: dict[str, str] = {}
    for part in raw.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _parse_bool(v: str) -> bool | None:
    low = v.strip().lower()
    if low in ("1", "t", "true"):
        return True
    if low in ("0", "f", "false"):
        return False
    return None  # Go's strconv.ParseBool accepts a few more spellings; anything else is ignored


def compute_features(iptables_version: tuple[int, int, int] | None,
                     kernel_version: tuple[int, int, int] | None,
                     overrides: Mapping[str, str] | None = None) -> Features:
    ipt = iptables_version or IPTABLES_1_4_7
    ker = kernel_version or KERNEL_3_10
    values = {
        "SNATFullyRandom": ipt >= IPTABLES_1_6_0 and ker >= KERNEL_3_14,
        "MASQFullyRandom": ipt >= IPTABLES_1_6_2 and ker >= KERNEL_3_14,
        "RestoreSupportsLock": ipt >= IPTABLES_1_6_2,
        "ChecksumOffloadBroken": ker <= KERNEL_5_7,
        "NFLogSize": ker >= KERNEL_4_8,
    }
    for name, raw in (overrides or {}).items():
        val = _parse_bool(raw)
        if val is None or name not in values:
            log.warning("feature override ignored", flag=name, value=raw)
            continue
        values[name] = val
    return Features(**values)


class FeatureDetector:
    """Detects :class:`Features` (cached; :meth:`refresh_features` re-detects)."""

    def __init__(self, runner: CommandRunner, *, iptables_cmd: str = "iptables",
                 kernel_release: Callable[[], str] | None = None,
                 overrides: str | Mapping[str, str] | None = None) -> None:
        self._runner = runner
        self._iptables_cmd = iptables_cmd
        self._kernel_release = kernel_release or (lambda: os.uname().release)
        self._overrides = parse_overrides(overrides)
        self._cache: Features | None = None

    def get_features(self) -> Features:
        if self._cache is None:
            self.refresh_features()
        assert self._cache is not None
        return self._cache

    def refresh_features(self) -> None:
        res = self._runner.run([self._iptables_cmd, "--version"])
        ipt = parse_iptables_version(res.stdout + res.stderr) if res.returncode == 0 else None
        if ipt is None:
            log.warning("could not get iptables version; assuming an old one", cmd=self._iptables_cmd)
        try:
            ker = parse_kernel_version(self._kernel_release())
        except OSError:
            ker = None
        features = compute_features(ipt, ker, self._overrides)
        if features != self._cache:
            log.info("detected iptables features", features=dataclasses.asdict(features),
                     iptables_version=ipt, kernel_version=ker)
            self._cache = features


class StaticFeatures:
    """A detector that always answers the same :class:`Features` (tests, benchmarks)."""

    def __init__(self, features: Features | None = None, **flags: bool) -> None:
        self.features = features if features is not None else Features(**flags)

    def get_features(self) -> Features:
        return self.features

    def refresh_features(self) -> None:
        pass


# ------------------------------------------------------------------------- binaries
def find_best_binary(ip_version: int, backend: str, save_or_restore: str,
                     which: Callable[[str], str | None] = shutil.which) -> str:
    infix = "6" if ip_version == 6 else ""
    candidates = [f"ip{infix}tables-{backend}-{save_or_restore}", f"ip{infix}tables-{save_or_restore}"]
    for c in candidates:
        if which(c):
            return c
    raise ConfigError(f"no iptables command found among {candidates}")


# ------------------------------------------------------------------------- backend
def count_rules(save_output: str) -> int:
    """Felix's countRulesInIptableOutput: lines starting with ``-``."""
    return sum(1 for line in save_output.splitlines() if line.startswith("-"))


def has_kube_chains(save_output: str) -> bool:
    return any(h in save_output for h in _KUBE_HINTS)


def _output(runner: CommandRunner, argv: list[str]) -> str:
    res = runner.run(argv)
    return res.stdout if res.returncode == 0 else ""


def _legacy_tables_loaded(runner: CommandRunner) -> bool:
    for path in ("/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"):
        if _output(runner, ["cat", path]).strip():
            return True
    return False


def detect_backend(runner: CommandRunner, specified: str = "auto",
                   which: Callable[[str], str | None] = shutil.which) -> str:
    """Felix's ``DetectBackend``; returns ``"legacy"`` or ``"nft"``."""
    spec = specified.lower()
    ip6_nft = find_best_binary(6, "nft", "save", which)
    ip4_nft = find_best_binary(4, "nft", "save", which)
    ip6_legacy = find_best_binary(6, "legacy", "save", which)
    ip4_legacy = find_best_binary(4, "legacy", "save", which)
    if (has_kube_chains(_output(runner, [ip6_nft, "-t", "mangle"]))
            or has_kube_chains(_output(runner, [ip4_nft, "-t", "mangle"]))):
        detected = "nft"
    elif _legacy_tables_loaded(runner) and (
            has_kube_chains(_output(runner, [ip6_legacy, "-t", "mangle"]))
            or has_kube_chains(_output(runner, [ip4_legacy, "-t", "mangle"]))):
        detected = "legacy"
    else:
        legacy_lines = count_rules(_output(runner, [ip6_legacy])) + count_rules(_output(runner, [ip4_legacy]))
        nft_lines = count_rules(_output(runner, [ip6_nft])) + count_rules(_output(runner, [ip4_nft]))
        detected = "legacy" if legacy_lines >= nft_lines else "nft"
    if spec != "auto":
        if spec != detected:
            log.warning("IptablesBackend differs from the detected backend; using the configured one",
                        detected=detected, specified=spec)
        return spec
    log.info("detected iptables backend", backend=detected)
    return detected
