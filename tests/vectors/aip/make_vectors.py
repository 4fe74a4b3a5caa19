"""Regenerate the AIP 1.0 vectors in this folder (see README.md), independently of the
project's codec: it imports nothing from `worker/`.

    .venv/bin/python tests/vectors/aip/make_vectors.py

The canonical texts are written out below by hand from the rules (upstream serde_json
1.0.150 printing); only the keys (PyNaCl from the upstream seeds), the base58btc of the
did:keys and the Ed25519 signatures over those literal bytes are computed. Ed25519 is
deterministic, so every run writes the same files.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import nacl.signing

HERE = Path(__file__).parent
UPSTREAM = "getaip/core"
CRYPTO = "crates/aip-crypto/src/lib.rs@e6222fc36ebd7d8a723d773606c073d5da9cd281"
PROPERTIES = (
    "crates/aip-crypto/tests/signature_properties.rs@e6222fc36ebd7d8a723d773606c073d5da9cd281"
)
GATEWAY = "crates/aip-gateway/src/lib.rs@a4ca776328e9f05ba771285577d80b97210ca142"
HOST = "crates/aip-connector-host/src/lib.rs@82c335499d0b40e17973ce92bf3a112fc5737080"
ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

SEEDS = {
    0: "did:key method spec, Ed25519 test vector (all-zero seed): the published did is checked",
    7: f"{CRYPTO} did_key_round_trips; {HOST} tests",
    9: f"{CRYPTO} signatures_verify; {GATEWAY} tests",
    11: f"{CRYPTO} envelope_signature_covers_application_signature_fields",
    17: f"{PROPERTIES}; {HOST} tests",
    21: f"{GATEWAY} tests",
    22: f"{GATEWAY} tests",
    91: f"{GATEWAY} native_http_client_rejects_fixed_and_streamed_oversized_responses (requester)",
    92: f"{GATEWAY} native_http_client_rejects_fixed_and_streamed_oversized_responses (peer)",
}


def b58(data: bytes) -> str:
    number, out = int.from_bytes(data, "big"), ""
    while number:
        number, rest = divmod(number, 58)
        out = ALPHABET[rest] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def key(seed: int) -> nacl.signing.SigningKey:
    return nacl.signing.SigningKey(bytes([seed]) * 32)


def did(seed: int) -> str:
    return "did:key:z" + b58(b"\xed\x01" + bytes(key(seed).verify_key))


def sign(seed: int, data: bytes) -> str:
    return base64.b64encode(key(seed).sign(data).signature).decode()


# --- canonical JSON: input text -> canonical text, both by hand ---------------------------

CANONICAL: list[dict[str, str]] = [
    {
        "name": "upstream unit test: keys sorted at every depth, signature kept",
        "source": f"{CRYPTO} canonical_json_sorts_keys_without_omitting_payload_fields",
        "input": '{"b": 1, "signature": "drop", "a": {"d": 4, "c": 3}}',
        "expected": '{"a":{"c":3,"d":4},"b":1,"signature":"drop"}',
    },
    {
        "name": "keys by UTF-8 bytes (U+FFFF before U+1F600; RFC 8785 reverses them)",
        "source": "serde_json String ordering",
        "input": '{"\\ud83d\\ude00": 3, "\\uffff": 4, "\\u00e9": 1, "z": 2, "Z": 0, "": 5}',
        "expected": '{"":5,"Z":0,"z":2,"é":1,"\uffff":4,"😀":3}',
    },
    {
        "name": "string escapes: short forms, lowercase \\u00xx, solidus/DEL/U+2028 raw",
        "source": "serde_json ser.rs ESCAPE table",
        "input": '["\\"\\\\\\/", "\\b\\f\\n\\r\\t", "\\u0000\\u0001\\u001F", "\\u007f\\u2028"]',
        "expected": '["\\"\\\\/","\\b\\f\\n\\r\\t","\\u0000\\u0001\\u001f","\x7f\u2028"]',
    },
    {
        "name": "non-ASCII written raw as UTF-8",
        "source": "serde_json ser.rs",
        "input": '{"text": "Gr\\u00fc\\u00dfe, \\u4e16\\u754c \\ud83d\\ude00"}',
        "expected": '{"text":"Grüße, 世界 😀"}',
    },
    {
        "name": "floats: plain between 1e-5 and 1e16, `e+` on positive exponents (zmij)",
        "source": "serde_json 1.0.150 + zmij 1.0.21 (upstream Cargo.lock)",
        "input": "[1.0, 100.0, 0.1, 123.456, 1e15, 1e16, 1e21, 1.2345678901234568e17,"
        " 1e-5, 1.5e-5, 1e-6, 1e-7, -2.5e-10, 1.7976931348623157e308, 5e-324]",
        "expected": "[1.0,100.0,0.1,123.456,1000000000000000.0,1e+16,1e+21,"
        "1.2345678901234568e+17,0.00001,0.000015,1e-6,1e-7,-2.5e-10,"
        "1.7976931348623157e+308,5e-324]",
    },
    {
        "name": "float spellings re-print: 1e2, 1E5, 1.50, 0.30000000000000004",
        "source": "serde_json parses to f64 and re-prints",
        "input": "[1e2, 1E5, 1.50, 0.30000000000000004, 1e-400]",
        "expected": "[100.0,100000.0,1.5,0.30000000000000004,0.0]",
    },
    {
        "name": "negative zero: -0 and -0.0 are the float -0.0",
        "source": "serde_json de.rs parse_number ('Convert into a float ... on -0')",
        "input": "[-0, -0.0, 0, 0.0]",
        "expected": "[-0.0,-0.0,0,0.0]",
    },
    {
        "name": "integers: i64/u64 range exact, beyond it an f64",
        "source": "serde_json Number (no arbitrary_precision)",
        "input": "[-9223372036854775808, 18446744073709551615, 18446744073709551616,"
        " -9223372036854775809]",
        "expected": "[-9223372036854775808,18446744073709551615,1.8446744073709552e+19,"
        "-9.223372036854776e+18]",
    },
    {
        "name": "whitespace and order of the input do not matter",
        "source": "compact output",
        "input": ' {\n "b" : [ 1 , { "y" : null , "x" : true } ] ,\t"a" : false } ',
        "expected": '{"a":false,"b":[1,{"x":true,"y":null}]}',
    },
]


# --- signatures: literal signing bytes, signed with the upstream seeds --------------------


def envelope_vectors() -> list[dict[str, Any]]:
    vectors = []
    d11 = did(11)
    bytes_11 = (
        '{"aip_version":"1.0","body":{"action":{"capability_id":"cap:test:signature",'
        '"id":"act_00000000000000000000000000000011","input":{"signature":"business-value"}}},'
        f'"from":{{"did":"{d11}","id":"service:test:signature","kind":"service"}},'
        '"message_id":"msg_00000000000000000000000000000011",'
        f'"message_type":"aip.core.v1.action","security":{{"did":"{d11}"}},'
        '"sent_at":"2026-12-01T00:00:00Z"}'
    )
    vectors.append(
        {
            "name": "Action whose input has a business field named signature",
            "source": f"{CRYPTO} envelope_signature_covers_application_signature_fields (seed 11); "
            "message_id/sent_at fixed here, `from` set as sign_native_envelope sets it",
            "seed": 11,
            "signing_bytes": bytes_11,
        }
    )
    d21 = did(21)
    bytes_21 = (
        '{"aip_version":"1.0","body":{"action":{"capability_id":"cap:hermes_agent:hermes-1:chat",'
        '"id":"act_00000000000000000000000000000021","input":{"amount":1e+21,'
        '"big":12345678901234567890,"neg_zero":-0.0,"ratio":0.00001,'
        '"text":"Grüße, 世界 😀 \\"quoted\\" \\\\ / \\n\\u0001","tiny":1e-7},"mode":"sync"}},'
        '"correlation_id":"corr_00000000000000000000000000000021",'
        f'"from":{{"did":"{d21}","id":"service:getaip:gateway","kind":"service",'
        '"trust_domain":"example.com"},'
        '"message_id":"msg_00000000000000000000000000000021",'
        f'"message_type":"aip.core.v1.action","security":{{"did":"{d21}",'
        '"trust_domain":"example.com"},"sent_at":"2026-12-01T00:00:00.5Z",'
        '"session_id":"sess_00000000000000000000000000000021",'
        '"to":{"id":"agent:hermes_operator:hermes-1","kind":"agent"}}'
    )
    vectors.append(
        {
            "name": "Action with floats, a big integer, -0.0 and non-ASCII text in input, "
            "security.trust_domain covered",
            "source": f"{GATEWAY} tests (seed 21), sign_peer_request's trust_domain; values here",
            "seed": 21,
            "signing_bytes": bytes_21,
        }
    )
    d92 = did(92)
    bytes_92 = (
        '{"aip_version":"1.0","body":{"action_result":{"action_id":'
        '"act_00000000000000000000000000000091","output":{"items":[1,2.5,null],"ok":true},'
        '"status":"completed"}},"correlation_id":"corr_00000000000000000000000000000091",'
        f'"from":{{"did":"{d92}","id":"service:test:bounded-peer","kind":"service"}},'
        '"in_response_to":"msg_00000000000000000000000000000091",'
        '"message_id":"msg_00000000000000000000000000000092",'
        f'"message_type":"aip.core.v1.action_result","security":{{"did":"{d92}"}},'
        '"sent_at":"2026-12-01T00:00:01Z",'
        '"to":{"id":"service:test:bounded-client","kind":"service"}}'
    )
    vectors.append(
        {
            "name": "signed reply (reply recipe: in_response_to, to = the request's from)",
            "source": f"{GATEWAY} verify_peer_response; seeds 91/92 of its bounded-client test",
            "seed": 92,
            "signing_bytes": bytes_92,
        }
    )
    for vector in vectors:
        data = vector["signing_bytes"].encode()
        vector["did"] = did(vector["seed"])
        vector["signature"] = sign(vector["seed"], data)
        signed = json.loads(data)
        signed["security"]["signature"] = vector["signature"]
        vector["signed_envelope"] = signed
    return vectors


def main() -> None:
    for case in CANONICAL:  # the hand-written expectation must at least be valid JSON
        json.loads(case["expected"])
    (HERE / "canonical.json").write_text(
        json.dumps({"upstream": UPSTREAM, "cases": CANONICAL}, indent=2, ensure_ascii=False) + "\n"
    )
    keys = [
        {
            "seed": seed,
            "seed_hex": (bytes([seed]) * 32).hex(),
            "public_key_hex": bytes(key(seed).verify_key).hex(),
            "did": did(seed),
            "source": src,
        }
        for seed, src in SEEDS.items()
    ]
    (HERE / "did_key.json").write_text(
        json.dumps({"upstream": UPSTREAM, "keys": keys}, indent=2) + "\n"
    )
    values = [
        {
            "name": 'sign_value over {"hello":"world"}',
            "source": f"{CRYPTO} signatures_verify (seed 9)",
            "seed": 9,
            "value": {"hello": "world"},
            "canonical": '{"hello":"world"}',
            "did": did(9),
            "signature": sign(9, b'{"hello":"world"}'),
        }
    ]
    (HERE / "signatures.json").write_text(
        json.dumps(
            {"upstream": UPSTREAM, "values": values, "envelopes": envelope_vectors()},
            indent=2,
            ensure_ascii=False,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
