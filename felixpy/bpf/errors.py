"""Errors raised by the BPF layer.

::

    BPFError                      anything that went wrong in felixpy.bpf
    ├── BPFSyscallError           a bpf(2) command failed; .errno, .cmd
    │   └── VerifierError         BPF_PROG_LOAD was refused; .log holds the verifier log
    ├── CompileError              bcc/clang could not compile a C variant
    ├── MapLayoutError            a pinned map exists with a different type/key/value size
    ├── PolicyTooLarge            a policy needs more sub-programs than the jump layout allows
    └── UnsupportedAttachType     the requested attach mechanism is unavailable (e.g. netkit)

Reconcile operations are idempotent: deleting an absent map entry or unpinning an absent pin is
not an error and raises nothing.
"""

from __future__ import annotations

import errno as _errno
import os


class BPFError(Exception):
    """Base class of every error raised by :mod:`felixpy.bpf`."""


class BPFSyscallError(BPFError):
    def __init__(self, cmd: str, err: int, detail: str = "") -> None:
        self.cmd = cmd
        self.errno = err
        msg = f"bpf({cmd}) failed: {_errno.errorcode.get(err, err)} ({os.strerror(err)})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class VerifierError(BPFSyscallError):
    def __init__(self, err: int, name: str, log: str) -> None:
        self.log = log
        tail = "\n".join(log.strip().splitlines()[-25:])
        super().__init__("BPF_PROG_LOAD", err, f"program {name!r} rejected\n{tail}")


class CompileError(BPFError):
    pass


class MapLayoutError(BPFError):
    pass


class PolicyTooLarge(BPFError):
    pass


class UnsupportedAttachType(BPFError):
    pass
