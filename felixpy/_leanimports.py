"""Keep third-party package ``__init__``s that import the world out of the daemon (#17, memory).

pyroute2's top-level ``__init__`` imports every protocol it has — NDB (and with it ``sqlite3``), IPDB,
nl80211, plan9, ipvs, … — although the daemon uses only ``IPRoute``, rtnetlink marshalling, the
nfnetlink socket and WireGuard.  Python runs a package's ``__init__`` before any of its submodules, so
importing ``pyroute2.iproute.linux`` alone still pays for all of it (~6 MiB RSS, 80 modules).

:func:`install` registers ``pyroute2`` in ``sys.modules`` as the real package *without* running its
``__init__``: same ``__path__`` and spec, so ``import pyroute2.x.y`` works as usual.  An attribute the
package does not have yet is first tried as a submodule (``from pyroute2 import config``, as pyroute2's
own modules write); any other name (``from pyroute2 import NDB``) runs the real ``__init__`` once, so
code outside the daemon that uses the top-level names keeps working, just without the saving.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

_LEAN_PACKAGES = ("pyroute2",)


def _lean(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not installed (or not a package): the ordinary import reports it where it is used
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def __getattr__(attr: str) -> object:
        if not attr.startswith("__"):
            try:
                return importlib.import_module(f"{name}.{attr}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{name}.{attr}":
                    raise
        # A top-level name: run the real __init__ into this module object, once.
        module.__dict__.pop("__getattr__", None)
        loader.exec_module(module)
        return getattr(module, attr)

    module.__dict__["__getattr__"] = __getattr__
    sys.modules[name] = module


def install() -> ModuleType | None:
    """Register the lean packages (idempotent; a package already imported is left as it is)."""
    for name in _LEAN_PACKAGES:
        _lean(name)
    return sys.modules.get(_LEAN_PACKAGES[0])
