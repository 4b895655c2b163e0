"""The child that lists the ``calico`` table and parses it, so the daemon never holds nft's JSON.

``python -m felixpy.drivers.nftables.snapshotworker table|sets FAMILY NAME IP_VERSION [NFT]`` runs
``nft -j list …`` (as :class:`~.shim.NftChildProcess` does), parses the listing with
:func:`~.readback.parse_table` and prints the snapshot's wire form (:func:`~.readback.snapshot_to_wire`),
or ``{"missing": true}`` when the table does not exist.  nft's own failure is passed on: exit status 3,
nft's status and stderr as JSON on stderr.  It inherits the caller's network namespace (a child of the
daemon inside its namespace) and writes nothing to the kernel.

Why a process (issue #17): one listing of a 135k-rule table is 27 MB of JSON and ~500 MiB of decoded
objects, resident in the daemon after the parse (glibc keeps the freed arenas) and decoded under the
GIL for seconds, stalling the apply thread; here both live and die with the child, and the daemon
decodes a few MB of hashes and, per set, one base64 string of its packed members (no member strings).
"""

from __future__ import annotations

import json
import sys

from felixpy.drivers.nftables.readback import parse_table, snapshot_to_wire
from felixpy.drivers.nftables.shim import SNAPSHOT_WORKER_NFT_FAILED as EXIT_NFT_FAILED
from felixpy.drivers.nftables.shim import NftChildProcess, NftError


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5) or argv[0] not in ("table", "sets") or argv[3] not in ("4", "6"):
        print("usage: snapshotworker table|sets FAMILY NAME 4|6 [NFT]", file=sys.stderr)
        return 2
    kind, family, name, v = argv[0], argv[1], argv[2], int(argv[3])
    nft = NftChildProcess(nft=argv[4] if len(argv) == 5 else "nft")
    try:
        objs = nft.list_sets(family, name) if kind == "sets" else nft.list_table(family, name)
    except NftError as e:
        json.dump({"returncode": e.returncode, "stderr": e.stderr}, sys.stderr)
        return EXIT_NFT_FAILED
    out = {"missing": True} if objs is None else snapshot_to_wire(parse_table(objs, v))
    # One dumps(), not dump(): json.dump encodes chunk by chunk in pure Python, ~10x slower than the C
    # encoder dumps() uses (at large node ~0.5 s of the worker's ~3 s, on a restart's critical path).
    sys.stdout.write(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
