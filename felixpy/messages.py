"""Envelope helpers for Felix's ``ToDataplane`` / ``FromDataplane`` messages.

This module owns the mapping between an envelope's ``payload`` oneof and the
payload message types.  The mapping is read once from the protobuf descriptors,
so a field added to ``felixbackend.proto`` is picked up without code changes.

* :func:`payload_of` / :func:`from_payload_of` unwrap an envelope into
  ``(field_name, payload_message)``.
* :func:`to_dataplane` / :func:`from_dataplane` wrap a payload message into an
  envelope with a sequence number, picking the oneof field by message type
  (:func:`to_field_for` exposes that choice).

Both directions raise :class:`UnknownPayload` for an empty envelope or a
message type that no oneof field carries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Self

from google.protobuf.message import Message

from felixpy.errors import FelixpyError
from felixpy.proto import felixbackend_pb2 as pb

_ONEOF = "payload"


class UnknownPayload(FelixpyError, ValueError):
    """An envelope has no payload set, or a message type is not a payload."""


def _oneof_fields(envelope: type[Message]) -> tuple[tuple[str, str], ...]:
    """``(field name, payload type full name)`` of each ``payload`` oneof field, in declaration order."""
    out: list[tuple[str, str]] = []
    for field in envelope.DESCRIPTOR.oneofs_by_name[_ONEOF].fields:
        assert field.message_type is not None  # every payload field carries a message
        out.append((field.name, field.message_type.full_name))
    return tuple(out)


def _type_to_field(envelope: type[Message]) -> Mapping[str, str]:
    """Map payload full type name (e.g. ``felix.InSync``) to its oneof field."""
    mapping: dict[str, str] = {}
    for name, full_name in _oneof_fields(envelope):
        if full_name in mapping:  # pragma: no cover - guards a proto edit
            raise AssertionError(f"{envelope.__name__}: two payload fields carry {full_name}")
        mapping[full_name] = name
    return MappingProxyType(mapping)


PAYLOAD_FIELDS: tuple[str, ...] = tuple(name for name, _ in _oneof_fields(pb.ToDataplane))
"""Names of the ``ToDataplane.payload`` oneof fields, in declaration order."""

FROM_PAYLOAD_FIELDS: tuple[str, ...] = tuple(name for name, _ in _oneof_fields(pb.FromDataplane))
"""Names of the ``FromDataplane.payload`` oneof fields, in declaration order."""

_TO_FIELD_BY_TYPE = _type_to_field(pb.ToDataplane)
_FROM_FIELD_BY_TYPE = _type_to_field(pb.FromDataplane)


def _unwrap(envelope: Message) -> tuple[str, Any]:
    field = envelope.WhichOneof(_ONEOF)
    if field is None:
        raise UnknownPayload(f"{type(envelope).__name__} has no payload set")
    return field, getattr(envelope, field)


def _field_for(by_type: Mapping[str, str], envelope_name: str, payload: Message) -> str:
    full_name = payload.DESCRIPTOR.full_name
    try:
        return by_type[full_name]
    except KeyError:
        raise UnknownPayload(f"{full_name} is not a {envelope_name} payload") from None


class MessageRecord:
    """Base of a dataclass whose fields are named as a message's: what a manager keeps of a message instead
    of the message (a parsed one stays resident at several times a plain record's size).  ``Record.of(msg)``
    fills one from *msg*."""

    __slots__ = ()

    @classmethod
    def of(cls, msg: Any) -> Self:
        return cls(*(getattr(msg, f.name) for f in dataclasses.fields(cls)))  # type: ignore[arg-type]


def payload_of(msg: pb.ToDataplane) -> tuple[str, Any]:
    """Return ``(field_name, payload)`` for the set oneof field of ``msg``."""
    return _unwrap(msg)


def to_dataplane(seq: int, payload_msg: Message) -> pb.ToDataplane:
    """Wrap ``payload_msg`` (e.g. an ``IPSetUpdate``) into a ``ToDataplane``."""
    envelope = pb.ToDataplane(sequence_number=seq)
    getattr(envelope, to_field_for(payload_msg)).CopyFrom(payload_msg)
    return envelope


def to_field_for(payload_msg: Message) -> str:
    """The ``ToDataplane`` oneof field that carries messages of this type."""
    return _field_for(_TO_FIELD_BY_TYPE, "ToDataplane", payload_msg)


def from_payload_of(msg: pb.FromDataplane) -> tuple[str, Any]:
    """Return ``(field_name, payload)`` for the set oneof field of ``msg``."""
    return _unwrap(msg)


def from_dataplane(seq: int, payload: Message) -> pb.FromDataplane:
    """Wrap a status message (e.g. ``ProcessStatusUpdate``) into a ``FromDataplane``."""
    envelope = pb.FromDataplane(sequence_number=seq)
    field = _field_for(_FROM_FIELD_BY_TYPE, "FromDataplane", payload)
    getattr(envelope, field).CopyFrom(payload)
    return envelope
