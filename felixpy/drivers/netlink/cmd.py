"""The narrow command shim used by the routing drivers: ``ip`` (iproute2) and ``conntrack``.

A :class:`CommandRunner` runs one argv, optionally with stdin, and returns the
exit code and both outputs; it never raises because the command failed (the
caller decides what a failure means).  Tests inject scripted runners;
production and kernel tests use :class:`SubprocessRunner`.

Namespaces: ``SubprocessRunner(netns="name")`` forks the child from the calling
thread while that thread is inside the namespace (:func:`.nsutil.call_in_netns`,
the same mechanism the netlink sockets use), so nothing runs in the root
namespace by accident and a missing namespace is an error, never created.
Children run with ``LC_ALL=C``: callers match ``ip``'s English messages.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from felixpy.drivers.netlink.nsutil import call_in_netns


@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int
    stdout: str = ""
    stderr: str = ""


class CommandRunner(Protocol):
    def __call__(self, argv: Sequence[str], stdin: str | None = None) -> CommandResult: ...


class SubprocessRunner:
    """Runs commands for real (exit 127: not found or no such namespace).

    A command that outlives ``timeout`` raises :class:`subprocess.TimeoutExpired`
    (callers that must not raise convert it).
    """

    def __init__(self, netns: str | None = None, timeout: float = 60.0) -> None:
        self.netns = netns
        self.timeout = timeout
        self._env = {**os.environ, "LC_ALL": "C"}

    def __call__(self, argv: Sequence[str], stdin: str | None = None) -> CommandResult:
        def run() -> subprocess.CompletedProcess[str]:
            return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=self.timeout,
                                  env=self._env)

        try:
            p = call_in_netns(self.netns, run)
        except FileNotFoundError as exc:
            return CommandResult(127, "", str(exc))
        return CommandResult(p.returncode, p.stdout, p.stderr)
