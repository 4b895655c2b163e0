"""House rules that are cheap to check mechanically, from the code's own imports and docstrings.

The import graph: a module's edges are the modules it names in ``import`` /
``from … import`` statements anywhere in it (function-level imports included),
resolved to modules of the ``felixpy`` package (``from a.b import c`` is an
edge to ``a.b``, and to ``a.b.c`` when that is a module).  A package's
``__init__`` is only an edge where it is named itself: naming a driver's
``api`` module depends on that contract, not on the implementation its
package also exports.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "felixpy"

# Kernel access, directly or through the project's own shims.
FORBIDDEN_THIRD_PARTY = {"subprocess", "pyroute2", "ctypes", "bcc", "nftables"}
FORBIDDEN_PREFIXES = ("felixpy.drivers.netlink", "felixpy.drivers.cmdshim", "felixpy.drivers.procsys")
# Frozen values that live beside a shim but touch nothing (checked below: they reach nothing forbidden).
VALUE_MODULES = {"felixpy.drivers.netlink.types", "felixpy.drivers.netlink.errors"}
CONTRACT_MODULE = re.compile(r"^felixpy\.drivers\.[a-z_]+\.api$")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py") if "proto" not in p.relative_to(PKG).parts[:1]}


MODULES = _modules()


def _resolve(current: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".") if is_pkg else current.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


@cache
def imports_of(module: str) -> frozenset[str]:
    """Every module *module* names (felixpy modules, and third-party top-level names)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.add(a.name if a.name.startswith("felixpy") else a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path.name == "__init__.py", node)
            if not target.startswith("felixpy"):
                out.add(target.split(".")[0])
                continue
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES)
    return frozenset(m for m in out if m in MODULES or not m.startswith("felixpy"))


def reach(module: str) -> dict[str, list[str]]:
    """Every module reachable from *module*, with one import chain that reaches it."""
    chains: dict[str, list[str]] = {module: [module]}
    todo = [module]
    while todo:
        m = todo.pop()
        if m not in MODULES:
            continue
        for dep in sorted(imports_of(m)):
            if dep not in chains:
                chains[dep] = [*chains[m], dep]
                todo.append(dep)
    return chains


def _forbidden(name: str) -> bool:
    if name in VALUE_MODULES or CONTRACT_MODULE.match(name):
        return False
    return name in FORBIDDEN_THIRD_PARTY or name.startswith(FORBIDDEN_PREFIXES)


def _layer(folder: str) -> Iterator[str]:
    return (m for m in sorted(MODULES) if m.startswith(f"felixpy.{folder}."))


@pytest.mark.parametrize("folder", ["managers", "rules"])
def test_managers_and_rules_never_reach_kernel_access(folder: str) -> None:
    """Managers compute and rules render; only drivers reach the kernel (style rule 1), and not
    through a side door: nothing they import, however indirectly, is a kernel shim."""
    offenders = {}
    for module in _layer(folder):
        for dep, chain in reach(module).items():
            if _forbidden(dep):
                offenders[module] = " -> ".join(chain)
                break
    assert offenders == {}


def test_value_and_contract_modules_reach_no_kernel_access() -> None:
    """What managers may name in the drivers' tree: values and contracts, which touch nothing."""
    contracts = [m for m in MODULES if CONTRACT_MODULE.match(m)]
    assert len(contracts) >= 5, contracts  # routetable, routerule, vxlanfdb, tunnels, procsys at least
    for module in [*VALUE_MODULES, *contracts]:
        bad = {dep: chain for dep, chain in reach(module).items() if dep != module and _forbidden(dep)}
        assert bad == {}, (module, bad)


def test_the_check_sees_an_indirect_import() -> None:
    """The rule above must be able to fail: a manager that names a module which names the netlink
    shim is caught, with the chain that gets there."""
    chains = reach("felixpy.drivers.routetable.table")
    assert any(dep.startswith("felixpy.drivers.netlink.") and dep not in VALUE_MODULES for dep in chains)
    assert "felixpy.drivers.routetable.table" not in reach("felixpy.managers.endpoints")


def test_drivers_never_import_managers() -> None:
    offenders = {m: sorted(d for d in imports_of(m) if d.startswith("felixpy.managers"))
                 for m in _layer("drivers")}
    assert {m: d for m, d in offenders.items() if d} == {}


def _defines_a_driver(tree: ast.Module) -> bool:
    """A concrete class with an ``apply`` (or ``apply_updates``) method; Protocols and fakes are not drivers."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = {ast.unparse(b) for b in node.bases}
            if "Protocol" in bases or any(b.endswith(".Protocol") for b in bases):
                continue
            if any(isinstance(f, ast.FunctionDef) and f.name in ("apply", "apply_updates") for f in node.body):
                return True
    return False


DRIVER_MODULES = [m for m in _layer("drivers")
                  if not m.endswith(".fake") and _defines_a_driver(ast.parse(MODULES[m].read_text()))]


def test_driver_modules_are_found() -> None:
    assert {"felixpy.drivers.iptables.table", "felixpy.drivers.nftables.table", "felixpy.drivers.ipsets.driver",
            "felixpy.drivers.routetable.table", "felixpy.drivers.routerule.rules", "felixpy.drivers.vxlanfdb.fdb",
            "felixpy.drivers.procsys.syncer", "felixpy.drivers.tunnels.syncer"} <= set(DRIVER_MODULES)


# A section heading: one line naming how the module recognises what is its own ("How a fresh process
# recognises them as ours", "What it owns, and how it recognises its own after a restart", ...).
_RECOGNISE_HEADING = re.compile(r"^(?=\S)[^\n.]*\b[Hh]ow\b[^\n.]*\brecognis\w*[^\n.]*$", re.MULTILINE)


@pytest.mark.parametrize("module", DRIVER_MODULES)
def test_every_driver_module_says_how_a_fresh_process_recognises_its_objects(module: str) -> None:
    """The mark-and-sweep question, answered in the module docstring under its own heading."""
    doc = ast.get_docstring(ast.parse(MODULES[module].read_text())) or ""
    assert _RECOGNISE_HEADING.search(doc), f"{module}: no 'How … recognises …' section in its docstring"
