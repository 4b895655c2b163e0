from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from felixpy import logs
from felixpy.cli import main
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
