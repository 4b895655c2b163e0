"""Generated protobuf/gRPC code for Felix's dataplane API and felixpy's transport.

The modules here are produced by ``scripts/gen-proto.sh`` (``make proto``) from
``proto/felixbackend.proto`` (package ``felix``, wire-compatible with Felix) and
``proto/felixpy.proto`` (package ``felixpy``, our batching gRPC service).  They
are not checked in.  Import them explicitly::

    from felixpy.proto import felixbackend_pb2 as pb

This package deliberately imports nothing itself, so that ``import
felixpy.proto`` stays cheap and does not pull in grpc.
"""

from __future__ import annotations
