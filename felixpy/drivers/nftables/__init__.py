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

from felixpy.drivers.nftables.layer import NftablesLayer
from felixpy.drivers.nftables.shim import LibNftables, NftError, NftShim
from felixpy.drivers.nftables.table import NftablesTable, new_nftables_tables

__all__ = ["NftablesTable", "NftablesLayer", "LibNftables", "NftShim", "NftError", "new_nftables_tables"]
