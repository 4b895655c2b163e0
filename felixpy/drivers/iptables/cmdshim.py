"""The command-runner shim: the only place the iptables driver starts processes.

A :class:`CommandRunner` runs one argv with optional stdin and returns a
:class:`CommandResult`; it never raises for a non-zero exit (callers decide what
a failure means, via :meth:`CommandResult.check`, which raises
:class:`~felixpy.errors.CommandError`).  The real runner can prefix every
command with ``ip netns exec <name>`` so that tests and benchmarks act inside a
throwaway namespace; without a namespace it acts in the calling thread's
network namespace.  :class:`felixpy.drivers.iptables.fake.FakeIptables` is the
stateful stand-in used by unit tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from felixpy.errors import CommandError


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def check(self, stdin_excerpt: str = "") -> CommandResult:
        if self.returncode != 0:
            raise CommandError(list(self.argv), self.returncode, self.stderr, stdin_excerpt)
        return self


@runtime_checkable
class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], input: str | None = None) -> CommandResult: ...


class RealRunner:
    """Runs commands with :mod:`subprocess`, optionally inside a named network namespace.

    ``env`` replaces the child's environment (tests use it to put a stub
    ``iptables-restore`` earlier on ``PATH``); ``timeout`` bounds every call.
    A missing binary is reported as exit code 127, like a shell would.
    """

    def __init__(self, netns: str | None = None, env: Mapping[str, str] | None = None,
                 timeout: float = 120.0) -> None:
        self.netns = netns
        self.env = dict(env) if env is not None else None
        self.timeout = timeout

    def run(self, argv: Sequence[str], input: str | None = None) -> CommandResult:
        full = list(argv)
        if self.netns is not None:
            full = ["ip", "netns", "exec", self.netns, *full]
        try:
            proc = subprocess.run(full, input=input, capture_output=True, text=True, check=False,
                                  timeout=self.timeout, env=self.env)
        except FileNotFoundError as e:
            return CommandResult(tuple(argv), 127, "", str(e))
        except subprocess.TimeoutExpired as e:
            return CommandResult(tuple(argv), -9, "", f"timed out after {e.timeout}s")
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

    def which(self, name: str) -> str | None:
        """Look *name* up on the PATH the children will see."""
        path = (self.env or os.environ).get("PATH")
        return shutil.which(name, path=path)
