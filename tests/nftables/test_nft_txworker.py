"""The transaction worker (issue #17): small transactions through one long-lived libnftables context in a child.

The real worker loop (``python -m felixpy.drivers.nftables.txworker``) runs here against a stand-in
``nftables`` module put first on its ``PYTHONPATH``, which records what it was asked and can refuse, die or
fail to start on request; the kernel tests run every kernel case through the worker as well
(``tests/nftables/conftest.py``, ``nft-worker``).
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from felixpy.drivers.cmdshim import CommandResult
from felixpy.drivers.nftables import txworker
from felixpy.drivers.nftables.shim import NftChildProcess, NftError, TransactionWorker, WorkerUnavailable

REPO = Path(__file__).resolve().parents[2]

FAKE_NFTABLES = '''
import json, os, sys
LOG = os.environ["FAKE_NFT_LOG"]
if os.environ.get("FAKE_NFT_NO_START"):
    sys.stderr.write("libnftables.so.1: cannot open shared object file\\n")
    sys.exit(1)
class Nftables:
    def __init__(self):
        self.json = False
    def set_handle_output(self, on):
        pass
    def set_json_output(self, on):
        self.json = bool(on)
    def cmd(self, text):
        with open(LOG, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "json": self.json, "text": text}) + "\\n")
        if "die" in text:
            sys.stderr.write("worker: dying as asked\\n")
            os._exit(7)
        if "refuse" in text:
            return 1, "", "Error: Could not process rule: No such file or directory\\n"
        return 0, "", ""
'''


class Scripted:
    """A runner standing in for ``nft`` per call: records, always succeeds."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, ...], str | None]] = []

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        self.calls.append((tuple(argv), stdin))
        return CommandResult(0, "", "", tuple(argv))


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "nftables.py").write_text(FAKE_NFTABLES)
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(REPO)]))
    monkeypatch.setenv("FAKE_NFT_LOG", str(log))
    return log


def asked(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_small_transactions_reuse_one_worker_big_ones_run_nft(fake_env: Path) -> None:
    runner = Scripted()
    shim = NftChildProcess(runner, worker_below=100)
    try:
        shim.run_script("add table ip calico\n")
        shim.run([{"add": {"table": {"family": "ip6", "name": "calico"}}}])
        big = "add chain ip calico c\n" * 10
        shim.run_script(big)
        seen = asked(fake_env)
        assert [(r["json"], r["text"]) for r in seen] == [
            (False, "add table ip calico\n"),
            (True, json.dumps({"nftables": [{"add": {"table": {"family": "ip6", "name": "calico"}}}]},
                              separators=(",", ":")))]
        assert len({r["pid"] for r in seen}) == 1                 # one long-lived context
        assert runner.calls == [(("nft", "-f", "-"), big)]          # the big one: a fresh nft, heap and all
    finally:
        shim.close()


def test_refusal_is_nft_error_and_the_worker_stays(fake_env: Path) -> None:
    shim = NftChildProcess(Scripted(), worker_below=1 << 20)
    try:
        with pytest.raises(NftError) as info:
            shim.run_script("add rule ip calico refuse accept\n")
        assert info.value.not_found and "refuse" in info.value.stdin_excerpt
        shim.run_script("add table ip calico\n")
        assert len({r["pid"] for r in asked(fake_env)}) == 1
    finally:
        shim.close()


def test_death_mid_transaction_fails_it_and_the_next_call_starts_a_new_worker(fake_env: Path) -> None:
    runner = Scripted()
    worker = TransactionWorker()
    shim = NftChildProcess(runner, worker_below=1 << 20, worker=worker)
    try:
        with pytest.raises(NftError) as info:
            shim.run_script("add table ip die\n")
        assert "exited mid-transaction" in info.value.stderr and "dying as asked" in info.value.stderr
        shim.run_script("add table ip calico\n")                   # a new worker takes it
        assert worker.starts == 2
        assert len({r["pid"] for r in asked(fake_env)}) == 2
        assert runner.calls == []                                   # never silently re-run elsewhere
    finally:
        shim.close()


def test_a_worker_killed_between_transactions_is_replaced(fake_env: Path) -> None:
    worker = TransactionWorker()
    shim = NftChildProcess(Scripted(), worker_below=1 << 20, worker=worker)
    try:
        shim.run_script("add table ip calico\n")
        pid = worker.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        # Either noticed before the send (restart, transaction runs) or during it (fails, next one runs).
        try:
            shim.run_script("add chain ip calico a\n")
        except NftError:
            shim.run_script("add chain ip calico a\n")
        assert worker.starts == 2 and worker.pid != pid
        assert asked(fake_env)[-1]["text"] == "add chain ip calico a\n"
    finally:
        shim.close()


def test_a_worker_that_cannot_start_leaves_nft_per_call(fake_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NFT_NO_START", "1")
    runner = Scripted()
    worker = TransactionWorker()
    shim = NftChildProcess(runner, worker_below=1 << 20, worker=worker)
    shim.run_script("add table ip calico\n")
    shim.run_script("add chain ip calico a\n")
    assert worker.broken and worker.starts == 0
    assert [argv for argv, _ in runner.calls] == [("nft", "-f", "-"), ("nft", "-f", "-")]
    with pytest.raises(WorkerUnavailable, match="could not start"):
        worker.run(txworker.SCRIPT, "x", "x")


def test_start_failure_names_the_cause(fake_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NFT_NO_START", "1")
    with pytest.raises(WorkerUnavailable, match="cannot open shared object"):
        TransactionWorker().run(txworker.SCRIPT, "add table ip calico\n", "")
    with pytest.raises(WorkerUnavailable, match="cannot start"):
        TransactionWorker(["/nonexistent/python"]).run(txworker.SCRIPT, "x", "")


def test_no_worker_by_default_and_listers_never_write_through_one() -> None:
    runner = Scripted()
    shim = NftChildProcess(runner)
    shim.run_script("add table ip calico\n")
    assert runner.calls == [(("nft", "-f", "-"), "add table ip calico\n")]
    assert NftChildProcess(runner, worker_below=1 << 20).lister().worker is None


def _request(kind: bytes, text: str) -> bytes:
    body = text.encode()
    return txworker.REQUEST.pack(kind, len(body)) + body


def _replies(out: bytes) -> list[tuple[int, str]]:
    assert out[:1] == txworker.READY
    got, i = [], 1
    while i < len(out):
        rc, n = txworker.REPLY.unpack_from(out, i)
        i += txworker.REPLY.size
        got.append((rc, out[i:i + n].decode()))
        i += n
    return got


class _InProcessNft:
    def __init__(self) -> None:
        self.seen: list[tuple[bool, str]] = []
        self.json = False

    def set_handle_output(self, on: bool) -> None:
        pass

    def set_json_output(self, on: bool) -> None:
        self.json = on

    def cmd(self, text: str) -> tuple[int, str, str]:
        self.seen.append((self.json, text))
        return (1, "", "Error: nope\n") if "refuse" in text else (0, "", "")


def test_serve_answers_each_request_and_ends_at_eof(monkeypatch: pytest.MonkeyPatch) -> None:
    nft = _InProcessNft()
    monkeypatch.setitem(sys.modules, "nftables", type(sys)("nftables"))
    sys.modules["nftables"].Nftables = lambda: nft  # type: ignore[attr-defined]
    stdin = io.BytesIO(_request(b"S", "add table ip calico\n") + _request(b"J", '{"nftables":[]}')
                       + _request(b"S", "refuse\n"))
    stdout = io.BytesIO()
    assert txworker.serve(stdin, stdout) == 0
    assert _replies(stdout.getvalue()) == [(0, ""), (0, ""), (1, "Error: nope\n")]
    assert nft.seen == [(False, "add table ip calico\n"), (True, '{"nftables":[]}'), (False, "refuse\n")]


def test_serve_rejects_a_torn_or_unknown_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nftables", type(sys)("nftables"))
    sys.modules["nftables"].Nftables = _InProcessNft  # type: ignore[attr-defined]
    assert txworker.serve(io.BytesIO(_request(b"X", "add table ip calico\n")), io.BytesIO()) == 2
    with pytest.raises(EOFError):
        txworker.serve(io.BytesIO(struct.pack(">cQ", b"S", 100) + b"short"), io.BytesIO())
