"""Reading a result Envelope again after it was opened (`aip_result_of`,
`BelievedResult.envelope`) gives the numbers AIP's reader gives: serde_json holds no integer
beyond u64, so a wider one reads as the nearest f64, as `decode_result` read it the first
time. A plain `json.loads` kept it an int, so the two readings of one document differed.

Our own writer prints such a number as serde_json does (`1.1805916207174113e+21`); another
AIP writer may send the integer literal, which reads the same: the document below does."""

from __future__ import annotations

from schemas.chunk import ChunkKind, make_chunk
from schemas.ids import capability_id, new_action_id
from schemas.result import ActionResult, ResultStatus
from worker.client import BelievedResult
from worker.wire.chunks import aip_chunk_of, encode_chunk
from worker.wire.results import aip_result_of, decode_result, encode_result

ENDPOINT = "h1"
WIDE = 2**70  # beyond u64::MAX, inside the f64 range
#: How our writer prints WIDE (serde_json's f64), and the integer literal another may send.
PRINTED = b'"wide":1.1805916207174113e+21'
LITERAL = b'"wide":' + str(WIDE).encode()


def _result_bytes() -> bytes:
    action_id = new_action_id()
    result = ActionResult(
        action_id=action_id,
        capability=capability_id(ENDPOINT, "models"),
        endpoint_id=ENDPOINT,
        status=ResultStatus.COMPLETED,
        output={"wide": WIDE, "small": 7},
        settled_by="w1",
        fence=1,
        settled_at_unix_ms=1,
        action_sha256="0" * 64,
    )
    data = encode_result(result, action=None, signer=None, endpoint_id=ENDPOINT)
    assert PRINTED in data
    return data.replace(PRINTED, LITERAL)


def test_a_wide_integer_reads_as_f64_on_every_reading() -> None:
    data = _result_bytes()
    assert b'"wide":1180591620717411303424' in data
    first, _ = decode_result(data)
    again = aip_result_of(data)
    assert isinstance(again.output, dict)
    assert again.output["wide"] == float(WIDE)
    assert isinstance(again.output["wide"], float)
    assert again.output["small"] == 7
    assert isinstance(again.output["small"], int)
    believed = BelievedResult(result=first, data=data)
    assert believed.body["output"]["wide"] == float(WIDE)
    assert isinstance(believed.body["output"]["wide"], float)
    assert first.output is not None
    assert first.output["wide"] == float(WIDE)


def test_a_chunk_read_again_gives_the_same_wide_number() -> None:
    chunk = make_chunk(
        ChunkKind.DATA,
        action_id=new_action_id(),
        endpoint_id=ENDPOINT,
        seq=0,
        ts_unix_ms=1_700_000_000_000,
        payload={"wide": WIDE},
    )
    data = encode_chunk(chunk)
    assert PRINTED in data
    again = aip_chunk_of(data.replace(PRINTED, LITERAL))
    assert isinstance(again.data, dict)
    wide = again.data["hermes_worker"]["wide"]  # a payload that is not AIP text's own
    assert wide == float(WIDE)
    assert isinstance(wide, float)
