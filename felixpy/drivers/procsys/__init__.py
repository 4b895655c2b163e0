"""Kernel settings under ``/proc/sys``: the shim (:mod:`.sysctls`), the syncer (:mod:`.syncer`), a fake (:mod:`.fake`)."""

from felixpy.drivers.procsys.fake import FakeSysctls
from felixpy.drivers.procsys.api import IfaceConfig, InterfaceConfigurer
from felixpy.drivers.procsys.syncer import InterfaceSysctls
from felixpy.drivers.procsys.sysctls import ProcSys, SysctlWriter, apply_settings, workload_iface_settings

__all__ = ["FakeSysctls", "IfaceConfig", "InterfaceConfigurer", "InterfaceSysctls", "ProcSys", "SysctlWriter", "apply_settings",
           "workload_iface_settings"]
