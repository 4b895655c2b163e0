"""The narrow shim between the nftables table and libnftables (Debian's ``nftables`` module).

Two calls, both in libnftables' JSON dialect, plus a text one:

* :meth:`NftShim.run` executes a list of commands as **one** transaction
  (libnftables batches a whole buffer: all or nothing) and raises
  :class:`NftError` if the kernel refused any of it;
* :meth:`NftShim.list_table` lists one table as the list of JSON objects
  (``table``, ``set``, ``map``, ``chain``, ``rule``…) or returns None when the
  table does not exist;
* :meth:`LibNftables.run_script` (optional, :class:`NftScriptShim`) runs an
  nft script as one transaction — faster for very large ones, see
  :mod:`.script`; :meth:`NftChildProcess.run_script_lines`
  (:class:`NftScriptLinesShim`) takes one as lines, written to ``nft`` as
  they are made, so a start of day's script is never held whole.

Two implementations: :class:`LibNftables` runs libnftables inside this process
(ctypes); :class:`NftChildProcess` runs the ``nft`` binary as a child per call
(``nft -j -f -``, ``nft -f -``, ``nft -j list table``), as Felix does through
knftables.  The child's C heap — about 3.8 KB per rule of a transaction, so
gigabytes for a 300k-rule start of day — dies with the child instead of
staying in this process's malloc arenas.  Given ``worker_below``, it sends
transactions smaller than that to a :class:`TransactionWorker` instead: one
long-lived child (:mod:`.txworker`) holding a libnftables context, which skips
a fresh ``nft``'s cold start for the steady state's small transactions.

libnftables acts on the network namespace of the *calling thread*, through a
context that is not thread safe: one shim per table, used from one thread at a
time.  :class:`~felixpy.drivers.nftables.fake.FakeNft` implements the same
protocol for unit tests.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import select
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import structlog

from felixpy.drivers.cmdshim import DEFAULT_TIMEOUT, CommandRunner, takes_stdin_lines
from felixpy.drivers.nftables.txworker import JSON, READY, REPLY, REQUEST, SCRIPT, read_exactly
from felixpy.errors import CommandError

if TYPE_CHECKING:
    from felixpy.drivers.nftables.readback import TableSnapshot

SNAPSHOT_WORKER_NFT_FAILED = 3  # snapshotworker.EXIT_NFT_FAILED: nft's status and stderr follow as JSON

_log = structlog.get_logger(__name__)
_ARGV = ["libnftables", "json"]
# A run whose input or output is at least this big (a start of day, a full listing) hands the
# C heap libnftables freed back to the kernel: ~3.8 KB per rule, held in the calling thread's
# malloc arena, where the next big run (the other family's table, on another apply thread)
# could not reuse it.
BIG_RUN_BYTES = 1 << 20
# The daemon's transactions below this size go to the long-lived transaction worker: the steady state
# (a churn apply is ~60 KB, ~400 rules); start of day and rebuilds (~2,000 rules and up, the table's
# TEXT_THRESHOLD) keep a fresh ``nft`` whose heap dies with it.
WORKER_BELOW_BYTES = 256 << 10
_EXCERPT = 2000   # characters of a refused transaction quoted in its error


class NftError(CommandError):
    """libnftables refused a command; ``stderr`` carries its message."""

    def __init__(self, returncode: int, stderr: str, excerpt: str = "", argv: Sequence[str] = _ARGV) -> None:
        super().__init__(list(argv), returncode, stderr, excerpt)

    @property
    def not_found(self) -> bool:
        return "No such file or directory" in self.stderr


@runtime_checkable
class NftShim(Protocol):
    def run(self, commands: Sequence[dict[str, Any]]) -> None: ...

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None: ...


@runtime_checkable
class NftSetsShim(NftShim, Protocol):
    """A shim that can list just the table's sets (with their elements): the IP-set refresh path."""

    def list_sets(self, family: str, name: str) -> list[dict[str, Any]] | None: ...


@runtime_checkable
class NftListerFactory(NftShim, Protocol):
    """A shim that can hand out a second one for listing on another thread while this one writes."""

    def lister(self) -> NftShim: ...


def _sets_of(objs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    # ``list sets table F T`` lists every table's sets of family F (nft 1.0.6): keep table T's.
    return [o for o in objs if "set" in o and o["set"].get("table") == name]


def _has_table(objs: list[dict[str, Any]], name: str) -> bool:
    return any(o.get("table", {}).get("name") == name for o in objs)


@runtime_checkable
class NftSnapshotShim(NftShim, Protocol):
    """A shim that lists *and parses* (``kind`` "table" or "sets"), None when the table is missing: how
    the table reads back, so that a shim may parse somewhere else (:class:`NftChildProcess` in a child)."""

    def snapshot(self, kind: str, family: str, name: str, ip_version: int) -> TableSnapshot | None: ...


def read_snapshot(shim: NftShim, kind: str, family: str, name: str, ip_version: int) -> TableSnapshot | None:
    """The table (or only its sets) as a snapshot, through the shim's own :meth:`~NftSnapshotShim.snapshot`
    when it has one, else listed and parsed here."""
    if isinstance(shim, NftSnapshotShim):
        return shim.snapshot(kind, family, name, ip_version)
    from felixpy.drivers.nftables.readback import parse_table

    if kind == "sets":
        if not isinstance(shim, NftSetsShim):
            raise TypeError(f"{type(shim).__name__} cannot list sets alone")
        objs = shim.list_sets(family, name)
    else:
        objs = shim.list_table(family, name)
    return None if objs is None else parse_table(objs, ip_version)


@runtime_checkable
class NftScriptShim(NftShim, Protocol):
    """A shim that can also run an nft script (text) as one transaction: the large-transaction path."""

    def run_script(self, script: str) -> None: ...


@runtime_checkable
class NftScriptLinesShim(NftScriptShim, Protocol):
    """A script shim that also takes the script as lines, consumed as they are written to nft: a start of
    day's script (~3 MB at the large node, 200,000 set members) is never held whole, nor its lines."""

    def run_script_lines(self, lines: Iterable[str]) -> None: ...


class LibNftables:
    """The real shim: an ``nftables.Nftables`` context with JSON output."""

    def __init__(self) -> None:
        # Debian's python3-nftables (ctypes over libnftables.so.1) has no types or stubs; only its JSON
        # strings cross this class's boundary.
        import nftables  # type: ignore[import-untyped]

        self._nft = nftables.Nftables()
        self._nft.set_json_output(True)
        self._nft.set_handle_output(False)

    def _cmd(self, text: str) -> tuple[int, str, str]:
        rc, out, err = self._nft.cmd(text)
        out = str(out)
        if len(text) + len(out) >= BIG_RUN_BYTES:
            trim = _malloc_trim()
            if trim is not None:
                trim(0)
        return int(rc), out, str(err)

    def run(self, commands: Sequence[dict[str, Any]]) -> None:
        if not commands:
            return
        text = json.dumps({"nftables": list(commands)}, separators=(",", ":"))
        rc, _out, err = self._cmd(text)
        if rc != 0:
            raise NftError(rc, err, text[:_EXCERPT])

    def run_script(self, script: str) -> None:
        self._nft.set_json_output(False)
        try:
            rc, _out, err = self._cmd(script)
        finally:
            self._nft.set_json_output(True)
        if rc != 0:
            raise NftError(rc, err, script[:_EXCERPT])

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        cmd = {"nftables": [{"list": {"table": {"family": family, "name": name}}}]}
        rc, out, err = self._cmd(json.dumps(cmd))
        if rc != 0:
            error = NftError(rc, err)
            if error.not_found:
                return None
            raise error
        objs: list[dict[str, Any]] = json.loads(out)["nftables"] if out else []
        return objs

    def list_sets(self, family: str, name: str) -> list[dict[str, Any]] | None:
        if not _has_table(self._list({"tables": {"family": family}}), name):
            return None
        return _sets_of(self._list({"sets": {"family": family, "table": name}}), name)

    def _list(self, what: dict[str, Any]) -> list[dict[str, Any]]:
        rc, out, err = self._cmd(json.dumps({"nftables": [{"list": what}]}))
        if rc != 0:
            raise NftError(rc, err)
        objs: list[dict[str, Any]] = json.loads(out)["nftables"] if out else []
        return objs


class WorkerUnavailable(Exception):
    """The transaction worker could not be started: run the transaction some other way."""


class TransactionWorker:
    """The client of one :mod:`.txworker` child: small transactions through its long-lived context.

    Started on first use, from the calling thread (so in that thread's network namespace).  A worker
    that dies mid-transaction fails that transaction with :class:`NftError` — whether the kernel took
    it is unknown, which the table's retry (re-list, then rewrite) is there for — and the next call
    starts a new one.  One that cannot start at all raises :class:`WorkerUnavailable` and is not
    tried again: the caller falls back to ``nft`` per call.
    """

    def __init__(self, argv: Sequence[str] | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._argv = list(argv) if argv is not None else [sys.executable, "-m", "felixpy.drivers.nftables.txworker"]
        self._timeout = timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.broken = False
        self.starts = 0
        self.transactions = 0       # answered by a worker (committed or refused)

    def _start(self) -> subprocess.Popen[bytes]:
        try:
            proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env={**os.environ, "LC_ALL": "C"})
        except OSError as e:
            self.broken = True
            raise WorkerUnavailable(f"cannot start {self._argv[0]}: {e}") from e
        assert proc.stdout is not None
        timed_out = not select.select([proc.stdout], [], [], self._timeout)[0]
        if timed_out:
            proc.kill()
        if proc.stdout.read(1) != READY:
            _out, err = proc.communicate()
            self.broken = True
            why = f"not ready in {self._timeout:g}s, killed" if timed_out else f"status {proc.returncode}"
            raise WorkerUnavailable(f"the nft transaction worker did not start ({why}): "
                                    f"{err.decode(errors='replace').strip()[-500:]}")
        self.starts += 1
        return proc

    def run(self, kind: bytes, text: str, excerpt: str) -> None:
        with self._lock:
            if self.broken:
                raise WorkerUnavailable("the nft transaction worker could not start before")
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            body = text.encode()
            try:
                proc.stdin.write(REQUEST.pack(kind, len(body)) + body)
                proc.stdin.flush()
                if not select.select([proc.stdout], [], [], self._timeout)[0]:
                    proc.kill()
                    raise EOFError(f"no reply in {self._timeout:g}s, killed")
                head = read_exactly(proc.stdout, REPLY.size)
                if head is None:
                    raise EOFError("no reply")
                rc, size = REPLY.unpack(head)
                err = (read_exactly(proc.stdout, size) or b"") if size else b""
                self.transactions += 1
            except (OSError, EOFError, ValueError) as e:
                said = self._reap(proc)
                raise NftError(-1, f"the nft transaction worker exited mid-transaction "
                                   f"(status {proc.returncode}): {e}; {said}", excerpt,
                               argv=self._argv) from e
        if rc != 0:
            raise NftError(rc, err.decode(errors="replace"), excerpt, argv=["libnftables", "worker"])

    def _reap(self, proc: subprocess.Popen[bytes]) -> str:
        """Close the worker's stdin (it exits), wait for it (killing one that will not) and return the
        end of what it wrote on stderr."""
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        try:
            assert proc.stderr is not None
            said = proc.stderr.read().decode(errors="replace").strip()[-500:]
            proc.stderr.close()
        except (OSError, ValueError):
            said = ""
        self._proc = None
        return said

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def close(self) -> None:
        """Stop the worker (stdin closes, it exits); a later call starts a new one."""
        with self._lock:
            if self._proc is not None:
                self._reap(self._proc)


class NftChildProcess:
    """The shim as a child process per call: the ``nft`` binary reading JSON or a script on stdin.

    Same protocol as :class:`LibNftables` (``run``, ``run_script``, ``list_table``) and the same
    all-or-nothing transactions (``nft -f`` is one batch).  Children are forked from the calling
    thread, so they act on its network namespace like libnftables does.

    With ``worker_below`` > 0, a transaction smaller than that many bytes (the steady state: churn,
    one-rule changes) goes instead to a long-lived :class:`TransactionWorker` child holding one
    libnftables context — half the time of a fresh ``nft`` — while big ones (start of day, rebuilds)
    keep a fresh ``nft`` each, whose heap dies with it.  If the worker cannot start, every
    transaction goes to ``nft`` per call (logged once).
    """

    def __init__(self, runner: CommandRunner | None = None, nft: str = "nft", *, yielding: bool = False,
                 parse_in_child: bool = False, worker_below: int = 0,
                 worker: TransactionWorker | None = None) -> None:
        if runner is None:
            from felixpy.drivers.cmdshim import SubprocessRunner

            runner = SubprocessRunner()
        self._runner = runner
        self._nft = nft
        self._yielding = yielding
        self._worker_below = worker_below
        self._worker = worker if worker is not None else (TransactionWorker() if worker_below > 0 else None)
        # Listings decoded one object at a time (nft_objects_yielding): the lister for background listings.
        self._loads: Callable[[str], list[dict[str, Any]]] = nft_objects_yielding if yielding else _whole
        # snapshot(): list and parse in a child Python (.snapshotworker), so nft's JSON never enters this
        # process (the daemon's tables); the cleanup and the worker itself list here.
        self._parse_in_child = parse_in_child

    def _call(self, args: Sequence[str], stdin: str | None, excerpt: str) -> str:
        argv = [self._nft, *args]
        res = self._runner.run(argv, stdin)
        if res.returncode != 0:
            raise NftError(res.returncode, res.stderr, excerpt, argv=argv)
        return res.stdout

    def lister(self) -> NftChildProcess:
        """A twin for a listing thread (every call is a child of its own, nothing is shared) that decodes
        its listings without holding the GIL for the whole of one."""
        return NftChildProcess(self._runner, self._nft, yielding=True, parse_in_child=self._parse_in_child)

    def snapshot(self, kind: str, family: str, name: str, ip_version: int) -> TableSnapshot | None:
        from felixpy.drivers.nftables import readback

        if not self._parse_in_child:
            objs = self.list_sets(family, name) if kind == "sets" else self.list_table(family, name)
            return None if objs is None else readback.parse_table(objs, ip_version)
        argv = [sys.executable, "-m", "felixpy.drivers.nftables.snapshotworker", kind, family, name, str(ip_version),
                self._nft]
        res = self._runner.run(argv, None)
        if res.returncode == SNAPSHOT_WORKER_NFT_FAILED:
            try:
                err = json.loads(res.stderr)
                code, stderr = int(err["returncode"]), str(err["stderr"])
            except (ValueError, KeyError, TypeError):
                code, stderr = res.returncode, res.stderr
            raise NftError(code, stderr, argv=[self._nft, "-j", "list", kind, family, name])
        if res.returncode != 0:
            raise NftError(res.returncode, res.stderr or "the listing worker failed", argv=argv)
        try:
            wire = json.loads(res.stdout)
            snap = None if wire.get("missing") else readback.snapshot_from_wire(wire)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise NftError(res.returncode, f"the listing worker printed what it should not: {e}", argv=argv) from e
        via = wire.get("via")
        if isinstance(via, str) and via.startswith("json"):
            _log.info("nftables read-back: the text listing was unreadable, the JSON listing was read instead",
                      family=family, why=via)
        return snap

    def run(self, commands: Sequence[dict[str, Any]]) -> None:
        if not commands:
            return
        text = json.dumps({"nftables": list(commands)}, separators=(",", ":"))
        if not self._in_worker(JSON, text):
            self._call(["-j", "-f", "-"], text, text[:_EXCERPT])

    def run_script(self, script: str) -> None:
        if not self._in_worker(SCRIPT, script):
            self._call(["-f", "-"], script, script[:_EXCERPT])

    def run_script_lines(self, lines: Iterable[str]) -> None:
        """:meth:`run_script` of the lines (each followed by a newline), taken as they come: a script that
        ends within the worker's size goes to it as one text; a longer one goes to a fresh ``nft`` through
        the runner a piece at a time, never joined (with a runner that takes only a text, joined)."""
        it = iter(lines)
        head: list[str] = []
        size = 0
        # Enough of the head to choose the worker and to quote the start of the script in an error.
        enough = max(self._worker_below, _EXCERPT)
        for line in it:
            head.append(line)
            size += len(line) + 1
            if size >= enough:
                break
        else:
            self.run_script("".join(line + "\n" for line in head))
            return
        excerpt = "".join(line + "\n" for line in head)[:_EXCERPT]
        rest = itertools.chain(head, it)
        argv = [self._nft, "-f", "-"]
        if takes_stdin_lines(self._runner):
            res = self._runner.run(argv, rest)
        else:
            res = self._runner.run(argv, "".join(line + "\n" for line in rest))
        if res.returncode != 0:
            raise NftError(res.returncode, res.stderr, excerpt, argv=argv)

    def _in_worker(self, kind: bytes, text: str) -> bool:
        """Run a small transaction in the worker; False when it is not for the worker (or has none)."""
        worker = self._worker
        if worker is None or worker.broken or len(text) >= self._worker_below:
            return False
        try:
            worker.run(kind, text, text[:_EXCERPT])
        except WorkerUnavailable as e:
            _log.warning("nft transaction worker unavailable; running nft per transaction", error=str(e))
            return False
        return True

    @property
    def worker(self) -> TransactionWorker | None:
        return self._worker

    def close(self) -> None:
        """Stop the transaction worker, if any (the daemon's exit closes its pipe anyway)."""
        if self._worker is not None:
            self._worker.close()

    def _listing(self, args: Sequence[str]) -> str | None:
        """nft's output for a listing of *args*; None when nft says the object does not exist."""
        try:
            return self._call(args, None, "")
        except NftError as error:
            if error.not_found:
                return None
            raise

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        out = self._listing(["-j", "list", "table", family, name])
        return None if out is None else self._loads(out)

    def list_sets(self, family: str, name: str) -> list[dict[str, Any]] | None:
        """The table's sets with their elements, without asking ``list tables`` first, which costs as much
        as a listing of every set's elements (0.5 s at the large node): nft says the table is missing
        (None) itself."""
        out = self._listing(["-j", "list", "sets", "table", family, name])
        return None if out is None else _sets_of(self._loads(out), name)

    def list_table_text(self, family: str, name: str) -> str | None:
        """``nft -t -y list table``: the table as text without set or map elements, priorities as numbers
        (:mod:`.ruletext` reads it); None when the table does not exist."""
        return self._listing(["-t", "-y", "list", "table", family, name])

    def list_maps(self, family: str, name: str) -> list[dict[str, Any]]:
        """The table's maps with their elements, one ``list map`` each: ``list maps`` would fetch every
        set's elements too (0.3 s at the large node; one map is ~25 ms).  A map gone between the two
        listings is left out, as a later listing would."""
        names = [o["map"]["name"] for o in self._loads(self._call(["-t", "-j", "list", "maps", family], None, ""))
                 if "map" in o and o["map"].get("table") == name]
        maps: list[dict[str, Any]] = []
        for map_name in names:
            out = self._listing(["-j", "list", "map", family, name, map_name])
            if out is not None:
                maps.extend(o for o in self._loads(out) if "map" in o)
        return maps


_DECODER = json.JSONDecoder()
_BLANK = " \t\r\n"


def nft_objects_yielding(out: str) -> list[dict[str, Any]]:
    """The ``nftables`` array of nft's JSON output, decoded one object at a time.

    For listings off the apply path: one ``json.loads`` of a big listing holds the GIL throughout (measured
    4 s for 27 MB, 100k rules, on the 2-vCPU VM), stalling the apply thread that the background listing
    exists to keep free; between two objects here the interpreter can switch threads.  About 1.3x the
    CPU of one ``json.loads``; anything unexpected falls back to it.
    """
    start = out.find("[", out.find('"nftables"'))
    if start < 0 or not out.lstrip().startswith("{"):
        return _whole(out)
    objs: list[dict[str, Any]] = []
    i, n = start + 1, len(out)
    decode = _DECODER.raw_decode
    try:
        while True:
            while i < n and out[i] in _BLANK:
                i += 1
            if i < n and out[i] == "]" and not objs:
                return objs
            obj, i = decode(out, i)
            objs.append(obj)
            while i < n and out[i] in _BLANK:
                i += 1
            if i < n and out[i] == "]":
                return objs
            if i >= n or out[i] != ",":
                return _whole(out)      # not what nft prints: let json.loads judge (and raise)
            i += 1
    except ValueError:
        return _whole(out)


def _whole(out: str) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = json.loads(out)["nftables"] if out.strip() else []
    return objs


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None elsewhere (musl)."""
    import ctypes

    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn
