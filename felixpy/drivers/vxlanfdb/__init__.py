"""VXLAN FDB driver (neighbour + bridge FDB entries per remote VTEP); see :mod:`.fdb`, contract in :mod:`.api`."""

from felixpy.drivers.vxlanfdb.api import VTEP, VTEPSink
from felixpy.drivers.vxlanfdb.fdb import VXLANFDB

__all__ = ["VTEP", "VTEPSink", "VXLANFDB"]
