"""Interface index <-> name, for the ``ip``/``tc``/``bridge`` tools that speak names.

Two lookups, chosen by what a caller knows:

* :func:`if_nameindex` — every interface of the calling thread's namespace, through libc's
  ``if_nameindex(3)`` called via ctypes, which lets go of the GIL while libc works.  That call asks the
  kernel for a full link dump: ~7-13 µs an interface, 15-26 ms at 2,000 interfaces, all of it with the
  GIL held when made through :func:`socket.if_nameindex` (it does not release it).  Only a dump whose
  output may name any interface needs it.
* :func:`indextonames` — the interfaces a caller names by index (a batch's ``dev`` arguments, a dump
  filtered to one device): one ``SIOCGIFNAME`` ioctl each on one socket, ~2 µs an index, so a batch
  about 1,000 of 2,000 interfaces costs ~2 ms where the whole map costs 15-26 ms of kernel time.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
from collections.abc import Iterable


class _NameIndex(ctypes.Structure):
    _fields_ = [("if_index", ctypes.c_uint), ("if_name", ctypes.c_char_p)]


_libc = ctypes.CDLL(None, use_errno=True)   # CDLL: the GIL is released during each call
_libc.if_nameindex.restype = ctypes.POINTER(_NameIndex)
_libc.if_nameindex.argtypes = []
_libc.if_freenameindex.restype = None
_libc.if_freenameindex.argtypes = [ctypes.POINTER(_NameIndex)]


def if_nameindex() -> list[tuple[int, str]]:
    """(index, name) of every interface, as :func:`socket.if_nameindex` gives them."""
    head = _libc.if_nameindex()
    if not head:
        err = ctypes.get_errno() or errno.EIO
        raise OSError(err, os.strerror(err))
    try:
        out: list[tuple[int, str]] = []
        i = 0
        while True:
            entry = head[i]
            if entry.if_index == 0 or entry.if_name is None:
                return out
            out.append((entry.if_index, os.fsdecode(entry.if_name)))
            i += 1
    finally:
        _libc.if_freenameindex(head)


_SIOCGIFNAME = 0x8910
_IFREQ = struct.Struct("16si20x")  # struct ifreq: the name, then ifr_ifindex in the 24-byte union


def indextonames(indexes: Iterable[int]) -> dict[int, str]:
    """index -> name for each of *indexes* that is an interface of the calling thread's namespace (the
    others are absent), over one socket made in that namespace."""
    out: dict[int, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fd = sock.fileno()
        for index in indexes:
            if not 0 < index < 2**31:
                continue
            try:
                got = fcntl.ioctl(fd, _SIOCGIFNAME, _IFREQ.pack(b"", index))
            except OSError as exc:
                if exc.errno in (errno.ENODEV, errno.ENXIO):
                    continue
                raise
            out[index] = os.fsdecode(got[:16].split(b"\0", 1)[0])
    return out
