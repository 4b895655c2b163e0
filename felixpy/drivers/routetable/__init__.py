"""Route table driver: Calico's routes in one (kernel table, IP family); see :mod:`.table`."""

from felixpy.drivers.routetable.defs import INTERFACE_NONE, Target, TargetType
from felixpy.drivers.routetable.ownership import ExclusiveOwnershipPolicy, MainTableOwnershipPolicy
from felixpy.drivers.routetable.table import RouteTable

__all__ = ["INTERFACE_NONE", "ExclusiveOwnershipPolicy", "MainTableOwnershipPolicy", "RouteTable", "Target",
           "TargetType"]
