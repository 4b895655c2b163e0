from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from felixpy import __version__, logs
from felixpy.cli import _parser, main
from felixpy.feed.protofill import ScenarioError
from felixpy.feed.framing import read_recording
from felixpy.feed.scenario import bundled_scenario_path, load_scenario
from felixpy.testing.daemon import REPO, start_daemon


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("felixpy ")


def test_help_lists_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "felixpy", "--help"], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    for cmd in ("run", "feed", "replay", "demo", "version"):
        assert cmd in out


def test_feed_record_writes_a_replayable_framed_stream(tmp_path: Path) -> None:
    out = tmp_path / "demo.bin"
    assert main(["feed", "demo", "--record", str(out)]) == 0
    recorded = list(read_recording(out))
    expected = list(load_scenario(bundled_scenario_path()).all_messages())
    assert recorded == expected
    assert recorded[0].HasField("config_update")
    assert any(m.HasField("in_sync") for m in recorded)


def test_driver_entry_point_refuses_without_felix_fds() -> None:
    script = "import sys; from felixpy.cli import driver_main; sys.exit(driver_main())"
    # Close fds 3 and 4 explicitly so the check sees them missing.
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          close_fds=True)
    assert proc.returncode == 2 and "fd 3" in proc.stderr


@pytest.mark.kernel
def test_replay_of_a_recording_reaches_in_sync(netns: str, tmp_path: Path) -> None:
    rec = tmp_path / "demo.bin"
    assert main(["feed", "demo", "--record", str(rec)]) == 0
    d = start_daemon(netns, env={"FELIX_IPTABLESBACKEND": "legacy"})
    try:
        proc = subprocess.run([sys.executable, "-m", "felixpy", "replay", str(rec), "--to", d.target,
                               "--hold", "2"], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "dataplane_in_sync" in proc.stdout
    finally:
        d.stop()


def test_logs_are_json_when_not_a_terminal() -> None:
    buf = io.StringIO()
    logs.configure("INFO", stream=buf)
    structlog.get_logger("t").info("hello", table="filter", ip_version=4)
    structlog.get_logger("t").debug("hidden")
    line = json.loads(buf.getvalue().strip())
    assert line["event"] == "hello" and line["table"] == "filter" and line["level"] == "info"
    assert "hidden" not in buf.getvalue()


def test_console_format_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    buf = Tty()
    logs.configure("DEBUG", stream=buf)
    structlog.get_logger("t").debug("shown", chain="cali-x")
    text = buf.getvalue()
    assert "shown" in text and "chain=cali-x" in text and not text.startswith("{")


# ------------------------------------------------------------------------------ errors a person can act on
def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "felixpy", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60, env=env)


def _one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_dash_dash_version() -> None:
    proc = _cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"felixpy {__version__}"


def test_every_flag_has_help_text() -> None:
    def walk(p: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from ((f"{name} {n}", x) for n, x in walk(sub))
            else:
                yield ("/".join(a.option_strings) or a.dest, a)

    actions = list(walk(_parser()))
    assert len(actions) > 20
    for name, action in actions:
        assert action.help and action.help != argparse.SUPPRESS, f"{name} has no help text"


def test_run_help_documents_exit_codes() -> None:
    out = _cli("run", "--help").stdout
    for code, meaning in (("0", "clean stop"), ("1", "fatal"), ("2", "usage or input error"),
                          ("129", "restart")):
        assert re.search(rf"^\s+{code}\s+.*{meaning}", out, re.M), (code, out)


def test_feed_with_nowhere_to_send_is_an_error() -> None:
    _one_line_error(_cli("feed", "demo"), 2, "felixpy feed: nothing to do", "--to", "--record")


def test_feed_check_validates_without_sending(tmp_path: Path) -> None:
    proc = _cli("feed", "demo", "--check", "--to", f"unix:{tmp_path / 'nobody-listens.sock'}")
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout and "sent" not in proc.stdout


def test_feed_check_reports_bad_config_values_and_typos(tmp_path: Path) -> None:
    sc = tmp_path / "bad.yaml"
    sc.write_text("config:\n  ChainInsertMode: sideways\n  HealthEnable: 'true'\n")
    proc = _cli("feed", str(sc), "--check")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"{sc}: config.ChainInsertMode: 'sideways': must be one of insert, append",
        f"{sc}: config.HealthEnable: unknown parameter; did you mean HealthEnabled?"]


def test_bad_scenario_keeps_its_message_without_a_traceback(tmp_path: Path) -> None:
    sc = tmp_path / "broken.yaml"
    sc.write_text("policies: [\n")
    line = _one_line_error(_cli("feed", str(sc), "--record", str(tmp_path / "x.bin")), 2, "felixpy feed: ")
    assert line == f"felixpy feed: {_scenario_error(sc)}"
    _one_line_error(_cli("feed", str(tmp_path / "missing.yaml"), "--check"), 2, "missing.yaml",
                    "No such file or directory")


def _scenario_error(path: Path) -> str:
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    return str(exc.value)


@pytest.mark.parametrize("args, needles", [
    (("run", "--listen", "tcp:1.2.3.4"), ("bad --listen", "unix:PATH")),
    (("feed", "demo", "--to", "nonsense"), ("unknown feed target",)),
    (("replay", "/nonexistent.bin", "--to", "unix:/tmp/x.sock"), ("cannot read recording", "/nonexistent.bin")),
    (("run", "--driver", "--bogus-flag"), ("unrecognized arguments",)),
])
def test_usage_and_input_errors_exit_2_in_one_line(args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    proc = _cli(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert all(n in proc.stderr for n in needles), proc.stderr


def test_malformed_config_file_exits_2_naming_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "felix.cfg"
    cfg.write_text("Ipv6Support = false\n")
    _one_line_error(_cli("run", "--listen", f"unix:{tmp_path / 's.sock'}", "--config-file", str(cfg),
                         "--status-socket", ""), 2, "felixpy run: ", f"{cfg}:1", "[global]")


def test_runtime_oserror_is_one_line_exit_1(tmp_path: Path) -> None:
    _one_line_error(_cli("feed", "demo", "--to", f"unix:{tmp_path / 'none.sock'}"), 1,
                    "felixpy feed: cannot connect to unix:", "No such file or directory")
