"""The child that lists the ``calico`` table and parses it, so the daemon never holds nft's JSON.

``python -m felixpy.drivers.nftables.snapshotworker table|sets FAMILY NAME IP_VERSION [NFT]`` runs
``nft -j list …`` (as :class:`~.shim.NftChildProcess` does), parses the listing with
:func:`~.readback.parse_table` and prints the snapshot's wire form (:func:`~.readback.snapshot_to_wire`),
or ``{"missing": true}`` when the table does not exist.  nft's own failure is passed on: exit status 3,
nft's status and stderr as JSON on stderr.  It inherits the caller's network namespace (a child of the
daemon inside its namespace) and writes nothing to the kernel.

The whole table (``table``) is read from two listings at once, on the machine's two CPUs: the rules
from nft's terse text (:mod:`.ruletext`: ``nft -t -y list table``, 0.7 s at the large node, read in
~10 ms) and, on a thread beside it, the sets from ``nft -j list sets`` (with their elements, 0.45 s)
and the maps one ``list map`` each — against one ``nft -j list table`` (1.1 s) whose JSON costs 0.6 s
more to decode, mostly rule expressions nobody reads.  Each object comes from exactly one listing, so
with a writer at work (an off-apply-path listing) every object is as it was at some moment while the
worker ran, which the table's merge of such listings already assumes (readmerge.py).  Text the reader
cannot classify, or either listing failing (an nft without ``-t``/``-y``), sends it back to the one JSON
listing, whose own failure is the worker's, and the output says so (``via``).

Why a process (issue #17): one listing of a 135k-rule table is 27 MB of JSON and ~500 MiB of decoded
objects, resident in the daemon after the parse (glibc keeps the freed arenas) and decoded under the
GIL for seconds, stalling the apply thread; here both live and die with the child, and the daemon
decodes a few MB of hashes and, per set, one base64 string of its packed members (no member strings).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from felixpy.drivers.nftables.readback import TableSnapshot, parse_table, snapshot_to_wire
from felixpy.drivers.nftables.ruletext import Unreadable, parse_terse_text
from felixpy.drivers.nftables.shim import SNAPSHOT_WORKER_NFT_FAILED as EXIT_NFT_FAILED
from felixpy.drivers.nftables.shim import NftChildProcess, NftError


def read_table(nft: NftChildProcess, family: str, name: str, ip_version: int) -> tuple[TableSnapshot | None, str]:
    """The table as :func:`~.readback.parse_table` of ``nft -j list table`` would see it, and how it was
    read: ``"split"`` (rules from the text listing, sets and maps from their JSON listings, at once) or
    ``"json: <why>"`` (the text was unreadable, the one JSON listing instead).  None: no such table."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nft-sets") as pool:
        beside = pool.submit(_sets_and_maps, nft, family, name)
        try:
            text = nft.list_table_text(family, name)
        except NftError as e:      # an nft that refuses -t/-y, say: the listing every nft knows decides
            return _json_read(nft, family, name, ip_version, f"the text listing failed: {e}")
        try:
            objs = beside.result()
        except NftError as e:
            return _json_read(nft, family, name, ip_version, f"the set listing failed: {e}")
    if text is None:
        return None, "split"
    try:
        chains, others = parse_terse_text(text, family, name)
    except Unreadable as e:
        return _json_read(nft, family, name, ip_version, str(e))
    # Sets and maps only (a table deleted between the listings has none left); chains and foreign
    # objects from the text.
    snap = parse_table(objs, ip_version)
    snap.chains, snap.others = chains, others
    return snap, "split"


def _sets_and_maps(nft: NftChildProcess, family: str, name: str) -> list[dict[str, Any]]:
    sets = nft.list_sets(family, name)
    return [] if sets is None else [*sets, *nft.list_maps(family, name)]


def _json_read(nft: NftChildProcess, family: str, name: str, ip_version: int,
               why: str) -> tuple[TableSnapshot | None, str]:
    objs = nft.list_table(family, name)
    return (None if objs is None else parse_table(objs, ip_version)), f"json: {why}"


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5) or argv[0] not in ("table", "sets") or argv[3] not in ("4", "6"):
        print("usage: snapshotworker table|sets FAMILY NAME 4|6 [NFT]", file=sys.stderr)
        return 2
    kind, family, name, v = argv[0], argv[1], argv[2], int(argv[3])
    nft = NftChildProcess(nft=argv[4] if len(argv) == 5 else "nft")
    via = "sets"
    try:
        if kind == "sets":
            objs = nft.list_sets(family, name)
            snap = None if objs is None else parse_table(objs, v)
        else:
            snap, via = read_table(nft, family, name, v)
    except NftError as e:
        json.dump({"returncode": e.returncode, "stderr": e.stderr}, sys.stderr)
        return EXIT_NFT_FAILED
    out = {"missing": True} if snap is None else {**snapshot_to_wire(snap), "via": via}
    # One dumps(), not dump(): json.dump encodes chunk by chunk in pure Python, ~10x slower than the C
    # encoder dumps() uses (at large node ~0.5 s of the worker's ~3 s, on a restart's critical path).
    sys.stdout.write(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
