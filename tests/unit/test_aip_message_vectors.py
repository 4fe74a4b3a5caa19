"""The Envelope vectors of the message types on our subjects
(tests/vectors/aip/message_envelopes.json, written by hand by make_vectors.py from the
published rules) against the exported JSON Schemas (`schemas/json/aip.core.v1.*.json`,
checked with the `jsonschema` library, a validator this project did not write) and against
our readers: a valid one passes both and decodes; an invalid one is refused by both.

Signatures are checked from the rules (Ed25519 over the canonical JSON, PyNaCl) as well as
by `worker.aip`, so neither side of a check is only the project's own codec."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import nacl.exceptions
import nacl.signing
import pytest
from jsonschema import Draft202012Validator

from schemas.aip.extensions import ALWAYS_CARRIED, EXTENSION_KEY, EXTENSIONS
from schemas.aip.messages import open_body, open_signed_body, payload_builtins
from schemas.errors import BodyError, EnvelopeRejected, ErrorCode
from schemas.export import AIP_EXPORTED, JSON_DIR
from worker.aip import AipSigner, signing_bytes, verify_envelope
from worker.aip.envelope import check_envelope
from worker.aip.errors import AipWireError
from worker.wire import envelopes

ROOT = Path(__file__).parents[2]
VECTORS = json.loads(
    (ROOT / "tests" / "vectors" / "aip" / "message_envelopes.json").read_text("utf-8")
)["message_types"]
REFUSERS = {"check_envelope", "open_body", "signed_form"}


def _schema(message_type: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((JSON_DIR / f"{message_type}.json").read_text("utf-8"))
    return loaded


def _validator(message_type: str) -> Draft202012Validator:
    return Draft202012Validator(
        _schema(message_type), format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def _cases(kind: str) -> list[Any]:
    return [
        pytest.param(message_type, case, id=f"{message_type}:{index}")
        for message_type, cases in VECTORS.items()
        for index, case in enumerate(cases[kind])
    ]


def _rules_canonical(value: Any) -> bytes:
    # The vectors hold ASCII keys, strings and integers only (make_vectors.py): for those,
    # sorted compact json.dumps is serde_json's canonical text.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _rules_verifies(data: bytes, signature: str, seed: int) -> bool:
    key = nacl.signing.SigningKey(bytes([seed]) * 32).verify_key
    try:
        key.verify(data, base64.b64decode(signature))
    except nacl.exceptions.BadSignatureError:
        return False
    return True


def _unsigned(envelope: dict[str, Any]) -> dict[str, Any]:
    copy = json.loads(json.dumps(envelope))
    del copy["security"]["signature"]
    return copy


def _payload(envelope: dict[str, Any]) -> Any:
    return next(iter(envelope["body"].values()))


# --- the schemas -----------------------------------------------------------------------------


def test_every_published_message_type_has_valid_and_invalid_vectors() -> None:
    assert set(VECTORS) == set(AIP_EXPORTED)
    for message_type, cases in VECTORS.items():
        assert cases["schema"] == f"schemas/json/{message_type}.json"
        assert cases["valid"], message_type
        assert {case["refused_by"] for case in cases["invalid"]} == REFUSERS, message_type
        names = " ".join(case["name"] for case in cases["invalid"])
        for rule in ("unknown field at the top", "unknown field", "wrong body key",
                     "wrong aip_version", "null for an absent optional", "missing required",
                     "wrong enum value"):  # fmt: skip
            assert rule in names, (message_type, rule)


def _walk(node: Any, path: str, found: list[str], open_objects: set[str]) -> None:
    if isinstance(node, dict):
        properties = node.get("properties")
        if isinstance(properties, dict):
            for name, prop in properties.items():
                if not isinstance(prop, dict) or not prop.get("description"):
                    found.append(f"{path}.properties.{name}: no description")
            if path not in open_objects and node.get("additionalProperties") is not False:
                found.append(f"{path}: not closed")
        for key, value in node.items():
            _walk(value, f"{path}.{key}", found, open_objects)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _walk(value, f"{path}[{index}]", found, open_objects)


@pytest.mark.parametrize("message_type", AIP_EXPORTED)
def test_the_envelope_schema_is_closed_described_and_of_one_message_type(
    message_type: str,
) -> None:
    schema = _schema(message_type)
    Draft202012Validator.check_schema(schema)
    found: list[str] = []
    # The two free slots that describe some keys and leave the rest free (§1.0.3).
    _walk(schema, "$", found, {"$.properties.security", "$.properties.extensions"})
    assert found == []
    assert schema["properties"]["message_type"]["const"] == message_type
    assert schema["properties"]["aip_version"]["const"] == "1.0"
    body = schema["properties"]["body"]
    assert len(body["properties"]) == 1
    assert body["required"] == list(body["properties"])
    extension = schema["properties"]["extensions"].get("properties", {})
    assert (EXTENSION_KEY in extension) == (message_type in EXTENSIONS)
    carried = "extensions" in schema["required"]
    assert carried == (message_type in ALWAYS_CARRIED)
    assert carried == (schema["properties"]["extensions"].get("required") == [EXTENSION_KEY])
    for free in ("trace",):
        assert set(schema["properties"][free]) == {"description"}


def test_the_extension_key_is_the_one_the_wire_writes() -> None:
    assert EXTENSION_KEY == envelopes.EXTENSION_KEY


# --- valid vectors --------------------------------------------------------------------------


@pytest.mark.parametrize(("message_type", "case"), _cases("valid"))
def test_a_valid_envelope_passes_the_schema_and_decodes(
    message_type: str, case: dict[str, Any]
) -> None:
    envelope = case["envelope"]
    _validator(message_type).validate(envelope)
    check_envelope(envelope)
    payload = open_signed_body(message_type, envelope["body"])
    assert payload_builtins(payload) == (message_type, envelope["body"])
    extension = envelope.get("extensions", {}).get(EXTENSION_KEY)
    if extension is not None:
        msgspec.convert(extension, EXTENSIONS[message_type], strict=True)
    assert extension is not None or message_type not in ALWAYS_CARRIED
    if case["seed"] is None:
        assert "security" not in envelope
        return
    did = case["did"]
    seed = bytes([case["seed"]]) * 32
    assert AipSigner.from_seed(seed).did == did
    assert envelope["from"]["did"] == envelope["security"]["did"] == did
    # From the rules: the signature covers the canonical JSON without security.signature.
    assert _rules_canonical(_unsigned(envelope)) == case["signing_bytes"].encode()
    signature = envelope["security"]["signature"]
    assert _rules_verifies(case["signing_bytes"].encode(), signature, case["seed"])
    # And the project's verifier agrees, bytes included.
    assert signing_bytes(envelope) == case["signing_bytes"].encode()
    assert verify_envelope(envelope, expected=did).did == did


def test_the_chunk_chain_and_the_result_anchor_are_the_published_bytes() -> None:
    action = VECTORS["aip.core.v1.action"]["valid"][0]["envelope"]
    chunk0, chunk1, _ = (case["envelope"] for case in VECTORS["aip.core.v1.stream_chunk"]["valid"])
    result = VECTORS["aip.core.v1.action_result"]["valid"][0]["envelope"]

    def sha(envelope: dict[str, Any]) -> str:
        return hashlib.sha256(_rules_canonical(envelope)).hexdigest()

    assert "prev_sha256" not in chunk0["extensions"][EXTENSION_KEY]
    assert chunk1["extensions"][EXTENSION_KEY]["prev_sha256"] == sha(chunk0)
    ours = result["extensions"][EXTENSION_KEY]
    assert ours["last_chunk_sha256"] == sha(chunk1)
    assert ours["action_sha256"] == sha(action)
    assert result["in_response_to"] == action["message_id"]
    assert result["to"] == action["from"]
    assert result["correlation_id"] == action["correlation_id"]


# --- invalid vectors ------------------------------------------------------------------------


@pytest.mark.parametrize(("message_type", "case"), _cases("invalid"))
def test_an_invalid_envelope_is_refused_by_the_schema_and_by_our_readers(
    message_type: str, case: dict[str, Any]
) -> None:
    envelope = case["envelope"]
    assert list(_validator(message_type).iter_errors(envelope)), "the schema accepts it"
    refused_by = case["refused_by"]
    wire = json.dumps(envelope).encode()
    if refused_by == "check_envelope":
        with pytest.raises(AipWireError):
            check_envelope(envelope)
        with pytest.raises(EnvelopeRejected) as refused:
            envelopes.open_envelope(wire, message_types=frozenset({message_type}))
        assert refused.value.code is ErrorCode.SCHEMA_ENVELOPE_INVALID
        return
    check_envelope(envelope)  # the frame is fine: the payload is what is wrong
    if case["seed"] is not None:  # and a refusal is never the signature's doing
        verify_envelope(envelope, expected=AipSigner.from_seed(bytes([case["seed"]]) * 32).did)
    if refused_by == "open_body":
        with pytest.raises(BodyError):
            open_body(message_type, envelope["body"])
        return
    assert refused_by == "signed_form"
    # Upstream reads the body (a null or [] is an absent optional there) ...
    open_body(message_type, envelope["body"])
    # ... but verifies over its re-serialization, which omits that field: the signature,
    # good over the bytes as sent (our verifier takes the body as given), fails there.
    signature, seed = envelope["security"]["signature"], case["seed"]
    assert _rules_canonical(_unsigned(envelope)) == case["signing_bytes"].encode()
    assert _rules_verifies(case["signing_bytes"].encode(), signature, seed)
    upstream = case["upstream_signing_bytes"].encode()
    assert upstream != case["signing_bytes"].encode()
    assert not _rules_verifies(upstream, signature, seed)
    with pytest.raises(BodyError, match="not as upstream re-serializes it"):
        open_signed_body(message_type, envelope["body"])


@pytest.mark.parametrize(
    ("why", "mutate"),
    [
        ("no identity", lambda action: action.pop("identity")),
        ("no actor", lambda action: action["identity"].pop("human_actor")),
        (
            "two actors",
            lambda action: action["identity"].update(
                service_account={"id": "service:x", "kind": "service"}
            ),
        ),
        ("an id not act_ + 32 hex", lambda action: action.update(id="act_1")),
        ("a capability of another connector", lambda action: action.update(capability_id="x")),
        ("a timeout over a day", lambda action: action.update(timeout_ms=86_400_001)),
    ],
)
def test_the_action_schema_holds_an_action_to_what_our_subject_takes(why: str, mutate: Any) -> None:
    """Beyond AIP's Action: what the actions subject's reader requires (the internal
    Action's constraints), so a publisher finds out before its Action is dead-lettered."""
    envelope = json.loads(json.dumps(VECTORS["aip.core.v1.action"]["valid"][0]["envelope"]))
    validator = _validator("aip.core.v1.action")
    validator.validate(envelope)
    mutate(envelope["body"]["action"])
    assert list(validator.iter_errors(envelope)), why
    open_body("aip.core.v1.action", envelope["body"])  # AIP itself allows it


# --- what we write is what we publish -------------------------------------------------------


@pytest.mark.parametrize(("message_type", "case"), _cases("valid"))
def test_seal_frames_a_payload_as_the_schema_describes(
    message_type: str, case: dict[str, Any]
) -> None:
    """`worker.wire.envelopes.seal`, the one place an Envelope is framed, writes documents
    the published schema accepts (signed or not)."""
    envelope = case["envelope"]
    signer = AipSigner.from_seed(bytes([case["seed"] or 7]) * 32)
    sender = {k: v for k, v in envelope["from"].items() if k != "did"}
    for sign in (signer, None):
        data = envelopes.seal(
            message_type,
            _payload(envelope),
            sender=sender,
            signer=sign,
            to=envelope.get("to"),
            correlation_id=envelope.get("correlation_id"),
            in_response_to=envelope.get("in_response_to"),
            extension=envelope.get("extensions", {}).get(EXTENSION_KEY),
        )
        _validator(message_type).validate(json.loads(data))


def test_the_cancel_vectors_decode_and_their_answers_follow_the_reply_recipe() -> None:
    """A Cancel names the Action in its target and the requester in its signed `from`; the
    answers (a result, an error) are bound to it by in_response_to, to and correlation_id."""
    from worker.wire.cancels import decode_cancel, decode_cancel_reply

    cancel_case, minimal_case = VECTORS["aip.core.v1.cancel"]["valid"]
    cancel = cancel_case["envelope"]
    request = decode_cancel(_rules_canonical(cancel))
    assert (request.action_id, request.requested_by, request.reason, request.wait_ms) == (
        cancel["body"]["cancel"]["target"]["action"],
        "user:alice",
        "changed my mind",
        10000,
    )
    assert request.opened.verified is not None
    assert request.opened.verified.did == cancel_case["did"]
    minimal = decode_cancel(_rules_canonical(minimal_case["envelope"]))
    assert (minimal.reason, minimal.wait_ms) == ("", None)
    result = VECTORS["aip.core.v1.action_result"]["valid"][2]["envelope"]
    error = VECTORS["aip.core.v1.error"]["valid"][1]["envelope"]
    for answer in (result, error):
        assert answer["in_response_to"] == cancel["message_id"]
        assert answer["to"] == cancel["from"]
        assert answer["correlation_id"] == cancel["correlation_id"]
    settled, _ = decode_cancel_reply(_rules_canonical(result))
    assert settled.result is not None
    assert (settled.accepted, settled.state, settled.result.status.value) == (
        True,
        "running",
        "cancelled",
    )
    pending, _ = decode_cancel_reply(_rules_canonical(error))
    assert pending.error is not None
    assert (pending.accepted, pending.state, pending.error.code.value) == (
        True,
        "running",
        "connector_host.not_ready",
    )
    assert pending.error.retryable is True


def test_the_dlq_vectors_decode_and_a_contradicting_entry_is_refused() -> None:
    """A DLQ entry names the refused bytes by size and sha256 and keeps their first bytes:
    the reader takes the vectors (one whole, one truncated) and refuses an entry whose kept
    bytes contradict its sha256, whose state is not `dead_lettered`, or whose message_id is
    not the entry id's."""
    from worker.wire.dead_letters import decode_dead_letter

    cases = [
        case
        for case in VECTORS["aip.lifecycle.v1.action_status"]["valid"]
        if "dead_letter" in case["envelope"]["extensions"][EXTENSION_KEY]
    ]
    whole, _ = decode_dead_letter(_rules_canonical(cases[0]["envelope"]))
    facts = cases[0]["envelope"]["extensions"][EXTENSION_KEY]["dead_letter"]
    assert whole.action_id is None
    assert whole.whole
    assert whole.facts.kept == base64.b64decode(facts["kept"])
    assert hashlib.sha256(whole.facts.kept).hexdigest() == facts["sha256"]
    truncated, opened = decode_dead_letter(_rules_canonical(cases[1]["envelope"]))
    assert truncated.action_id == cases[1]["envelope"]["body"]["action_status"]["action_id"]
    assert not truncated.whole
    assert len(truncated.facts.kept) == 4096
    assert opened.verified is not None
    assert opened.verified.did == cases[1]["did"]

    def broken(mutate: Any) -> bytes:
        envelope = json.loads(json.dumps(cases[0]["envelope"]))
        envelope.pop("security")
        mutate(envelope)
        return _rules_canonical(envelope)

    def kept(data: bytes) -> Any:
        return lambda e: e["extensions"][EXTENSION_KEY]["dead_letter"].__setitem__(
            "kept", base64.b64encode(data).decode()
        )

    for mutate in (
        kept(b"x" * facts["size"]),  # whole, but not the bytes the sha256 names
        kept(b"x" * (facts["size"] + 1)),  # more bytes than the message had
        lambda e: e["body"]["action_status"].__setitem__("state", "failed"),
        lambda e: e.__setitem__("message_id", "msg_" + "0" * 32),
    ):
        with pytest.raises(EnvelopeRejected):
            decode_dead_letter(broken(mutate))


def test_the_receipt_vectors_decode_as_a_linked_segment_and_a_bent_one_is_refused() -> None:
    """The two receipt Envelopes are one segment: the signed one names the unsigned one's
    hash, and the reader recomputes every hash (a receipt whose data changed after its hash
    was taken, or whose root_hash is not its hash's, is refused)."""
    from worker.wire.receipts import decode_receipt

    opening, closing = (c["envelope"] for c in VECTORS["aip.audit.v1.receipt_chain"]["valid"])
    first, first_hash, unsigned = decode_receipt(_rules_canonical(opening))
    last, _, signed = decode_receipt(_rules_canonical(closing))
    assert unsigned.verified is None
    assert signed.verified is not None
    assert last.prev_sha256 == first_hash
    assert (first.event.value, last.event.value) == ("received", "settled")

    def bent(mutate: Any) -> bytes:
        envelope = json.loads(json.dumps(opening))
        mutate(envelope["body"]["receipt_chain"])
        return _rules_canonical(envelope)

    for mutate in (
        lambda chain: chain["receipts"][0]["data"].__setitem__("fence", 5),
        lambda chain: chain.__setitem__("root_hash", "0" * 64),
        lambda chain: chain.__setitem__("chain_id", "act_" + "f" * 32),
        lambda chain: chain["receipts"][0].__setitem__("receipt_type", "policy_decision"),
    ):
        with pytest.raises(EnvelopeRejected):
            decode_receipt(bent(mutate))
