"""The narrow shim between the ipset driver and the ``ipset`` binary.

The driver only ever calls :meth:`CommandRunner.run` with an argv (and, for
``ipset restore``, the whole stdin as one string) and gets back the exit code
and both outputs; it decides what a failure means.  Tests inject the stateful
fake in :mod:`.fake`; production and kernel tests use :class:`SubprocessRunner`.

Namespaces: a runner made with ``netns="name"`` runs every command under
``ip netns exec name`` (one extra exec per call).  The cheaper way, used by the
benchmarks and the ``in_netns`` test fixture, is to move the calling thread into
the namespace (:func:`felixpy.testing.netns.entered`): children forked by that
thread inherit it, so a plain runner acts inside the namespace.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@runtime_checkable
class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], stdin: str | None = None,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        """Run *argv* to completion; never raise for the command failing.

        *while_running*, if given, is called once while the command runs (after
        it started), so that the caller's bookkeeping overlaps the kernel's work
        instead of adding to it.  It must not depend on the command's outcome.
        """
        ...


class SubprocessRunner:
    """Runs real commands; returns their result (exit 127: not found, 124: timed out)."""

    def __init__(self, netns: str | None = None, timeout: float = 120.0) -> None:
        self.netns = netns
        self.timeout = timeout
        self._prefix = ["ip", "netns", "exec", netns] if netns else []
        # Messages are matched on their English text ("does not exist", "in use").
        self._env = {**os.environ, "LC_ALL": "C"}

    def run(self, argv: Sequence[str], stdin: str | None = None,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        full = [*self._prefix, *argv]
        stdin_fd = _stdin_file(stdin) if stdin is not None else None
        try:
            proc = subprocess.Popen(full, stdin=stdin_fd if stdin_fd is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self._env)
        except FileNotFoundError as exc:
            return CommandResult(127, "", f"{full[0]}: {exc.strerror}")
        finally:
            if stdin_fd is not None:
                os.close(stdin_fd)  # the child has its own copy
        try:
            if while_running is not None:
                # The child reads its input straight from the file while we work.
                # Our pipes only carry its (small) outputs, read just below; a
                # child that filled one would merely wait for us.
                while_running()
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return CommandResult(124, "", f"{' '.join(full[:3])}: timed out after {self.timeout}s")
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return CommandResult(proc.returncode, out, err)


def _stdin_file(text: str) -> int:
    """An in-memory file holding *text*, at offset 0, for a child's stdin.

    Feeding megabytes of ``ipset restore`` input through a pipe from Python
    costs a select/write round per 4 KiB and competes for the GIL with whatever
    else the process does; a child reading a memfd just reads.
    """
    fd = os.memfd_create("ipset-input", os.MFD_CLOEXEC)
    try:
        view = memoryview(text.encode())
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
