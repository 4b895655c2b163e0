"""The command-runner shim: the only place drivers start processes.

Every driver that drives a tool — ``ip[6]tables-{save,restore}``, ``ipset``,
``ip`` (iproute2), ``conntrack`` — is given a :class:`CommandRunner` in its
constructor and calls :meth:`CommandRunner.run` with an argv and, optionally,
the whole stdin as one string.  It gets back a :class:`CommandResult` (exit
code and both outputs).  A runner never raises because the *command* failed —
the caller decides what a failure means (:meth:`CommandResult.check` raises
:class:`~felixpy.errors.CommandError`) — so failing to start the command or
outliving the timeout are reported as exit codes too:

=====================  ============================================================
exit code              meaning
=====================  ============================================================
``0`` ... ``255``      the command's own exit status
``-N``                 the command died of signal ``N``
``124``                :data:`EXIT_TIMED_OUT`: killed after ``timeout`` seconds
``126``                :data:`EXIT_NOT_EXECUTABLE`: found but not executable
``127``                :data:`EXIT_NOT_FOUND`: no such binary, or no such namespace
=====================  ============================================================

(the same codes ``timeout(1)`` and a shell use).

:class:`SubprocessRunner` is the real thing; tests inject stateful fakes that
implement the same protocol (:class:`felixpy.drivers.iptables.fake.FakeIptables`,
:class:`felixpy.drivers.ipsets.fake.FakeIPSet`, scripted runners in the routing
tests).

Namespaces: ``SubprocessRunner(netns="name")`` forks each child from the
calling thread while that thread is inside the named namespace
(:func:`felixpy.drivers.netlink.nsutil.call_in_netns`, the mechanism the
netlink sockets use; no ``ip netns exec`` per call).  A missing namespace is
reported (exit 127), never created, and nothing falls back to the caller's
namespace.  Without ``netns`` children run in the calling thread's namespace —
so a thread moved into a namespace (:func:`felixpy.testing.netns.entered`)
also works with a plain runner.

Environment: children see ``env`` (default: this process's environment at the
time of the call) with ``LC_ALL=C`` on top, because drivers match the tools'
English messages ("does not exist", "Another app is currently holding the
xtables lock").  :meth:`SubprocessRunner.which` looks binaries up on the
``PATH`` the children will see.

Stdin, stdout and stderr are in-memory files (``memfd``), never pipes.  Stdin:
megabytes of ``ipset restore`` / ``iptables-restore`` input cost one copy, not a
select/write round per 4 KiB competing for the GIL; it is encoded into the file a
piece at a time, and :class:`SubprocessRunner` also takes it as a sequence of lines
(:class:`LinesRunner`), so a caller holding lines never builds the joined text.
Without stdin the child reads ``/dev/null`` (never our own stdin).  Outputs: with a pipe the child can only run
as fast as the daemon empties it, and the thread reading it needs the GIL for
every 32 KiB; while another thread renders (the loop runs the IP-set write beside
the policy renders), that thread gets the GIL back once per switch interval
(5 ms), so ``ipset save`` of 200,000 members — 6.5 MB — took 0.94 s instead of
0.2 s (issue #17, docs/benchmarks.md, tenth pass).  Written into a file, the
child runs at its own speed and the output is read in one go once it exited.
Outputs are decoded as UTF-8 (an undecodable byte becomes U+FFFD rather than an
exception: a foreign rule's comment must not fail an apply) with universal
newlines, as ``text=True`` did.  A caller that parses a big output a piece at a time
runs the command with :func:`run_output` instead: the stdout stays in its file until
:meth:`Output.pieces` reads it, so the whole text never exists in the daemon at once
(``ipset save`` of a large node, 7 MB, was held as bytes and as text together at the
restart's memory peak; issue #17).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeGuard, runtime_checkable

from felixpy.drivers.netlink.nsutil import call_in_netns
from felixpy.errors import CommandError

__all__ = ["EXIT_NOT_EXECUTABLE", "EXIT_NOT_FOUND", "EXIT_TIMED_OUT", "BinaryLocator", "CommandResult",
           "CommandRunner", "Following", "KeepsOutput", "Output", "SubprocessRunner", "run_output"]

EXIT_TIMED_OUT = 124
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

DEFAULT_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command did.  ``argv`` is what the caller asked to run (for error messages)."""

    returncode: int
    stdout: str = ""
    stderr: str = ""
    argv: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def timed_out(self) -> bool:
        return self.returncode == EXIT_TIMED_OUT

    def check(self, stdin_excerpt: str = "") -> CommandResult:
        """This result if the command succeeded; else raise :class:`~felixpy.errors.CommandError`."""
        if self.returncode != 0:
            raise CommandError(list(self.argv), self.returncode, self.stderr, stdin_excerpt)
        return self


@runtime_checkable
class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        """Run *argv* to completion, with *stdin* as its whole input; never raise for the command failing.

        *while_running*, if given, is called once after the command started and
        before waiting for it, so that the caller's bookkeeping overlaps the
        kernel's work instead of adding to it.  It must not depend on the
        command's outcome.  An exception from it kills the command and propagates.
        """
        ...


class LinesRunner(Protocol):
    """A runner whose ``run`` also takes its stdin as lines (any iterable; each followed by a newline), written to the
    child a piece at a time: a start of day's ``iptables-restore`` input is tens of MB at the largest nodes,
    and joined into one string it would be held twice at the peak.  :func:`takes_stdin_lines` tells."""

    takes_stdin_lines: bool

    def run(self, argv: Sequence[str], stdin: str | Iterable[str] | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult: ...


def takes_stdin_lines(runner: object) -> TypeGuard[LinesRunner]:
    return getattr(runner, "takes_stdin_lines", False) is True


def stdin_text(stdin: str | Iterable[str] | None) -> str | None:
    """*stdin* as the one text the child reads (lines each followed by a newline); for runners that record."""
    if stdin is None or isinstance(stdin, str):
        return stdin
    return "".join(line + "\n" for line in stdin)


@runtime_checkable
class BinaryLocator(Protocol):
    """A runner that can also say where a binary is (iptables picks ``*-legacy-*`` vs ``*-nft-*`` this way)."""

    def which(self, name: str) -> str | None: ...


class SubprocessRunner:
    """Runs real commands (see the module docstring for namespaces, environment and exit codes).

    ``timeout`` bounds each command from the moment ``while_running`` returns
    (or from its start, without a hook).
    """

    takes_stdin_lines = True  # LinesRunner

    def __init__(self, netns: str | None = None, *, env: Mapping[str, str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.netns = netns
        self.env = dict(env) if env is not None else None
        self.timeout = timeout

    def _child_env(self) -> dict[str, str]:
        return {**(self.env if self.env is not None else os.environ), "LC_ALL": "C"}

    def which(self, name: str) -> str | None:
        """Look *name* up on the ``PATH`` the children will see."""
        return shutil.which(name, path=self._child_env().get("PATH"))

    def run(self, argv: Sequence[str], stdin: str | Iterable[str] | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        """As :meth:`CommandRunner.run`; *stdin* may also be a sequence of lines (:class:`LinesRunner`)."""
        with self.run_output(argv, stdin, while_running=while_running) as out:
            return out.read_all()

    def run_output(self, argv: Sequence[str], stdin: str | Iterable[str] | None = None, *,
                   while_running: Callable[[], None] | None = None) -> Output:
        """As :meth:`run`, the stdout left in its file (:class:`Output`; the caller closes it)."""
        args = tuple(argv)
        started = self._start(args, stdin)
        if isinstance(started, CommandResult):
            return Output(started)
        proc, out_fd, err_fd = started
        try:
            try:
                if while_running is not None:
                    # The child reads its input and writes its outputs in files while we work.
                    while_running()
                _wait(proc, self.timeout)
            except subprocess.TimeoutExpired:
                _kill(proc)
                return Output(_timed_out(args, self.timeout))
            except BaseException:
                _kill(proc)
                raise
            out = Output(CommandResult(proc.returncode, "", _read_text(err_fd), args), out_fd)
            out_fd = -1  # the Output closes it
            return out
        finally:
            if out_fd >= 0:
                os.close(out_fd)
            os.close(err_fd)

    def follow(self, argv: Sequence[str]) -> Following:
        """*argv* started, its stdout read while the child writes it (:class:`Following`; the caller closes
        it): a parser of a big output that keeps up with the child finishes about when the child does,
        instead of starting only then."""
        args = tuple(argv)
        started = self._start(args, None)
        if isinstance(started, CommandResult):
            return Following(args, started)
        return Following(args, started, self.timeout)

    def _start(self, argv: Sequence[str], stdin: str | Iterable[str] | None
               ) -> tuple[subprocess.Popen[bytes], int, int] | CommandResult:
        """The child started, writing its stdout and stderr into two new in-memory files (the caller closes
        both), or why it could not start."""
        args = tuple(argv)
        if not args:
            raise ValueError("empty argv")
        env = self._child_env()

        def spawn() -> subprocess.Popen[bytes] | CommandResult:
            try:
                return subprocess.Popen(args, stdin=stdin_fd if stdin_fd is not None else subprocess.DEVNULL,
                                        stdout=out_fd, stderr=err_fd, env=env)
            except FileNotFoundError as exc:
                return CommandResult(EXIT_NOT_FOUND, "", f"{args[0]}: {exc.strerror}", args)
            except PermissionError as exc:
                return CommandResult(EXIT_NOT_EXECUTABLE, "", f"{args[0]}: {exc.strerror}", args)

        out_fd = os.memfd_create("felixpy-cmd-stdout", os.MFD_CLOEXEC)
        try:
            err_fd = os.memfd_create("felixpy-cmd-stderr", os.MFD_CLOEXEC)
        except BaseException:
            os.close(out_fd)
            raise
        started: subprocess.Popen[bytes] | CommandResult | None = None
        try:
            stdin_fd = _stdin_file(stdin) if stdin is not None else None
            try:
                # Only the fork happens inside the namespace; the thread is back home before we wait.
                started = call_in_netns(self.netns, spawn)
            except FileNotFoundError:  # /run/netns/<name>: spawn() catches its own
                started = CommandResult(EXIT_NOT_FOUND, "", f"{args[0]}: no such network namespace {self.netns!r}",
                                        args)
            finally:
                if stdin_fd is not None:
                    os.close(stdin_fd)  # the child has its own copy
        finally:
            if not isinstance(started, subprocess.Popen):
                os.close(out_fd)
                os.close(err_fd)
        if isinstance(started, CommandResult):
            return started
        return started, out_fd, err_fd


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()


def _timed_out(args: Sequence[str], timeout: float) -> CommandResult:
    return CommandResult(EXIT_TIMED_OUT, "", f"{args[0]}: timed out after {timeout}s", tuple(args))


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Reap *proc* once it exits; TimeoutExpired after *timeout* s.  ``Popen.wait(timeout)`` polls with
    sleeps growing to 50 ms, which added a mean ~25 ms to every command (a legacy one-chain restore,
    110 ms, took 170); a pidfd wakes us the moment the child exits."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfds (kernel < 5.3): the polling wait
        proc.wait(timeout=timeout)
        return
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if not poller.poll(max(0, int(timeout * 1000))):
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(pidfd)
    proc.wait()


def _decode(data: bytes | bytearray) -> str:
    """Output bytes as ``text=True`` would have decoded them from a pipe."""
    text = data.decode("utf-8", "replace")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _read_text(fd: int) -> str:
    """All a child wrote to the file *fd*, decoded."""
    size = os.fstat(fd).st_size
    if not size:
        return ""
    chunks: list[bytes] = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return _decode(chunks[0] if len(chunks) == 1 else b"".join(chunks))


OUTPUT_PIECE = 1 << 20  # bytes of a kept stdout read at a time by Output.pieces


class Output:
    """A finished command: its :class:`CommandResult` with an empty ``stdout``, and the stdout still in
    the in-memory file the child wrote (none for a command that did not run).  Read it whole
    (:meth:`read_all`) or a piece at a time (:meth:`pieces`); :meth:`close` (or ``with``) lets the file
    go.  A runner without :meth:`SubprocessRunner.run_output` gives one through :func:`run_output`, its
    stdout already read."""

    def __init__(self, result: CommandResult, fd: int | None = None) -> None:
        self.result = result
        self._fd = fd

    def __enter__(self) -> Output:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def read_all(self) -> CommandResult:
        """The result with the whole stdout in it."""
        if self._fd is None:
            return self.result
        return replace(self.result, stdout=_read_text(self._fd))

    def pieces(self, record: bytes, size: int = 0) -> Iterator[str]:
        """The stdout decoded about *size* bytes at a time, in pieces of whole lines that end just before
        a line beginning with *record* (the last piece ends where the output does): a parser of records
        whose first line begins so (``b"create "``: the sets of an ``ipset save``) sees only whole
        records in every piece after the first.  A record longer than *size* is one piece of its own.
        *size* 0: :data:`OUTPUT_PIECE`."""
        size = size or OUTPUT_PIECE
        if self._fd is None:
            if self.result.stdout:
                yield self.result.stdout
            return
        cut = b"\n" + record
        buf = bytearray()
        offset = 0
        while True:
            chunk = os.pread(self._fd, size, offset)
            if not chunk:
                break
            offset += len(chunk)
            searched = max(0, len(buf) - len(cut) + 1)  # no cut ends in what was already searched
            buf += chunk
            pos = buf.rfind(cut, searched)
            if pos >= 0:
                yield _decode(buf[:pos + 1])  # up to and with the newline
                del buf[:pos + 1]
        if buf:
            yield _decode(buf)


FOLLOW_PIECE = 256 << 10  # bytes a followed stdout gathers before a piece is handed out (at least)
FOLLOW_POLL = 0.005  # s between looks at a followed stdout while the child runs


class Following:
    """A command running with its stdout read while the child writes it (:meth:`SubprocessRunner.follow`).

    The child still writes into an in-memory file at its own speed (never blocked on a pipe we have not
    emptied); :meth:`pieces` looks at the file's size every :data:`FOLLOW_POLL` and hands out what has
    arrived in pieces of whole lines, decoded as :meth:`Output.read_all` decodes, so the pieces joined are
    the text ``run`` would have given.  :meth:`result` waits for the exit (killing the child at the
    runner's timeout) and gives the exit status and stderr; :meth:`close` (or ``with``) kills a child
    still running and lets the files go."""

    def __init__(self, argv: tuple[str, ...],
                 started: tuple[subprocess.Popen[bytes], int, int] | CommandResult,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self._args = argv
        self._done: CommandResult | None = started if isinstance(started, CommandResult) else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._out = self._err = -1
        if not isinstance(started, CommandResult):
            self._proc, self._out, self._err = started
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout

    def __enter__(self) -> Following:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pieces(self, size: int = 0) -> Iterator[str]:
        """The stdout as it is written, in pieces of whole lines of about *size* bytes or more (0:
        :data:`FOLLOW_PIECE`), the rest once the child exited.  Nothing for a command that did not start;
        the child killed at the timeout ends the pieces early (:meth:`result` says so)."""
        size = size or FOLLOW_PIECE
        proc = self._proc
        if proc is None:
            return
        with _ExitWatch(proc) as watch:
            buf = bytearray()
            offset = 0
            exited = False
            while True:
                end = os.fstat(self._out).st_size
                if end - offset >= size or (exited and end > offset):
                    chunk = os.pread(self._out, end - offset, offset)
                    offset += len(chunk)
                    buf += chunk
                    pos = len(buf) if exited and offset >= end else buf.rfind(b"\n") + 1
                    if pos > 0:
                        yield _decode(buf[:pos])
                        del buf[:pos]
                    continue
                if exited:
                    if buf:
                        yield _decode(buf)
                    return
                if proc.poll() is not None:
                    exited = True  # read what it wrote last, then end
                elif time.monotonic() >= self._deadline:
                    self._finish_killed()
                    return
                else:
                    watch.wait(FOLLOW_POLL)

    def result(self) -> CommandResult:
        """How the command ended (stdout empty: it came through :meth:`pieces`); waits for the exit."""
        if self._done is None:
            assert self._proc is not None
            try:
                _wait(self._proc, max(0.0, self._deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._finish_killed()
            else:
                self._done = CommandResult(self._proc.returncode, "", _read_text(self._err), self._args)
        assert self._done is not None
        return self._done

    def _finish_killed(self) -> None:
        assert self._proc is not None
        _kill(self._proc)
        self._done = _timed_out(self._args, self._timeout)

    def close(self) -> None:
        """Let the files go; a child still running is killed (its result: death by SIGKILL, ``-9``), and one
        that already exited keeps its own result."""
        if self._done is None and self._proc is not None:
            if self._proc.poll() is None:
                _kill(self._proc)
                self._done = CommandResult(self._proc.returncode, "", "", self._args)
            else:
                self.result()
        for fd in (self._out, self._err):
            if fd >= 0:
                os.close(fd)
        self._out = self._err = -1


class _ExitWatch:
    """Sleeps until a child exits or a while passes: on its pidfd where there is one, else a plain sleep."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            self._fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # no pidfds, or already reaped
            self._fd = -1

    def __enter__(self) -> _ExitWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def wait(self, seconds: float) -> None:
        if self._fd >= 0:
            select.select([self._fd], [], [], seconds)
        else:
            time.sleep(seconds)


@runtime_checkable
class KeepsOutput(Protocol):
    """A runner that can leave a command's stdout in its file (:class:`SubprocessRunner`)."""

    def run_output(self, argv: Sequence[str]) -> Output: ...


def run_output(runner: CommandRunner, argv: Sequence[str]) -> Output:
    """*argv* run by *runner*, its stdout kept in its file if the runner can (:class:`KeepsOutput`), else
    read (the fakes): for callers that read a big output with :meth:`Output.pieces`."""
    if isinstance(runner, KeepsOutput):
        return runner.run_output(argv)
    return Output(runner.run(argv))


_STDIN_PIECE = 256 << 10  # characters encoded and written at a time (at most)
_STDIN_LINES = 8192  # lines joined, encoded and written at a time (at most)


def _stdin_pieces(stdin: str | Iterable[str]) -> Iterator[str]:
    if isinstance(stdin, str):
        for start in range(0, len(stdin), _STDIN_PIECE):
            yield stdin[start:start + _STDIN_PIECE]
        return
    # Lines are bounded by characters too: an nft script's set line holds a whole set's members (~3 KB for
    # 200), and 8,192 of them joined and encoded would be a start of day's script twice over (issue #17).
    lines = iter(stdin)
    while True:
        batch: list[str] = []
        size = 0
        for line in lines:
            batch.append(line)
            size += len(line) + 1
            if size >= _STDIN_PIECE or len(batch) >= _STDIN_LINES:
                break
        if not batch:
            return
        yield "".join(line + "\n" for line in batch)


def _stdin_file(stdin: str | Iterable[str]) -> int:
    """An in-memory file holding *stdin* (a text, or lines each followed by a newline), at offset 0, for a
    child's stdin (close-on-exec for everyone else)."""
    fd = os.memfd_create("felixpy-cmd-stdin", os.MFD_CLOEXEC)
    try:
        # Encoded a piece at a time: a start of day's restore input is tens of MB at the largest nodes, and
        # one encode() would hold a second copy of it while it is written.
        for piece in _stdin_pieces(stdin):
            view = memoryview(piece.encode())
            while view:
                view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
