"""The base every AIP 1.0 body type shares, so the wire rules are decided in one place.

The rules (shared/reference/aip-1.0-wire.md §1.0.1, upstream `aip-schema`):

- **Closed.** Upstream adds `additionalProperties: false` to every object that declares
  properties, and validates ingress against the schema before decoding: an unknown field
  anywhere in a typed object is refused (`forbid_unknown_fields`). Only the fields the
  schema leaves untyped (`Any` here) hold arbitrary JSON.
- **Absent, never null.** An optional field may arrive as `null` or be absent; it is
  written absent (serde's `skip_serializing_if`), and an empty list is not written either
  (`omit_defaults` with `None` and `[]` defaults).
- **Defaulted flags are written.** A boolean or number declared with a default (say
  `include_result`) is always serialized, `false` included, because upstream signs its own
  re-serialization of the typed value: such a field is declared `T | UnsetType = UNSET`
  and listed in `__aip_defaults__`, and a decoded absence becomes the default.

Every field carries a description, so the exported JSON Schema documents the wire.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta
from msgspec.structs import force_setattr


class AipStruct(
    msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True, omit_defaults=True
):
    """A closed AIP object: unknown fields refused, absent optionals omitted on the wire."""

    #: field → the default a decoded absence takes (the field is then always written).
    __aip_defaults__: ClassVar[dict[str, Any]] = {}

    def __post_init__(self) -> None:
        for name, default in self.__aip_defaults__.items():
            if getattr(self, name) is msgspec.UNSET:
                force_setattr(self, name, default)


#: Constrained scalars (a constraint binds the value's type, not its `| None`).
UInt = Annotated[int, Meta(ge=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonEmptyStr = Annotated[str, Meta(min_length=1)]
#: The longest bounded wait a lifecycle request may ask for, in ms.
MAX_WAIT_MS = 30_000
WaitMs = Annotated[int, Meta(ge=0, le=MAX_WAIT_MS)]
PageSize = Annotated[int, Meta(ge=1, le=1000)]
