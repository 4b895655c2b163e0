"""NftChildProcess (issue #17): the shim protocol over the ``nft`` binary, one child per call, so libnftables'
C heap for a large transaction dies with the child.  Pinned here against a scripted runner (what is run, with
what input, and how failures map); the kernel behaviour is covered by the kernel tests, which run every test on
both shims (``tests/nftables/conftest.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence

import pytest

from felixpy.drivers.cmdshim import CommandResult, stdin_text
from felixpy.drivers.nftables.shim import (NftChildProcess, NftError, NftScriptLinesShim, NftScriptShim, NftSetsShim,
                                           TransactionWorker)


class Scripted:
    def __init__(self, answer: Callable[[tuple[str, ...], str | None], CommandResult]) -> None:
        self.calls: list[tuple[tuple[str, ...], str | None]] = []
        self._answer = answer

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        self.calls.append((tuple(argv), stdin))
        return self._answer(tuple(argv), stdin)


def ok(out: str = "") -> Callable[[tuple[str, ...], str | None], CommandResult]:
    return lambda argv, _stdin: CommandResult(0, out, "", argv)


def test_protocols() -> None:
    shim = NftChildProcess(Scripted(ok()))
    assert isinstance(shim, NftScriptShim) and isinstance(shim, NftSetsShim)


def test_run_is_one_json_batch_on_stdin_and_empty_runs_nothing() -> None:
    r = Scripted(ok())
    shim = NftChildProcess(r, nft="/usr/sbin/nft")
    shim.run([])
    assert r.calls == []
    cmds = [{"add": {"table": {"family": "ip", "name": "calico"}}}, {"flush": {"chain": {"name": "x"}}}]
    shim.run(cmds)
    (argv, stdin), = r.calls
    assert argv == ("/usr/sbin/nft", "-j", "-f", "-") and json.loads(stdin or "") == {"nftables": cmds}


def test_script_goes_as_text_on_stdin() -> None:
    r = Scripted(ok())
    NftChildProcess(r).run_script("add table ip calico\n")
    assert r.calls == [(("nft", "-f", "-"), "add table ip calico\n")]


def test_refusal_raises_with_argv_and_stderr() -> None:
    r = Scripted(lambda argv, _s: CommandResult(1, "", "Error: Could not process rule: No such file or directory",
                                                argv))
    with pytest.raises(NftError) as info:
        NftChildProcess(r).run([{"add": {"rule": {}}}])
    assert info.value.not_found and "nft -j -f -" in str(info.value)


def test_list_table_missing_is_none_other_errors_raise() -> None:
    missing = Scripted(lambda argv, _s: CommandResult(1, "", "Error: No such file or directory; did you mean", argv))
    assert NftChildProcess(missing).list_table("ip", "calico") is None
    assert missing.calls == [(("nft", "-j", "list", "table", "ip", "calico"), None)]
    broken = Scripted(lambda argv, _s: CommandResult(1, "", "Error: Operation not permitted", argv))
    with pytest.raises(NftError):
        NftChildProcess(broken).list_table("ip", "calico")


def test_list_sets_keeps_only_our_tables_sets_in_one_listing() -> None:
    """One ``list sets table`` (no ``list tables`` probe: it costs a listing of every set's elements);
    nft's own "no such table" is None; another table's sets (nft 1.0.6 lists them too) are dropped."""
    sets = {"nftables": [{"metainfo": {}}, {"set": {"name": "a", "table": "calico"}},
                         {"set": {"name": "b", "table": "x"}}]}

    def answer(argv: tuple[str, ...], _stdin: str | None) -> CommandResult:
        if argv[-1] != "calico":
            return CommandResult(1, "", "Error: No such file or directory; did you mean table 'calico'?", argv)
        return CommandResult(0, json.dumps(sets), "", argv)

    r = Scripted(answer)
    assert NftChildProcess(r).list_sets("ip", "calico") == [{"set": {"name": "a", "table": "calico"}}]
    assert NftChildProcess(r).list_sets("ip", "gone") is None
    assert [argv[1:] for argv, _ in r.calls] == [("-j", "list", "sets", "table", "ip", "calico"),
                                                 ("-j", "list", "sets", "table", "ip", "gone")]


class LinesScripted(Scripted):
    """A runner that, like SubprocessRunner, takes its stdin as lines too; records what it was handed."""

    takes_stdin_lines = True

    def __init__(self, answer: Callable[[tuple[str, ...], str | None], CommandResult]) -> None:
        super().__init__(answer)
        self.handed: list[object] = []

    def run(self, argv: Sequence[str], stdin: str | Iterable[str] | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        self.handed.append(stdin)
        return super().run(argv, stdin_text(stdin), while_running=while_running)


class RecordingWorker(TransactionWorker):
    def __init__(self) -> None:
        super().__init__(["unused"])
        self.texts: list[str] = []

    def run(self, kind: bytes, text: str, excerpt: str) -> None:
        self.texts.append(text)


def test_script_lines_too_big_for_the_worker_stream_to_nft_unjoined() -> None:
    """A big script's lines reach the runner as an iterator (written to nft a piece at a time, never joined
    in the daemon); the text nft reads is the joined script."""
    r, worker = LinesScripted(ok()), RecordingWorker()
    shim = NftChildProcess(r, worker_below=1000, worker=worker)
    assert isinstance(shim, NftScriptLinesShim)
    lines = [f"add element ip calico s {{ 10.0.{i // 256}.{i % 256} }}" for i in range(500)]
    made: list[int] = []

    def gen() -> Iterator[str]:
        for i, line in enumerate(lines):
            made.append(i)
            yield line

    shim.run_script_lines(gen())
    assert worker.texts == []
    (handed,) = r.handed
    assert not isinstance(handed, str)
    assert r.calls == [(("nft", "-f", "-"), "".join(line + "\n" for line in lines))]
    assert len(made) == 500


def test_script_lines_within_the_worker_size_go_to_it_as_one_text() -> None:
    r, worker = LinesScripted(ok()), RecordingWorker()
    shim = NftChildProcess(r, worker_below=1 << 20, worker=worker)
    shim.run_script_lines(["add table ip calico", "add set ip calico s { type ipv4_addr; }"])
    assert worker.texts == ["add table ip calico\nadd set ip calico s { type ipv4_addr; }\n"] and r.calls == []


def test_script_lines_refused_raise_with_the_start_of_the_script() -> None:
    r = LinesScripted(lambda argv, _s: CommandResult(1, "", "Error: syntax error", argv))
    lines = [f"add element ip calico s {{ 10.0.{i // 256}.{i % 256} }}" for i in range(500)]
    with pytest.raises(NftError) as info:
        NftChildProcess(r).run_script_lines(iter(lines))
    script = "".join(line + "\n" for line in lines)
    assert info.value.stderr == "Error: syntax error" and info.value.stdin_excerpt == script[:2000]
    # A runner that takes only a text gets the script joined.
    plain = Scripted(ok())
    NftChildProcess(plain).run_script_lines(iter(lines))
    assert plain.calls == [(("nft", "-f", "-"), script)]
