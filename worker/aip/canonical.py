"""AIP 1.0 canonical JSON: the exact bytes the reference implementation signs.

Upstream (`getaip/core`, `aip-crypto::canonical_json_bytes`) sorts object keys and prints
the value with serde_json 1.0.150 (its Cargo.lock). So the rules are serde_json's, not
RFC 8785:

* object keys sorted by their UTF-8 bytes at every depth (= code point order, which is
  Python's `str` order; JCS sorts by UTF-16 units and differs for astral keys);
* compact: no whitespace;
* strings: `"` and `\\` escaped, `\\b \\f \\n \\r \\t` short, the other controls below
  U+0020 as `\\u00xx` (lowercase hex); `/`, DEL, U+2028 and everything non-ASCII raw UTF-8;
* integers in decimal while they fit serde_json's i64/u64; beyond that serde_json only has
  an f64, so they print as that float;
* floats in shortest round-trip digits laid out as serde_json 1.0.150 does (zmij, which
  matches ryu except that a positive exponent carries a `+`): plain notation for
  1e-5 <= |x| < 1e16 (`100.0`, `0.00001`), otherwise `1e+16`, `1.5e-7`, `-0.0` for minus
  zero. Python's `repr` gives the same digits but writes `1e-05`/`1e-07` and switches to
  exponents at 1e-5 already, so it is re-laid out here.

`loads` reads received bytes the way serde_json does, strictly: `-0` is the float -0.0,
an integer outside i64/u64 becomes a float, NaN/Infinity, a number out of f64 range, lone
surrogates, invalid UTF-8, a BOM and nesting deeper than serde_json's 127 levels are
refused. It also refuses a repeated object key (serde_json would keep the last one): two
readings of one document must never sign differently.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any, Final

import msgspec

from worker.aip.errors import MalformedJson, NotCanonicalizable, UnportableNumber

#: serde_json's default recursion limit (128) refuses the 128th nested array or object.
MAX_DEPTH: Final = 127
_I64_MIN: Final = -(2**63)
_U64_MAX: Final = 2**64 - 1

_quote: Callable[[str], str] = encode_basestring  # the C escaper: serde_json's exact set


def format_float(value: float) -> str:
    """`value` as serde_json 1.0.150 prints an f64 (NotCanonicalizable for NaN/infinity)."""
    if not math.isfinite(value):
        raise NotCanonicalizable(f"{value!r} has no JSON form")
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    text = repr(value)  # shortest round-trip digits (the same digits ryu/zmij choose)
    sign = ""
    if text[0] == "-":
        sign, text = "-", text[1:]
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    stripped = digits.lstrip("0")
    lead = len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    # value = d.ddd * 10**point
    point = len(whole) - lead - 1 + (int(exponent) if exponent else 0)
    if -5 <= point <= 15:
        if len(digits) - 1 <= point:
            return f"{sign}{digits}{'0' * (point + 1 - len(digits))}.0"
        if point >= 0:
            return f"{sign}{digits[: point + 1]}.{digits[point + 1 :]}"
        return f"{sign}0.{'0' * (-point - 1)}{digits}"
    head = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{head}e{'-' if point < 0 else '+'}{abs(point)}"


def _int_text(value: int) -> str:
    if _I64_MIN <= value <= _U64_MAX:
        return str(value)
    try:
        return format_float(float(value))
    except OverflowError:
        raise NotCanonicalizable("an integer beyond the f64 range has no JSON form") from None


def canonical_text(value: Any) -> str:
    """The canonical JSON of a JSON value (dict with str keys, list/tuple, str, int, float,
    bool, None), as text; `canonical_bytes` is its UTF-8."""
    parts: list[str] = []
    _emit(value, parts, 0)
    return "".join(parts)


def canonical_bytes(value: Any) -> bytes:
    """The bytes AIP signs for `value`; NotCanonicalizable if it has no canonical form.

    A value made only of plain JSON types (`_plain`) is printed by msgspec, several times
    faster; anything else (subclasses, tuples, integers beyond 64 bits, floats from 1e16
    up, NaN...) by the exact printer, which also says what is wrong. The two agree
    (tests/unit/test_aip_canonical.py)."""
    if _plain(value, 0):
        return plain_bytes(value)
    text = canonical_text(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise NotCanonicalizable("a string holds a lone surrogate (not valid Unicode)") from None


def plain_bytes(value: Any) -> bytes:
    """The canonical bytes of a value made only of plain JSON (`plain_scalar` leaves, str
    keys), printed by msgspec with sorted keys, without walking it first: for a caller that
    built the value and knows it is plain (`worker.wire.receipts`); `canonical_bytes`
    checks. NotCanonicalizable for a lone surrogate."""
    try:
        return _sorted_encoder.encode(value)
    except UnicodeEncodeError:
        raise NotCanonicalizable("a string holds a lone surrogate (not valid Unicode)") from None


_sorted_encoder = msgspec.json.Encoder(order="sorted")
#: The encoder `plain_bytes` prints with, for a caller that prints many plain values in a
#: row and turns a lone surrogate's UnicodeEncodeError into NotCanonicalizable itself
#: (`worker.wire.chunks.ChunkFramer`).
PLAIN_ENCODER: Final = _sorted_encoder
#: msgspec (a ryu port) prints plain JSON exactly as serde_json does, except a positive
#: float exponent (`1e21` for `1e+21`), which appears exactly when |x| >= 1e16.
_PLAIN_FLOAT_LIMIT: Final = 1e16


def is_plain(value: Any) -> bool:
    """Whether `value` is made only of plain JSON (`plain_bytes` prints it canonically): for
    a caller that builds a document around a free value and checks only that value."""
    return _plain(value, 0)


def _plain(value: Any, depth: int) -> bool:
    """Whether `value` is made only of exact JSON types that msgspec prints as serde_json
    does: str keys, in-range ints, finite floats below 1e16 in magnitude, not too deep."""
    kind = type(value)
    if kind is dict:
        if depth >= MAX_DEPTH:
            return False
        for key, item in value.items():
            if type(key) is not str:
                return False
            if type(item) is not str and not _plain(item, depth + 1):
                return False
        return True
    if kind is list:
        if depth >= MAX_DEPTH:
            return False
        return all(type(item) is str or _plain(item, depth + 1) for item in value)
    return plain_scalar(value)


def plain_scalar(value: Any) -> bool:
    """Whether `value` is one JSON scalar msgspec prints exactly as serde_json does: a str,
    a bool, null, an in-range int, or a finite float below 1e16 in magnitude."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(_I64_MIN <= value <= _U64_MAX)
    if kind is float:
        return bool(abs(value) < _PLAIN_FLOAT_LIMIT)  # False for NaN and infinities too
    return False


def _emit(value: Any, out: list[str], depth: int) -> None:
    kind = type(value)
    if kind is str:
        out.append(_quote(value))
    elif kind is dict:
        _emit_object(value, out, depth)
    elif kind is list or kind is tuple:
        _emit_array(value, out, depth)
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif kind is int:
        out.append(_int_text(value))
    elif kind is float:
        out.append(format_float(value))
    elif isinstance(value, str):
        out.append(_quote(str(value)))
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(_int_text(int(value)))
    elif isinstance(value, float):
        out.append(format_float(float(value)))
    elif isinstance(value, dict):
        _emit_object(value, out, depth)
    elif isinstance(value, list | tuple):
        _emit_array(value, out, depth)
    else:
        raise NotCanonicalizable(f"a {kind.__name__} is not a JSON value")


def _emit_object(value: dict[Any, Any], out: list[str], depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise NotCanonicalizable(f"nested deeper than {MAX_DEPTH} levels")
    for key in value:
        if not isinstance(key, str):
            raise NotCanonicalizable(f"an object key is a {type(key).__name__}, not a string")
    out.append("{")
    first = True
    for key in sorted(value):
        if not first:
            out.append(",")
        first = False
        out.append(_quote(str(key)))
        out.append(":")
        _emit(value[key], out, depth + 1)
    out.append("}")


def _emit_array(value: list[Any] | tuple[Any, ...], out: list[str], depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise NotCanonicalizable(f"nested deeper than {MAX_DEPTH} levels")
    out.append("[")
    for index, item in enumerate(value):
        if index:
            out.append(",")
        _emit(item, out, depth + 1)
    out.append("]")


# --- reading received bytes as serde_json does --------------------------------------------


def _parse_int(text: str) -> int | float:
    if text == "-0":
        return -0.0  # serde_json: "Convert into a float ... on `-0`"
    number = int(text)
    if _I64_MIN <= number <= _U64_MAX:
        return number
    as_float = float(number)  # serde_json holds no wider integer
    if math.isinf(as_float):
        raise MalformedJson("a number is out of the f64 range")
    return as_float


def _parse_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise MalformedJson("a number is out of the f64 range")  # serde_json: NumberOutOfRange
    return number


def _refuse_constant(name: str) -> Any:
    raise MalformedJson(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise MalformedJson("an object repeats a key")
    return result


_decoder = json.JSONDecoder(
    object_pairs_hook=_unique_keys,
    parse_int=_parse_int,
    parse_float=_parse_float,
    parse_constant=_refuse_constant,
    strict=True,
)


def loads(data: bytes | str) -> Any:
    """Decode received JSON strictly, with serde_json's number semantics; MalformedJson.

    Bytes already in canonical form (what every AIP signer here and upstream sends) are
    read by msgspec (`_canonical_loads`), several times faster; anything else by the exact
    reader below."""
    if type(data) is bytes:
        value = _canonical_loads(data)
        if value is not _NOT_CANONICAL:
            return value
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedJson("not valid UTF-8") from None
    else:
        text = data
        try:
            text.encode("utf-8")  # a str may hold raw lone surrogates; decoded bytes cannot
        except UnicodeEncodeError:
            raise MalformedJson("a string holds a lone surrogate") from None
    try:
        value = _decoder.decode(text)
    except MalformedJson:
        raise
    except RecursionError:
        raise MalformedJson(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # json.JSONDecodeError; its text names a position, no payload
        raise MalformedJson(f"not JSON: {exc}") from None
    # Both checks walk the value, so they run only when the text could need them: more
    # brackets than the depth limit, or an escape that could be a lone surrogate (valid
    # UTF-8 text holds no raw ones).
    if text.count("{") + text.count("[") >= MAX_DEPTH:
        _check_depth(value, 0)
    if _SURROGATE_ESCAPE.search(text) is not None:
        _check_strings(value)
    return value


_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")

_NOT_CANONICAL: Final = object()
_plain_decoder = msgspec.json.Decoder()
#: An integer of 19 digits or more may lie beyond i64/u64, which msgspec keeps as an int
#: and serde_json reads as an f64: such a document takes the exact reader. Found as a run
#: of 19 zeros once every digit is a zero and nothing else is (a regular expression took
#: ten times as long).
_DIGITS_AS_ZERO: Final = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x78 for byte in range(256))
_LONG_DIGITS: Final = b"0" * 19


def _canonical_loads(data: bytes) -> Any:
    """`data` decoded by msgspec when it is exactly the canonical JSON of what msgspec read
    (the printer, `plain_bytes`, gives it back byte for byte); else `_NOT_CANONICAL`.

    On canonical bytes the two readers cannot differ: a repeated key, `-0`, a number not
    in shortest form, an escape that could be a lone surrogate, insignificant whitespace
    or unsorted keys would each print differently from the text read, so such text goes
    to the exact reader, which also names the problem. What printing back cannot see is
    checked apart: integers beyond i64/u64 (`_LONG_DIGITS`) and the depth limit."""
    if _LONG_DIGITS in data.translate(_DIGITS_AS_ZERO):
        return _NOT_CANONICAL
    try:
        value = _plain_decoder.decode(data)
        if _sorted_encoder.encode(value) != data:
            return _NOT_CANONICAL
    except (msgspec.MsgspecError, ValueError, TypeError, RecursionError):
        return _NOT_CANONICAL  # the exact reader decides, and says why
    if data.count(b"{") + data.count(b"[") >= MAX_DEPTH:
        try:
            _check_depth(value, 0)
        except MalformedJson:
            return _NOT_CANONICAL  # the exact reader refuses it too, and says why
    return value


def _check_depth(value: Any, depth: int) -> None:
    """serde_json's recursion limit (which `json` does not have)."""
    kind = type(value)
    if kind is dict or kind is list:
        if depth >= MAX_DEPTH:
            raise MalformedJson(f"nested deeper than {MAX_DEPTH} levels")
        for item in value.values() if kind is dict else value:
            _check_depth(item, depth + 1)


def _check_strings(value: Any) -> None:
    """Lone surrogates, which `json` decodes from `\\ud800`-style escapes and serde_json refuses."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            _check_text(key)
            _check_strings(item)
    elif kind is list:
        for item in value:
            _check_strings(item)
    elif kind is str:
        _check_text(value)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedJson("a string holds a lone surrogate escape") from None


# --- what the reference verifier would read back differently ------------------------------

_POW10: Final = tuple(float(f"1e{exponent}") for exponent in range(309))


def serde_json_reads_back(value: float) -> bool:
    """Whether serde_json's default float parser (no `float_roundtrip` feature, as upstream
    builds it) reads the canonical text of `value` back as `value`.

    It computes `significand as f64` then one multiply or divide by a power of ten, which
    is off by one ulp for some 16-17 digit values; the reference verifier then re-prints a
    neighbouring float and a correct signature fails there (our verifier reads exactly)."""
    if not math.isfinite(value) or value == 0.0:
        return math.isfinite(value)
    text = format_float(abs(value))
    mantissa, _, exponent_text = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    significand = int(whole + fraction)
    exponent = (int(exponent_text) if exponent_text else 0) - len(fraction)
    number = float(significand)
    while True:
        if abs(exponent) < len(_POW10):
            number = number * _POW10[exponent] if exponent >= 0 else number / _POW10[-exponent]
            break
        if number == 0.0:
            break
        if exponent >= 0:
            return False  # serde_json: NumberOutOfRange
        number /= 1e308
        exponent += 308
    return number == abs(value)


def portability_problems(value: Any, path: str = "$") -> list[str]:
    """JSON paths of numbers the reference implementation would not carry unchanged: floats
    its parser reads back as another float, integers beyond i64/u64 (it holds an f64)."""
    problems: list[str] = []
    _find_unportable(value, path, problems)
    return problems


def _find_unportable(value: Any, path: str, problems: list[str]) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if not _I64_MIN <= value <= _U64_MAX:
            problems.append(f"{path}: integer beyond i64/u64")
    elif isinstance(value, float):
        if not serde_json_reads_back(value):
            problems.append(f"{path}: float {format_float(value)} is read back changed")
    elif isinstance(value, dict):
        for key in sorted(value):
            _find_unportable(value[key], f"{path}.{key}", problems)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _find_unportable(item, f"{path}[{index}]", problems)


def require_portable(value: Any) -> None:
    """Raise UnportableNumber naming the first number the reference would carry changed."""
    problems = portability_problems(value)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UnportableNumber(f"{problems[0]}{more}")
