"""Host MTU detection and the MTU file for the CNI plugin; see :mod:`.syncer`."""

from felixpy.drivers.hostmtu.syncer import DEFAULT_MTU_FILE, FALLBACK_HOST_MTU, HostMTU, mtu_file_path

__all__ = ["DEFAULT_MTU_FILE", "FALLBACK_HOST_MTU", "HostMTU", "mtu_file_path"]
