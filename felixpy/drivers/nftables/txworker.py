"""A long-lived child that runs small nft transactions through one libnftables context.

``python -m felixpy.drivers.nftables.txworker`` is started once per table by
:class:`~.shim.TransactionWorker` (for :class:`~.shim.NftChildProcess` with ``worker_below``) and
serves requests on stdin until stdin closes (the daemon exited, or closed it).

Why (issue #17): a churn apply at the large-node profile writes ~60 KB of nft script (~400 rules);
``nft -f -`` as a fresh child takes 24–32 ms of it, the same script through a context that stays
alive 12–15 ms (measured in a namespace holding the large-node ruleset; docs/benchmarks.md, seventh
pass).  The context lives here rather than in the daemon so that libnftables' C heap and any abort
inside it (seen with two in-process contexts on two threads, issue #14) stay out of the daemon; big
transactions still go to a fresh ``nft`` per call.

Wire format, both directions binary on the pipes:

* ready: the worker writes ``b"R"`` once its context exists (anything else on stdout, or EOF, means it
  could not start: the client falls back to ``nft`` per call);
* request: one byte ``b"S"`` (an nft script) or ``b"J"`` (libnftables JSON), the payload's length as 8
  bytes big-endian, the payload (UTF-8);
* reply: libnftables' return code as 4 bytes big-endian signed, stderr's length as 8 bytes, stderr.

It inherits the network namespace of the thread that started it and acts only there.
"""

from __future__ import annotations

import signal
import struct
import sys
from typing import IO

READY = b"R"
REQUEST = struct.Struct(">cQ")
REPLY = struct.Struct(">iQ")
SCRIPT, JSON = b"S", b"J"


def read_exactly(stream: IO[bytes], n: int) -> bytes | None:
    """``n`` bytes from ``stream``, or None at a clean EOF before the first one; a torn read raises EOFError."""
    chunks: list[bytes] = []
    got = 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            if got == 0:
                return None
            raise EOFError(f"stream ended after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> int:
    import nftables  # type: ignore[import-untyped]

    nft = nftables.Nftables()
    nft.set_handle_output(False)
    stdout.write(READY)
    stdout.flush()
    while True:
        head = read_exactly(stdin, REQUEST.size)
        if head is None:
            return 0
        kind, size = REQUEST.unpack(head)
        body = read_exactly(stdin, size) if size else b""
        if body is None or kind not in (SCRIPT, JSON):
            print(f"txworker: bad request {kind!r}", file=sys.stderr)
            return 2
        nft.set_json_output(kind == JSON)
        rc, _out, err = nft.cmd(body.decode())
        err_bytes = str(err).encode()
        stdout.write(REPLY.pack(int(rc), len(err_bytes)) + err_bytes)
        stdout.flush()


def main() -> int:
    # The daemon owns shutdown: a terminal's Ctrl-C reaches the whole process group, and the worker
    # must keep serving the daemon's last applies; it ends when its stdin closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
