"""The Struct base every wire message shares, so strictness is decided in one place."""

from __future__ import annotations

import msgspec


class WireStruct(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A strict wire message: unknown fields are rejected, fields are keyword-only.

    Frozen because a decoded envelope is evidence: nothing downstream may edit it in place.
    """
