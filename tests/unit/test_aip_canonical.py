"""AIP 1.0 canonical JSON (worker/aip/canonical.py): serde_json's printing, not RFC 8785.

Every expected text below is written out by hand from serde_json 1.0.150's rules (zmij
floats: ryu digits and layout, `+` on a positive exponent), never produced by the code
under test.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.aip.canonical import (
    MAX_DEPTH,
    canonical_bytes,
    canonical_text,
    format_float,
    loads,
    portability_problems,
    require_portable,
    serde_json_reads_back,
)
from worker.aip.errors import MalformedJson, NotCanonicalizable, UnportableNumber


def test_upstream_example_sorts_at_every_depth_and_keeps_signature() -> None:
    # aip-crypto's unit test: plain canonicalisation omits nothing.
    value = {"b": 1, "signature": "drop", "a": {"d": 4, "c": 3}}
    assert canonical_bytes(value) == b'{"a":{"c":3,"d":4},"b":1,"signature":"drop"}'


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"\\/', '"\\"\\\\/"'),  # quote and backslash escaped, solidus raw
        ("\b\f\n\r\t", '"\\b\\f\\n\\r\\t"'),
        ("\x00\x01\x1f", '"\\u0000\\u0001\\u001f"'),  # lowercase hex
        ("\x7f\u2028\u2029", '"\x7f\u2028\u2029"'),  # DEL and line separators raw
        ("é日本😀", '"é日本😀"'),  # non-ASCII raw UTF-8, no \\u escapes
    ],
)
def test_strings_escape_as_serde_json(value: str, expected: str) -> None:
    assert canonical_bytes(value) == expected.encode("utf-8")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1.0"),
        (100.0, "100.0"),
        (0.1, "0.1"),
        (-0.0, "-0.0"),
        (0.0, "0.0"),
        (123.456, "123.456"),
        (0.30000000000000004, "0.30000000000000004"),
        (1e15, "1000000000000000.0"),
        (1.5e15, "1500000000000000.0"),
        (1e16, "1e+16"),  # plain notation ends at 1e16
        (1.2345678901234568e17, "1.2345678901234568e+17"),
        (1e21, "1e+21"),
        (1e-5, "0.00001"),  # Python writes 1e-05
        (1.5e-5, "0.000015"),
        (1e-6, "1e-6"),  # Python writes 1e-06
        (1e-7, "1e-7"),
        (-2.5e-10, "-2.5e-10"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (5e-324, "5e-324"),
    ],
)
def test_floats_print_as_serde_json(value: float, expected: str) -> None:
    assert format_float(value) == expected
    assert canonical_bytes(value) == expected.encode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0"),
        (-(2**63), "-9223372036854775808"),
        (2**64 - 1, "18446744073709551615"),
        (2**64, "1.8446744073709552e+19"),  # beyond u64 serde_json holds an f64
        (-(2**63) - 1, "-9.223372036854776e+18"),
        (True, "true"),
        (None, "null"),
    ],
)
def test_integers_and_literals(value: Any, expected: str) -> None:
    assert canonical_bytes(value) == expected.encode()


def test_keys_sort_by_utf8_bytes_not_utf16_units() -> None:
    # U+FFFF sorts before U+1F600 in UTF-8 (and code points); RFC 8785 (UTF-16) reverses them.
    value = {"😀": 3, "\uffff": 4, "é": 1, "z": 2, "Z": 0, "": 5}
    assert canonical_bytes(value) == '{"":5,"Z":0,"z":2,"é":1,"\uffff":4,"😀":3}'.encode()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-0", "-0.0"),  # serde_json turns -0 into the float -0.0
        ("-0.0", "-0.0"),
        ("1e2", "100.0"),
        ("1E5", "100000.0"),
        ("1.50", "1.5"),
        ("1e-400", "0.0"),
        ("18446744073709551616", "1.8446744073709552e+19"),
        ("-9223372036854775809", "-9.223372036854776e+18"),
        (' { "b" : [ 1 , 2 ] , "a" : "\\u00e9\\/" } ', '{"a":"é/","b":[1,2]}'),
    ],
)
def test_decoding_follows_serde_json_numbers(text: str, expected: str) -> None:
    assert canonical_bytes(loads(text.encode())) == expected.encode()


@pytest.mark.parametrize(
    "data",
    [
        b"NaN",
        b"[Infinity]",
        b"1e400",  # serde_json: number out of range
        b'{"a":1,"a":2}',  # ambiguous: refused, not last-wins
        b'"\\ud800"',  # lone surrogate
        b"\xff",  # not UTF-8
        "\ufeff{}".encode(),  # BOM
        b"[1,]",
        b"01",
        b"{} x",
        b'"tab\there"',  # raw control character
    ],
)
def test_decoding_refuses_what_serde_json_refuses(data: bytes) -> None:
    with pytest.raises(MalformedJson):
        loads(data)


def test_lone_surrogates_are_refused_however_they_arrive() -> None:
    for data in ('{"k": ["ok", "\\udc00"]}', '{"\\ud83d": 1}', '["\ud800"]'):
        with pytest.raises(MalformedJson):
            loads(data)
    assert loads('"\\ud83d\\ude00"') == "😀"  # a pair is one character


def test_depth_limit_is_serde_jsons() -> None:
    assert loads(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    with pytest.raises(MalformedJson):
        loads(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    with pytest.raises(MalformedJson):
        loads(b'{"a":' * 2000 + b"1" + b"}" * 2000)
    with pytest.raises(MalformedJson):  # wide documents are walked too
        loads(b"[" + b"[]," * 200 + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"]")
    deep: Any = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    with pytest.raises(NotCanonicalizable):
        canonical_bytes(deep)


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, {1: "a"}, {"a": {b"k": 1}}, {1, 2}, b"raw", "\ud800", {"k": object()}],
)
def test_values_without_canonical_form_are_refused(value: Any) -> None:
    with pytest.raises(NotCanonicalizable):
        canonical_bytes(value)


def test_unportable_numbers_are_named() -> None:
    # 2**53 + 1 as a float cannot exist; a 17-digit value whose significand exceeds 2**53
    # may be misread by serde_json's default parser. Find one and check both reports.
    misread = next(
        x
        for x in (0.1 * k + 0.000123456789 for k in range(1, 10_000))
        if not serde_json_reads_back(x)
    )
    value = {"ok": [0.1, 1e21, 5], "bad": misread, "big": 2**70}
    assert portability_problems(value) == [
        f"$.bad: float {format_float(misread)} is read back changed",
        "$.big: integer beyond i64/u64",
    ]
    with pytest.raises(UnportableNumber):
        require_portable(value)
    require_portable({"ok": [0.1, 0.2, 1e-7, 1e21, -0.0, 2**63]})


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(json_values)
def test_canonicalisation_is_idempotent(value: Any) -> None:
    first = canonical_bytes(value)
    assert canonical_bytes(loads(first)) == first


@settings(max_examples=300)
@given(json_values)
def test_fast_path_prints_exactly_what_the_exact_printer_prints(value: Any) -> None:
    exact = canonical_text(value).encode("utf-8")
    assert canonical_bytes(value) == exact
    assert canonical_bytes(loads(exact)) == exact


@pytest.mark.parametrize(
    "value",
    [
        [1e21, {"k": 1.5e300}],  # positive exponents: msgspec would write 1e21
        ("tuple", 2**70, -0.0),  # not plain: the exact printer
        [9999999999999998.0, 1e16, -1e16, 1e-7, 5e-324],  # around the switch to exponents
        1e16,
    ],
)
def test_both_paths_agree_where_msgspec_differs(value: Any) -> None:
    assert canonical_bytes(value) == canonical_text(value).encode("utf-8")


@settings(max_examples=500)
@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_every_double_prints_shortest_round_trip_like_msgspecs_ryu(bits: int) -> None:
    value = struct.unpack("<d", bits.to_bytes(8, "little"))[0]
    if not math.isfinite(value):
        return
    text = format_float(value)
    assert float(text) == value
    assert json.loads(text) == value
    # msgspec carries its own ryu port; it differs only in writing `e21` for `e+21`.
    assert text.replace("e+", "e") == msgspec.json.encode(value).decode()


@settings(max_examples=300)
@given(json_values)
def test_canonical_bytes_are_read_as_the_exact_reader_reads_them(value: Any) -> None:
    # Bytes read msgspec's way (`loads` of canonical bytes) and the exact reader's way (a
    # str always takes it): the same values, to the type and the sign of a zero.
    data = canonical_bytes(value)
    assert repr(loads(data)) == repr(loads(data.decode()))


@pytest.mark.parametrize(
    "data",
    [
        b"[18446744073709551615]",  # u64 max: an integer
        b"[18446744073709551616]",  # one more: serde_json's f64
        b"[-9223372036854775809]",
        b'{"a":-0.0,"b":-0}',
        b"[1e+16,1.5e-7,100.0,1e2]",
        b'{"b":1,"a":2}',  # unsorted
        b'{"a":1,"a":1}',  # repeated
        b'{"a": 1}',  # whitespace
        b'"\\u00e9\\/"',
        b'["\\ud83d\\ude00"]',
        b"[" * MAX_DEPTH + b"]" * MAX_DEPTH,
    ],
)
def test_non_canonical_or_borderline_bytes_read_as_the_exact_reader_reads_them(
    data: bytes,
) -> None:
    try:
        exact: Any = repr(loads(data.decode()))
    except MalformedJson as exc:
        exact = MalformedJson(str(exc))
    try:
        read: Any = repr(loads(data))
    except MalformedJson as exc:
        read = MalformedJson(str(exc))
    assert type(read) is type(exact)
    assert str(read) == str(exact)
