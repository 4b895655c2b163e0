"""Interface index <-> name, for the ``ip``/``tc``/``bridge`` tools that speak names.

Two lookups, chosen by how many interfaces a caller needs:

* :func:`if_nameindex` — every interface of the calling thread's namespace, through libc's
  ``if_nameindex(3)`` called via ctypes, which lets go of the GIL while libc works.  That call asks the
  kernel for a full link dump: ~13 µs an interface, ~26 ms at 2,000 interfaces, all of it with the GIL
  held when made through :func:`socket.if_nameindex` (it does not release it), stalling every other
  thread of the daemon.
* :func:`if_indextoname` — one interface (``SIOCGIFNAME``, microseconds): what a dump or a batch that
  concerns a few interfaces uses instead of the whole map.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket


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


def if_indextoname(index: int) -> str | None:
    """The name of interface *index*, or None if there is none."""
    try:
        return socket.if_indextoname(index)
    except OSError:
        return None
