"""The nftables backend: one ``calico`` table per IP family, through libnftables' JSON API.

* :class:`NftablesTable` (``table.py``) is the root: it owns the table, the one
  transaction per apply, the nft sets (it is the family's IPSetsDataplane) and
  the verdict maps (MapsDataplane).
* :class:`NftablesLayer` (``layer.py``) is the Table the rules layer sees for
  ``filter``/``nat``/``mangle``/``raw``: it namespaces names and forwards.
* ``shim.py`` wraps libnftables; ``fake.py`` is a stateful, atomic fake of it.

See docs/nftables.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from felixpy.drivers.nftables.layer import NftablesLayer, new_nftables_tables
    from felixpy.drivers.nftables.shim import LibNftables, NftError, NftShim
    from felixpy.drivers.nftables.table import NftablesTable

__all__ = ["NftablesTable", "NftablesLayer", "LibNftables", "NftShim", "NftError", "new_nftables_tables"]

# Imported on first use, so that a submodule alone (the listing worker, snapshotworker.py, a child process
# started per listing) does not pay for the table, metrics and logging.
_HOME = {"NftablesLayer": "layer", "LibNftables": "shim", "NftError": "shim", "NftShim": "shim",
         "NftablesTable": "table", "new_nftables_tables": "layer"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
