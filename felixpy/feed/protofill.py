"""Fill protobuf messages from parsed YAML, with errors that name the YAML path.

This module owns the generic, descriptor-driven half of the scenario parser:
given a message and a mapping whose keys are the message's snake_case field
names, :func:`fill` sets every field, converting YAML scalars to the field's
type and recursing into sub-messages, repeated fields and maps.  Sections of
the scenario format handle their special keys (ids, references, shorthands)
themselves and hand the rest to :func:`fill`.

Conversions (anything else is a :class:`ScenarioError`):

* string fields take strings, and ints/floats (YAML often reads ``64512`` or
  ``1.5`` as numbers), never booleans or null;
* bool fields take booleans only; integer fields take ints in range;
* enum fields take a value name, case-insensitive, or its number;
* repeated scalar fields take a list, or a single scalar meaning a list of one;
* map<string, string> fields take a mapping; scalar values are stringified
  (booleans as ``true``/``false``).

Every error message starts with the path of the offending value, e.g.
``workloads[1].qos_controls.IngressBandwidth: expected an integer, got 'x'``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from felixpy.errors import ConfigError

_INT_RANGES: dict[int, tuple[int, int]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOAT_TYPES = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


class ScenarioError(ConfigError, ValueError):
    """A scenario cannot be parsed; the message starts with the YAML path."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


def key_path(path: str, key: str) -> str:
    """``policies[2]`` + ``inbound`` → ``policies[2].inbound``."""
    return f"{path}.{key}" if path else key


def index_path(path: str, index: int) -> str:
    """``policies`` + 2 → ``policies[2]``."""
    return f"{path}[{index}]"


def describe(value: Any) -> str:
    """A short, quoted rendering of a YAML value for error messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def expect_mapping(value: Any, path: str) -> Mapping[str, Any]:
    """``value`` as a mapping with string keys, or a ScenarioError."""
    if not isinstance(value, Mapping):
        raise ScenarioError(path, f"expected a mapping, got {describe(value)}")
    for key in value:
        if not isinstance(key, str):
            raise ScenarioError(path, f"keys must be strings, got {describe(key)}")
    return value


def expect_list(value: Any, path: str) -> list[Any]:
    """``value`` as a list, or a ScenarioError (a mapping or string is not a list)."""
    if not isinstance(value, list):
        raise ScenarioError(path, f"expected a list, got {describe(value)}")
    return value


def as_list(value: Any, path: str) -> list[Any]:
    """A list as is; a single scalar as a list of one; null as empty."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, Mapping):
        raise ScenarioError(path, f"expected a list, got {describe(value)}")
    return [value]


def expect_str(value: Any, path: str) -> str:
    """A non-empty string (ints are accepted and stringified)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ScenarioError(path, f"expected a string, got {describe(value)}")
    text = str(value)
    if not text:
        raise ScenarioError(path, "must not be empty")
    return text


def check_keys(data: Mapping[str, Any], allowed: Iterable[str], path: str) -> None:
    """Raise for the first key of ``data`` not in ``allowed``."""
    allowed_set = set(allowed)
    for key in data:
        if key not in allowed_set:
            choices = ", ".join(sorted(allowed_set))
            raise ScenarioError(key_path(path, key), f"unknown key; expected one of: {choices}")


def fields_of(msg: Message | type[Message]) -> Mapping[str, FieldDescriptor]:
    """The fields of ``msg``'s type by snake_case name."""
    return cast(Mapping[str, FieldDescriptor], msg.DESCRIPTOR.fields_by_name)


def map_entry_fields(fd: FieldDescriptor) -> tuple[FieldDescriptor, FieldDescriptor]:
    """The ``key`` and ``value`` fields of a map field's entry type."""
    entry = fd.message_type
    assert entry is not None, f"{fd.full_name} is not a map"
    return entry.fields_by_name["key"], entry.fields_by_name["value"]


def fill(
    msg: Message,
    data: Mapping[str, Any],
    path: str,
    *,
    exclude: Iterable[str] = (),
    also_allowed: Iterable[str] = (),
) -> None:
    """Set ``msg``'s fields from ``data`` (see module docstring).

    ``exclude`` lists fields that must not be set this way; ``also_allowed``
    lists keys the caller has already handled (they are skipped here but
    offered in the "unknown key" message).
    """
    excluded = set(exclude)
    handled = set(also_allowed)
    fields = fields_of(msg)
    check_keys(data, (set(fields) - excluded) | handled, path)
    for key, value in data.items():
        if key not in handled:
            set_field(msg, fields[key], value, key_path(path, key))


def set_field(msg: Message, fd: FieldDescriptor, value: Any, path: str) -> None:
    """Set one field of ``msg`` from a YAML value."""
    if _is_map(fd):
        _set_map(getattr(msg, fd.name), fd, value, path)
    elif fd.is_repeated:
        _set_repeated(getattr(msg, fd.name), fd, value, path)
    elif fd.type == FieldDescriptor.TYPE_MESSAGE:
        sub = getattr(msg, fd.name)
        sub.SetInParent()
        fill(sub, expect_mapping({} if value is None else value, path), path)
    else:
        setattr(msg, fd.name, scalar(fd, value, path))


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _set_map(container: Any, fd: FieldDescriptor, value: Any, path: str) -> None:
    key_fd, value_fd = map_entry_fields(fd)
    for raw_key, raw_value in expect_mapping_any_keys(value, path).items():
        entry_path = key_path(path, str(raw_key))
        key = scalar(key_fd, raw_key, entry_path, lenient_str=True)
        if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
            fill(container[key], expect_mapping(raw_value, entry_path), entry_path)
        else:
            container[key] = scalar(value_fd, raw_value, entry_path, lenient_str=True)


def expect_mapping_any_keys(value: Any, path: str) -> Mapping[Any, Any]:
    """A mapping whose keys may be any YAML scalar (map keys are converted later)."""
    if not isinstance(value, Mapping):
        raise ScenarioError(path, f"expected a mapping, got {describe(value)}")
    return value


def _set_repeated(container: Any, fd: FieldDescriptor, value: Any, path: str) -> None:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        for i, item in enumerate(expect_list(value, path)):
            item_path = index_path(path, i)
            fill(container.add(), expect_mapping(item, item_path), item_path)
        return
    for i, item in enumerate(as_list(value, path)):
        container.append(scalar(fd, item, index_path(path, i)))


def scalar(fd: FieldDescriptor, value: Any, path: str, *, lenient_str: bool = False) -> Any:
    """Convert a YAML scalar to the Python value for a scalar field.

    ``lenient_str`` (map keys/values) also stringifies booleans.
    """
    if fd.type == FieldDescriptor.TYPE_STRING:
        return _to_str(value, path, lenient_str)
    if fd.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise ScenarioError(path, f"expected true or false, got {describe(value)}")
        return value
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return enum_value(fd, value, path)
    if fd.type in _FLOAT_TYPES:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(path, f"expected a number, got {describe(value)}")
        return float(value)
    if fd.type in _INT_RANGES:
        return _to_int(value, _INT_RANGES[fd.type], path)
    raise ScenarioError(path, f"fields of this type cannot be set from YAML ({fd.full_name})")  # pragma: no cover


def _to_str(value: Any, path: str, lenient: bool) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        if lenient:
            return "true" if value else "false"
    elif isinstance(value, (int, float)):
        return str(value)
    raise ScenarioError(path, f"expected a string, got {describe(value)}")


def _to_int(value: Any, bounds: tuple[int, int], path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(path, f"expected an integer, got {describe(value)}")
    low, high = bounds
    if not low <= value <= high:
        raise ScenarioError(path, f"{value} is out of range [{low}, {high}]")
    return value


def enum_value(fd: FieldDescriptor, value: Any, path: str) -> int:
    """An enum field's number from a name (any case) or a number."""
    enum = fd.enum_type
    assert enum is not None, f"{fd.full_name} is not an enum"
    if isinstance(value, str):
        match = enum.values_by_name.get(value.upper())
        if match is not None:
            return int(match.number)
    elif isinstance(value, int) and not isinstance(value, bool) and value in enum.values_by_number:
        return value
    choices = ", ".join(v.name.lower() for v in enum.values)
    raise ScenarioError(path, f"bad {enum.name} {describe(value)}; expected one of: {choices}")
