"""The shared command runner (felixpy/drivers/cmdshim.py) against real commands.

Plain tests run harmless binaries (``true``, ``false``, ``cat``, ``sh``,
``sleep``) in the test's own namespace and write nothing outside ``tmp_path``.
Everything that changes the network runs inside a throwaway namespace from the
``netns`` fixture; the root namespace is only read.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from felixpy.drivers.cmdshim import (
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_TIMED_OUT,
    BinaryLocator,
    CommandResult,
    CommandRunner,
    SubprocessRunner,
    run_output,
)
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.errors import CommandError
from felixpy.testing.netns import run_in

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root")


def _thread_netns() -> int:
    return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino


def _stub(directory: Path, name: str, script: str, executable: bool = True) -> Path:
    path = directory / name
    path.write_text(script)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# ------------------------------------------------------------------------------ exit codes
def test_true_and_false() -> None:
    r = SubprocessRunner()
    ok = r.run(["true"])
    assert ok == CommandResult(0, "", "", ("true",))
    assert ok.ok and not ok.timed_out and ok.check() is ok
    bad = r.run(["false"])
    assert bad.returncode == 1 and not bad.ok
    with pytest.raises(CommandError) as exc:
        bad.check(stdin_excerpt="line 1")
    assert exc.value.argv == ["false"] and exc.value.returncode == 1 and exc.value.stdin_excerpt == "line 1"


def test_outputs_and_exit_status_are_the_commands() -> None:
    res = SubprocessRunner().run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")


def test_death_by_signal_is_negative() -> None:
    assert SubprocessRunner().run(["sh", "-c", "kill -TERM $$"]).returncode == -15


def test_missing_binary_is_127_not_an_exception() -> None:
    res = SubprocessRunner().run(["felixpy-no-such-binary", "--version"])
    assert res.returncode == EXIT_NOT_FOUND
    assert res.stderr.startswith("felixpy-no-such-binary: ")
    assert res.argv == ("felixpy-no-such-binary", "--version")


def test_non_executable_binary_is_126(tmp_path: Path) -> None:
    path = _stub(tmp_path, "noexec", "#!/bin/sh\nexit 0\n", executable=False)
    assert SubprocessRunner().run([str(path)]).returncode == EXIT_NOT_EXECUTABLE


def test_empty_argv_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        SubprocessRunner().run([])


def test_timeout_kills_the_command_and_has_its_own_code() -> None:
    start = time.monotonic()
    res = SubprocessRunner(timeout=0.2).run(["sleep", "30"])
    assert time.monotonic() - start < 10
    assert res.returncode == EXIT_TIMED_OUT and res.timed_out
    assert "timed out after 0.2s" in res.stderr


def test_without_pidfds_the_wait_still_reaps_and_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels before 5.3 have no pidfd: the runner falls back to Popen's own (polling) wait."""
    def no_pidfd(_pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    res = SubprocessRunner().run(["sh", "-c", "echo out; exit 4"])
    assert (res.returncode, res.stdout) == (4, "out\n")
    assert SubprocessRunner(timeout=0.2).run(["sleep", "30"]).returncode == EXIT_TIMED_OUT


# ------------------------------------------------------------------------------ stdin
def test_stdin_is_fed_whole() -> None:
    text = "".join(f"add cali40s:x 10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255} # ü\n" for i in range(200_000))
    res = SubprocessRunner().run(["cat"], text)
    assert res.ok and res.stdout == text  # several MiB, nothing lost or re-encoded


def test_a_stdin_of_many_pieces_arrives_whole_and_in_order() -> None:
    """The input is encoded a piece (``_STDIN_PIECE`` characters) at a time; characters of two and four bytes
    straddle the pieces' boundaries (a piece boundary counts characters, never bytes)."""
    from felixpy.drivers import cmdshim

    unit = "ab\u00e9\U0001f600\n"  # 1 + 1 + 2 + 4 + 1 bytes
    text = unit * (2 * cmdshim._STDIN_PIECE // len(unit) + 7)
    res = SubprocessRunner().run(["cat"], stdin=text)
    assert res.ok and res.stdout == text


def test_stdin_as_lines_reads_as_their_text() -> None:
    """The real runner also takes stdin as lines, each followed by a newline, written a piece at a time."""
    from felixpy.drivers import cmdshim

    runner = SubprocessRunner()
    assert cmdshim.takes_stdin_lines(runner) and not cmdshim.takes_stdin_lines(object())
    lines = [f"-A cali-x -m comment --comment \"cali:{i:016d}\" -j ACCEPT \u00e9" for i in range(3 * cmdshim._STDIN_LINES + 5)]
    res = runner.run(["cat"], lines)
    assert res.ok and res.stdout == cmdshim.stdin_text(lines) == "".join(ln + "\n" for ln in lines)
    assert runner.run(["cat"], []).stdout == ""


def test_long_lines_are_written_a_bounded_piece_at_a_time() -> None:
    """Lines are joined into pieces of at most ``_STDIN_PIECE`` characters (plus one line), however few lines
    that is: an nft script's set line holds a whole set's members, and a start of day's 8,192 of them
    joined at once would hold its ~3 MB script twice (issue #17)."""
    from felixpy.drivers import cmdshim

    lines = (f"set s{i} {{ " + ", ".join(f"10.0.{j >> 8}.{j & 255}" for j in range(200)) + " }" for i in range(1005))
    pieces = list(cmdshim._stdin_pieces(lines))
    longest = max(len(p) for p in pieces)
    assert len(pieces) >= 8 and longest < cmdshim._STDIN_PIECE + 4000   # ~2.4 MB: not one piece
    text = "".join(pieces)
    assert text.count("\n") == 1005 and text.startswith("set s0 { 10.0.0.0, ") and text.endswith("10.0.0.199 }\n")
    res = SubprocessRunner().run(["cat"], (p.removesuffix("\n") for p in text.splitlines(keepends=True)))
    assert res.ok and res.stdout == text


def test_without_stdin_the_child_reads_dev_null() -> None:
    # Never the daemon's own stdin: cat must see EOF at once.
    res = SubprocessRunner(timeout=10).run(["cat"])
    assert res.ok and res.stdout == ""
    assert SubprocessRunner().run(["cat"], "").stdout == ""


# ------------------------------------------------------------------------------ outputs
def test_the_child_never_waits_for_us_to_read_its_output(tmp_path: Path) -> None:
    """Outputs go to files, not pipes: a child writing far more than a pipe holds (64 KiB) finishes
    while the caller is still busy in ``while_running`` and has read nothing.  With a pipe the child
    would block on its first full buffer and the hook below would wait for it in vain."""
    done = tmp_path / "done"
    script = 'yes 0123456789abcdef | head -c 4000000; echo tail; echo err >&2; touch "$1"'
    seen: list[bool] = []

    def hook() -> None:
        deadline = time.monotonic() + 30
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(done.exists())

    res = SubprocessRunner(timeout=60).run(["sh", "-c", script, "sh", str(done)], while_running=hook)
    assert seen == [True]
    assert res.ok and len(res.stdout) == 4_000_005 and res.stdout.endswith("tail\n") and res.stderr == "err\n"


def test_a_background_grandchild_holding_the_output_does_not_hold_the_result() -> None:
    """The result is the command's once it exited; with pipes the caller waited for every holder of the
    write end (here a ``sleep`` left behind) and timed out."""
    res = SubprocessRunner(timeout=5).run(["sh", "-c", "sleep 30 & echo $!; echo done"])
    pid = int(res.stdout.split()[0])
    try:
        assert res.ok and res.stdout.endswith("done\n")
    finally:
        os.kill(pid, 15)


def test_outputs_decode_as_text_mode_did() -> None:
    """UTF-8, universal newlines; an undecodable byte is replaced, never an exception."""
    res = SubprocessRunner().run(["printf", "a\\r\\nb\\rc\\n\\303\\274 \\377\\n"])
    assert res.ok and res.stdout == "a\nb\nc\n\u00fc \ufffd\n"


# ------------------------------------------------------------------------------ kept outputs
def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("size", [1, 7, 16, 64, 1 << 20])
def test_a_kept_output_is_read_in_pieces_of_whole_records(size: int) -> None:
    """Pieces end just before a line that begins a record, a cut may straddle two reads, a record longer
    than a piece is one piece of its own, and together they are the output, decoded as :meth:`run` does."""
    text = ("junk\ncreate a x\nadd a 1\r\ncreate b y\n" + "".join(f"add b {i}\n" for i in range(40))
            + "create c z\nadd c \u00fc create d\n")
    fds = _open_fds()
    with SubprocessRunner().run_output(["printf", "%s", text]) as out:
        assert out.result.ok and out.result.stdout == ""
        pieces = list(out.pieces(b"create ", size))
        again = list(out.pieces(b"create ", size))  # the file is read, not consumed
    assert _open_fds() == fds  # closed with the with-block
    whole = text.replace("\r\n", "\n")
    assert "".join(pieces) == whole and again == pieces
    assert all(p.endswith("\n") for p in pieces)
    assert all(p.startswith("create ") for p in pieces[1:])
    # Each piece is whole records: no record's lines are in two pieces.
    assert all(sum(line.startswith("create ") for line in p.splitlines()) >= 1 for p in pieces[1:])
    if size == 1 << 20:  # all in one read: cut before its last record only
        assert pieces == [whole[:whole.index("create c")], whole[whole.index("create c"):]]
    if size <= 16:
        assert [p.split(" ", 2)[1] for p in pieces[1:]] == ["a", "b", "c"]  # b's 40 lines: one piece


def test_a_kept_output_reads_whole_as_run_does_and_failures_keep_no_file() -> None:
    fds = _open_fds()
    with SubprocessRunner().run_output(["printf", "a\\r\\nb"]) as out:
        assert out.read_all() == SubprocessRunner().run(["printf", "a\\r\\nb"])
    missing = SubprocessRunner().run_output(["/nonexistent/binary"])
    assert missing.result.returncode == EXIT_NOT_FOUND and list(missing.pieces(b"x")) == []
    missing.close()
    assert _open_fds() == fds


def test_run_output_of_a_runner_that_cannot_keep_it_gives_its_text() -> None:
    fake = FakeIPSet()
    fake.add_set("cali40s:a", "hash:ip", "inet")
    out = run_output(fake, ["ipset", "save"])
    assert out.result.ok and list(out.pieces(b"create ")) == [out.result.stdout]
    assert out.result.stdout.startswith("create cali40s:a hash:ip")
    out.close()


# ------------------------------------------------------------------------------ followed outputs
def test_a_followed_output_is_handed_out_while_the_child_still_runs(tmp_path: Path) -> None:
    """The child writes a first part, then waits for a file that only the reader of that first part
    creates: the command can only end if its output was read before it exited."""
    flag = tmp_path / "flag"
    script = ('yes 0123456789abcdef | head -c 300000; '
              'i=0; while [ ! -e "$1" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; echo tail')
    fds = _open_fds()
    seen_before_flag: list[str] = []
    with SubprocessRunner(timeout=60).follow(["sh", "-c", script, "sh", str(flag)]) as running:
        pieces = []
        for piece in running.pieces(64 << 10):
            if not flag.exists():
                seen_before_flag.append(piece)
                flag.touch()
            pieces.append(piece)
        res = running.result()
    assert _open_fds() == fds
    assert res == CommandResult(0, "", "", ("sh", "-c", script, "sh", str(flag)))
    assert seen_before_flag and "tail" not in seen_before_flag[0]
    assert "".join(pieces) == "0123456789abcdef\n" * (300000 // 17) + "0123456789abcdef\n"[:300000 % 17] + "tail\n"
    assert all(p.endswith("\n") for p in pieces)


@pytest.mark.parametrize("size", [1, 5, 64, 1 << 20])
def test_a_followed_output_joins_to_what_run_gives(size: int) -> None:
    """Pieces of whole lines, decoded as :meth:`run` decodes (universal newlines, U+FFFD), a line longer
    than a piece kept whole, and an unterminated last line handed out at the end."""
    fmt = "a\\r\\nb\\rc\\n\\303\\274 \\377\\n" + "x" * 40 + "\\n" + "last"
    argv = ["sh", "-c", f"printf '{fmt}'; sleep 0.05; printf ' more\\nend'"]
    whole = SubprocessRunner().run(argv)
    with SubprocessRunner().follow(argv) as running:
        pieces = list(running.pieces(size))
        assert running.result() == replace(whole, stdout="")
    assert "".join(pieces) == whole.stdout == "a\nb\nc\n\u00fc \ufffd\n" + "x" * 40 + "\nlast more\nend"
    assert all(p.endswith("\n") for p in pieces[:-1])


def test_a_followed_command_that_fails_times_out_or_cannot_start() -> None:
    with SubprocessRunner().follow(["sh", "-c", "echo part; echo oops >&2; exit 3"]) as running:
        assert "".join(running.pieces()) == "part\n"
        res = running.result()
    assert (res.returncode, res.stderr) == (3, "oops\n")
    with SubprocessRunner(timeout=0.3).follow(["sh", "-c", "echo first; exec sleep 30"]) as running:
        t0 = time.monotonic()
        # Killed at the timeout: the pieces end there, and the 6 bytes written (less than a piece) never came.
        assert "".join(running.pieces()) == ""
        assert running.result().returncode == EXIT_TIMED_OUT and time.monotonic() - t0 < 5
    with SubprocessRunner().follow(["/nonexistent/binary"]) as running:
        assert list(running.pieces()) == [] and running.result().returncode == EXIT_NOT_FOUND


def test_closing_a_followed_command_kills_it_and_keeps_no_file() -> None:
    fds = _open_fds()
    running = SubprocessRunner(timeout=60).follow(["sleep", "30"])
    pid = running._proc.pid  # type: ignore[union-attr]
    t0 = time.monotonic()
    running.close()
    assert time.monotonic() - t0 < 5 and running.result().returncode == -9  # killed: death by SIGKILL
    assert _open_fds() == fds
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    # One that already ended keeps its own result, read before its files go.
    ended = SubprocessRunner().follow(["sh", "-c", "echo bye >&2; exit 5"])
    assert "".join(ended.pieces()) == ""
    ended.close()
    assert (ended.result().returncode, ended.result().stderr) == (5, "bye\n") and _open_fds() == fds


# ------------------------------------------------------------------------------ while_running
def test_while_running_overlaps_the_command(tmp_path: Path) -> None:
    """The child waits for a file only the hook creates: it can only finish if the hook runs meanwhile."""
    flag = tmp_path / "flag"
    calls: list[int] = []

    def hook() -> None:
        calls.append(1)
        flag.touch()

    script = 'while [ ! -e "$1" ]; do sleep 0.01; done; cat'
    res = SubprocessRunner(timeout=20).run(["sh", "-c", script, "sh", str(flag)], "input\n", while_running=hook)
    assert calls == [1]
    assert res.ok and res.stdout == "input\n"


def test_while_running_failure_kills_the_command() -> None:
    def hook() -> None:
        raise RuntimeError("bookkeeping failed")

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="bookkeeping failed"):
        SubprocessRunner(timeout=60).run(["sleep", "30"], while_running=hook)
    assert time.monotonic() - start < 10


def test_while_running_not_called_when_the_command_cannot_start() -> None:
    calls: list[int] = []
    res = SubprocessRunner().run(["felixpy-no-such-binary"], while_running=lambda: calls.append(1))
    assert res.returncode == EXIT_NOT_FOUND and calls == []


# ------------------------------------------------------------------------------ environment
def test_env_override_and_c_locale() -> None:
    env = {"PATH": os.environ["PATH"], "FELIXPY_X": "bar", "LC_ALL": "de_DE.UTF-8"}
    res = SubprocessRunner(env=env).run(["sh", "-c", 'echo "$FELIXPY_X $LC_ALL ${HOME:-nohome}"'])
    assert res.stdout == "bar C nohome\n"  # replaced, not merged; LC_ALL=C always wins


def test_default_env_is_this_process_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    r = SubprocessRunner()
    monkeypatch.setenv("FELIXPY_LATE", "yes")
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    assert r.run(["sh", "-c", 'echo "$FELIXPY_LATE $LC_ALL"']).stdout == "yes C\n"


def test_which_and_run_use_the_childrens_path(tmp_path: Path) -> None:
    _stub(tmp_path, "iptables-legacy-restore", "#!/bin/sh\necho stub >&2\nexit 1\n")
    r = SubprocessRunner(env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert r.which("iptables-legacy-restore") == str(tmp_path / "iptables-legacy-restore")
    assert r.which("felixpy-no-such-binary") is None
    assert r.run(["iptables-legacy-restore"]).stderr == "stub\n"
    assert SubprocessRunner(env={"PATH": str(tmp_path)}).which("sh") is None
    assert SubprocessRunner().which("sh") == shutil.which("sh")


# ------------------------------------------------------------------------------ the protocol
def test_real_runner_and_fakes_share_the_protocol() -> None:
    runners: list[CommandRunner] = [SubprocessRunner(), FakeIptables(), FakeIPSet()]
    for r in runners:
        assert isinstance(r, CommandRunner)
    assert isinstance(SubprocessRunner(), BinaryLocator) and isinstance(FakeIptables(), BinaryLocator)
    # Both fakes honour the hook, after the (atomic) command.
    for fake, argv in ((FakeIptables(), ["iptables-legacy-save"]), (FakeIPSet(), ["ipset", "list", "-name"])):
        calls: list[int] = []
        assert fake.run(argv, while_running=lambda: calls.append(1)).ok and calls == [1]


# ------------------------------------------------------------------------------ namespaces
@pytest.mark.kernel
@needs_root
def test_runs_inside_a_named_namespace_and_returns_home(netns: str) -> None:
    home = _thread_netns()
    r = SubprocessRunner(netns=netns)
    # A write inside the throwaway namespace only.
    assert r.run(["ip", "link", "add", "fpyshim0", "type", "veth", "peer", "name", "fpyshim1"]).ok
    assert _thread_netns() == home
    assert "fpyshim0" in run_in(netns, "ip", "-o", "link", "show").stdout
    assert "fpyshim0" not in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    # stdin and the hook work there too (ip -batch reads stdin).
    calls: list[int] = []
    res = r.run(["ip", "-batch", "-"], "link set fpyshim0 up\nlink set fpyshim0 mtu 1400\n",
                while_running=lambda: calls.append(_thread_netns()))
    assert res.ok, res.stderr
    assert calls == [home]  # the hook runs back in our own namespace
    assert "mtu 1400" in r.run(["ip", "-o", "link", "show", "fpyshim0"]).stdout
    assert _thread_netns() == home


@pytest.mark.kernel
@needs_root
def test_missing_namespace_is_127_and_never_falls_back() -> None:
    home = _thread_netns()
    res = SubprocessRunner(netns="fpy-no-such-ns").run(["true"])
    assert res.returncode == EXIT_NOT_FOUND and "no such network namespace" in res.stderr
    assert _thread_netns() == home
