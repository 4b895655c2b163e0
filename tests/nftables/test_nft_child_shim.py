"""NftChildProcess (issue #17): the shim protocol over the ``nft`` binary, one child per call, so libnftables'
C heap for a large transaction dies with the child.  Pinned here against a scripted runner (what is run, with
what input, and how failures map); the kernel behaviour is covered by the kernel tests, which run every test on
both shims (``tests/nftables/conftest.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import pytest

from felixpy.drivers.cmdshim import CommandResult
from felixpy.drivers.nftables.shim import NftChildProcess, NftError, NftScriptShim, NftSetsShim


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


def test_list_sets_keeps_only_our_tables_sets() -> None:
    tables = {"nftables": [{"table": {"family": "ip", "name": "calico"}}, {"table": {"family": "ip", "name": "x"}}]}
    sets = {"nftables": [{"metainfo": {}}, {"set": {"name": "a", "table": "calico"}},
                         {"set": {"name": "b", "table": "x"}}]}

    def answer(argv: tuple[str, ...], _stdin: str | None) -> CommandResult:
        return CommandResult(0, json.dumps(tables if "tables" in argv else sets), "", argv)

    r = Scripted(answer)
    assert NftChildProcess(r).list_sets("ip", "calico") == [{"set": {"name": "a", "table": "calico"}}]
    assert NftChildProcess(r).list_sets("ip", "gone") is None
