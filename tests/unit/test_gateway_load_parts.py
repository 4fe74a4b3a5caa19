"""The pure parts behind issue 27's gateway and ingress fixes: the follow cap, the chunk
chain `aip_action_events` passes, the credential redaction both channel directions use."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from schemas.chunk import DataChunk, DoneChunk
from schemas.errors import ErrorCode
from worker.channel.redaction import scrub, scrub_text
from worker.errors import ConnectorError
from worker.gateway.chunk_reads import ChunkReader
from worker.gateway.follow_limits import FollowLimits
from worker.gateway.principals import Principal
from worker.wire.chunks import encode_chunk

ACTION = "act_" + "1" * 32


def principal(principal_id: str, tenant_id: str | None = None) -> Principal:
    return Principal(
        principal_id=principal_id,
        principal_kind="agent",
        tenant_id=tenant_id,
        authentication_issuer="test",
        revision=1,
        scopes=frozenset(),
        expires_at_unix_ms=2**40,
    )


def test_the_follow_cap_is_per_principal_and_tenant_and_freed_on_exit() -> None:
    limits = FollowLimits(2)
    a, a_in_b, other = principal("a"), principal("a", "tenant-b"), principal("o")
    with limits.hold(a), limits.hold(a):
        with pytest.raises(ConnectorError) as refused, limits.hold(a):
            pass
        assert refused.value.code is ErrorCode.HOST_CAPACITY
        assert limits.try_take(a_in_b)  # the same id in another tenant is another principal
        assert limits.try_take(other)
    assert limits.held(a) == 0
    with limits.hold(a):
        assert limits.held(a) == 1


def _chain(texts: list[str | None], action_id: str = ACTION) -> list[bytes]:
    out: list[bytes] = []
    prev = None
    for seq, text in enumerate(texts):
        common = {
            "action_id": action_id,
            "endpoint_id": "h1",
            "seq": seq,
            "prev_sha256": prev,
            "ts_unix_ms": 1,
        }
        chunk = DoneChunk(**common) if text is None else DataChunk(payload=text, **common)
        data = encode_chunk(chunk)
        out.append(data)
        prev = hashlib.sha256(data).hexdigest()
    return out


def test_the_chain_forward_leaves_out_what_does_not_link_and_what_does_not_decode() -> None:
    real = _chain(["a", "b", None])
    reader = ChunkReader(ACTION)
    for data in (
        real[0],
        b"\xff\xfe not json",
        b'{"kind": "data"}',
        _chain(["a", "b"], action_id="act_" + "2" * 32)[1],  # another Action's chunk
        _chain(["x", "y"])[1],  # seq 1 naming another chunk 0
        real[1],
        real[1],  # a republish
        real[2],
    ):
        reader.add(data)
    assert reader.skipped == 3
    assert [link.document.get("payload") for link in reader.forward()] == ["a", "b", None]


def test_the_chain_backward_from_the_result_drops_a_fork_that_won_the_race() -> None:
    real = _chain(["a", "b", None])
    forged = _chain(["a", "forged", None])  # links to the real chunk 0
    reader = ChunkReader(ACTION)
    for data in (real[0], forged[1], forged[2], real[1], real[2]):
        reader.add(data)
    assert [link.document.get("payload") for link in reader.forward()] == ["a", "forged", None]
    walked = reader.backward(hashlib.sha256(real[2]).hexdigest())
    assert walked is not None
    assert [link.document.get("payload") for link in walked] == ["a", "b", None]
    # A result naming a chunk that is not stored (or a gap back to 0) walks to nothing.
    assert reader.backward("0" * 64) is None
    gap = ChunkReader(ACTION)
    gap.add(real[2])
    assert gap.backward(hashlib.sha256(real[2]).hexdigest()) is None


@pytest.mark.aip_family("errors_uncertain_outcomes", assertions=["error_secrets_redacted"])
def test_credentials_are_redacted_in_json_and_in_free_text() -> None:
    assert scrub({"api_key": "k", "nested": [{"Password": "p", "ok": 1}]}) == {
        "api_key": "[redacted]",
        "nested": [{"Password": "[redacted]", "ok": 1}],
    }
    as_json = scrub_text(json.dumps({"client_secret": "s3", "result": "fine"}))
    assert json.loads(as_json) == {"client_secret": "[redacted]", "result": "fine"}
    text = (
        "ok\nAuthorization: Bearer abc.def.ghi123\nAWS_SECRET_ACCESS_KEY=AKIAxyz123\n"
        'curl -H "X-Api-Key: zz-99-top" https://x\ntoken = "t0k3n-value"; next'
    )
    redacted = scrub_text(text)
    for secret in ("abc.def.ghi123", "AKIAxyz123", "zz-99-top", "t0k3n-value"):
        assert secret not in redacted
    assert redacted.startswith("ok\n")
    assert redacted.endswith("; next")
    assert scrub_text("nothing to hide here") == "nothing to hide here"
    assert scrub_text('{"unterminated": ') == '{"unterminated": '


def test_redaction_stays_linear_on_hostile_text() -> None:
    """A provider chooses the text: 192 KB of word characters, dots or near-misses must
    not make the pattern backtrack quadratically."""
    for hostile in ("a" * 192_000, "a." * 96_000, "tokentoken" * 19_200, "secret:" * 27_000):
        started = time.process_time()
        scrub_text(hostile)
        assert time.process_time() - started < 1.0
