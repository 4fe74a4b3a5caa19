"""Size-checked decoding and the shared encoder for every wire type.

Decoders are built once per type (msgspec caches the validation plan in them), and every
envelope's size is checked before a byte is parsed, so a hostile payload costs nothing.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from schemas.action import Action
from schemas.cancel import CancelRequest
from schemas.delegation import DelegationRequest
from schemas.errors import ErrorCode
from schemas.operator import OperatorInput

T = TypeVar("T")

DEFAULT_MAX_ENVELOPE_BYTES = 1_048_576
_MAX_REASON = 300

_encoder = msgspec.json.Encoder()
_action_decoder = msgspec.json.Decoder(Action)
_cancel_decoder = msgspec.json.Decoder(CancelRequest)
_delegation_decoder = msgspec.json.Decoder(DelegationRequest)


class EnvelopeRejected(Exception):
    """An envelope that cannot be accepted; `code` is the host code for the DLQ."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason[:_MAX_REASON]


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


def _decode(decoder: msgspec.json.Decoder[T], data: bytes, max_bytes: int) -> T:
    if len(data) > max_bytes:
        raise EnvelopeRejected(
            ErrorCode.SCHEMA_ENVELOPE_INVALID,
            f"envelope is {len(data)} bytes, over the {max_bytes}-byte limit",
        )
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise EnvelopeRejected(ErrorCode.ENVELOPE_DECODE_INVALID, str(exc)) from None
    except RecursionError:
        raise EnvelopeRejected(
            ErrorCode.ENVELOPE_DECODE_INVALID, "envelope is nested too deeply"
        ) from None


def decode_action(data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES) -> Action:
    return _decode(_action_decoder, data, max_bytes)


def decode_cancel(data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES) -> CancelRequest:
    return _decode(_cancel_decoder, data, max_bytes)


def decode_delegation(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> DelegationRequest:
    return _decode(_delegation_decoder, data, max_bytes)


def convert_input(value: dict[str, Any], typ: type[T]) -> T:
    """Validate an Action's `input` object against an operation's input type."""
    try:
        return msgspec.convert(value, typ, strict=True)
    except msgspec.ValidationError as exc:
        raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, f"input: {exc}") from None


def decode_operator_input(value: dict[str, Any]) -> OperatorInput:
    """The operator's input; both branches, neither, or objective fields beside `resume`
    are refused by the type itself."""
    return convert_input(value, OperatorInput)
