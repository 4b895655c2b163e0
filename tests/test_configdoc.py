"""The generated config reference, the status each parameter claims, and the config warnings."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from felixpy import config, configdoc
from felixpy.config import Config

PKG = Path(config.__file__).resolve().parent
# Parameters the BPF package reads although BPF mode is not wired into the daemon (so they are ignored).
READ_ONLY_BY_UNWIRED_BPF = {"BPFLogLevel"}


def test_docs_config_md_is_up_to_date() -> None:
    assert configdoc.DOC_PATH.read_text(encoding="utf-8") == configdoc.render(), \
        "docs/config.md is stale: run `make config-doc`"


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "config.md"
    out.write_text("old\n")
    assert configdoc.main(["--check", "--output", str(out)]) == 1
    assert configdoc.main(["--output", str(out)]) == 0
    assert configdoc.main(["--check", "--output", str(out)]) == 0


def test_every_parameter_has_a_row_with_its_variable_default_and_status() -> None:
    text = configdoc.render()
    for f in dataclasses.fields(Config):
        (row,) = [line for line in text.splitlines() if line.startswith(f"| `{f.name}` |")]
        assert f"`FELIX_{f.name.upper()}`" in row
        assert f.metadata["status"] in (config.HONOURED, config.IGNORED, config.UNSUPPORTED)
        assert f"| {f.metadata['status']} |" in row
        if f.metadata["status"] != config.HONOURED:
            assert f.metadata["note"], f"{f.name}: say why it is not honoured"
    rows = {line.split(" | ")[0][3:-1]: line for line in text.splitlines() if line.startswith("| `")}
    assert rows["IptablesMarkMask"].split(" | ")[2:5] == ["32-bit mask", "`0xffff0000`", config.HONOURED]
    assert rows["ChainInsertMode"].split(" | ")[2:4] == ["one of `insert`, `append`", "`insert`"]
    assert rows["VXLANEnabled"].split(" | ")[2:4] == ["boolean or `none` (auto)", "none (auto)"]
    assert rows["FailsafeInboundHostPorts"].split(" | ")[3].startswith("`tcp:22,udp:68,")
    assert rows["BPFEnabled"].split(" | ")[4] == config.HONOURED


def _reads_outside_config() -> dict[str, set[str]]:
    """Parameter name -> files (relative to the package) that read it: an attribute ``.Name`` or the
    string ``"Name"`` (``getattr``) in code, never a comment or docstring mention."""
    names = set(config.PARAM_NAMES)
    # Derived properties in config.py: reading ``cfg.nftables_enabled`` reads NFTablesMode.
    via_property: dict[str, set[str]] = {}
    cls = next(n for n in ast.parse((PKG / "config.py").read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "Config")
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name != "replace":
            via_property[fn.name] = {a.attr for a in ast.walk(fn) if isinstance(a, ast.Attribute) and a.attr in names}
    reads: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        rel = str(path.relative_to(PKG))
        if rel in ("config.py", "configdoc.py") or "_pb2" in rel:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            hit: set[str] = set()
            if isinstance(node, ast.Attribute):
                hit = {node.attr} & names or via_property.get(node.attr, set())
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                hit = {node.value}
            for n in hit:
                reads.setdefault(n, set()).add(rel)
    return reads


def test_honoured_means_read_and_ignored_means_not_read() -> None:
    reads = _reads_outside_config()
    for f in dataclasses.fields(Config):
        status, where = f.metadata["status"], reads.get(f.name, set())
        if status in (config.HONOURED, config.UNSUPPORTED):
            assert where, f"{f.name} claims {status!r} but nothing in felixpy reads it"
        elif f.name in READ_ONLY_BY_UNWIRED_BPF:
            assert all(w.startswith("bpf/") for w in where), (f.name, where)
        else:
            assert not where, f"{f.name} claims {status!r} but {sorted(where)} read it: update its status"


# ------------------------------------------------------------------------------------------ warnings
@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    config._warned.clear()
    yield
    config._warned.clear()


def _warnings(logs: list[dict[str, object]]) -> list[str]:
    return [str(e["event"]) for e in logs if e["log_level"] == "warning"]


def test_unknown_env_var_names_the_closest_parameter() -> None:
    with capture_logs() as logs:
        config.load(environ={"FELIX_HEALTHENABLE": "true", "FELIX_TOTALLYUNRELATEDTHING": "1", "PATH": "/bin"})
    warned = _warnings(logs)
    assert any("FELIX_HEALTHENABLE" in w and "did you mean HealthEnabled?" in w for w in warned), warned
    (other,) = [w for w in warned if "TOTALLYUNRELATED" in w]
    assert "did you mean" not in other


def test_unknown_config_file_key_names_the_closest_parameter(tmp_path: Path) -> None:
    f = tmp_path / "felix.cfg"
    f.write_text("[global]\niptablesmarkmsk = 0xff000000\n")
    with capture_logs() as logs:
        c, _ = config.load(config_file=str(f), environ={})
    assert c.IptablesMarkMask == Config().IptablesMarkMask
    assert any("iptablesmarkmsk" in w and str(f) in w and "did you mean IptablesMarkMask?" in w
               for w in _warnings(logs)), logs


def test_ignored_parameter_with_a_non_default_value_warns_once() -> None:
    with capture_logs() as logs:
        config.load({"XDPEnabled": "false", "EndpointStatusPathPrefix": "/var/run/calico",
                     "CalicoVersion": "v3.30.0"}, environ={})
        config.load({"XDPEnabled": "false"}, environ={})
    warned = _warnings(logs)
    assert [w for w in warned if "XDPEnabled" in w] == [
        "XDPEnabled is set but felixpy does not implement it: no XDP acceleration of untracked deny policies"]
    assert not [w for w in warned if "EndpointStatusPathPrefix" in w or "CalicoVersion" in w]


def test_felix_process_parameters_are_silent_and_unmodelled_felix_ones_say_so() -> None:
    with capture_logs() as logs:
        config.load(environ={"FELIX_LOGSEVERITYSYS": "none", "FELIX_TYPHAK8SSERVICENAME": "calico-typha",
                             "FELIX_DATASTORETYPE": "kubernetes", "FELIX_AWSSRCDSTCHECK": "Disable"})
    warned = _warnings(logs)
    assert warned == ["FELIX_AWSSRCDSTCHECK (AWSSrcDstCheck) is a Felix parameter felixpy has no equivalent "
                      "for; ignored"], warned  # no "did you mean LogSeverityScreen?" for LogSeveritySys


def test_felix_name_lists_do_not_overlap_the_config_class() -> None:
    both = config.FELIX_PROCESS_PARAMS | config.FELIX_UNMODELLED_PARAMS
    assert not both & set(config.PARAM_NAMES)
    assert not config.FELIX_PROCESS_PARAMS & config.FELIX_UNMODELLED_PARAMS
