"""Route table driver: Calico's routes in one (kernel table, IP family); see :mod:`.table`.

:mod:`.api` holds the contract producers are written against, :mod:`.dummy` the
null table for ``RouteSyncDisabled``, :mod:`.routeclass` who produced a route.
"""

from felixpy.drivers.routetable.api import RouteTableAPI
from felixpy.drivers.routetable.defs import INTERFACE_NONE, Target, TargetType
from felixpy.drivers.routetable.dummy import DummyTable
from felixpy.drivers.routetable.ownership import ExclusiveOwnershipPolicy, MainTableOwnershipPolicy
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.drivers.routetable.table import RouteTable

__all__ = ["INTERFACE_NONE", "DummyTable", "ExclusiveOwnershipPolicy", "MainTableOwnershipPolicy", "RouteClass",
           "RouteTable", "RouteTableAPI", "Target", "TargetType"]
