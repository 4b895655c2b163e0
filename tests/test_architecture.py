"""House rules that are cheap to check mechanically."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "felixpy"
KERNEL_MODULES = {"subprocess", "pyroute2", "bcc", "nftables", "ctypes"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_managers_and_rules_never_import_kernel_access() -> None:
    """Managers compute and rules render; only drivers reach the kernel (style rule 1)."""
    offenders = {}
    for folder in ("managers", "rules"):
        for path in sorted((PKG / folder).glob("*.py")):
            bad = _imports(path) & KERNEL_MODULES
            if bad:
                offenders[str(path.relative_to(PKG))] = sorted(bad)
    assert offenders == {}


def test_every_driver_module_says_how_it_recognises_its_objects() -> None:
    """Each driver package documents ownership after a restart (the mark-and-sweep question)."""
    missing = []
    for pkg in ("iptables", "nftables", "ipsets", "routetable", "routerule", "vxlanfdb", "procsys"):
        init = PKG / "drivers" / pkg / "__init__.py"
        texts = [init.read_text()] + [p.read_text() for p in (PKG / "drivers" / pkg).glob("*.py")]
        doc = "\n".join(texts).lower()
        if not any(w in doc for w in ("restart", "recognis", "ours")):
            missing.append(pkg)
    assert missing == []
