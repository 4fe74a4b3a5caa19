"""How a rejected envelope is kept on `aip.hermes.{endpoint}.dlq`.

The DLQ message body is the rejected payload byte for byte, up to the worker's
`AIPD_DLQ_KEEP_BYTES` (4 KiB by default): a refused payload is evidence, not something to
store whole for 30 days, so a larger one keeps its first bytes and is identified by its size
and sha256. Nothing is re-encoded; the reason travels in these headers so any NATS client
can read it.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The entry's own id (`dlq_` + 32 hex); receipts about an unauthenticated envelope are
#: filed under it (`aip.hermes.{endpoint}.audit.{dlq_id}`), not under the id it claims.
DLQ_ID = "Aip-Dlq-Id"
#: The error code (`schema.envelope.invalid`, `envelope.decode.invalid`, …).
DLQ_CODE = "Aip-Dlq-Code"
#: Why it was rejected, for people (bounded, no secrets).
DLQ_REASON = "Aip-Dlq-Reason"
#: The subject the envelope arrived on.
DLQ_SUBJECT = "Aip-Dlq-Subject"
#: Its sequence in the source stream, for tracing it back.
DLQ_STREAM_SEQ = "Aip-Dlq-Stream-Seq"
#: The worker that rejected it.
DLQ_WORKER = "Aip-Dlq-Worker"
#: Size of the original payload in bytes.
DLQ_SIZE = "Aip-Dlq-Size"
#: Hex sha256 of the whole original payload (also of a truncated one).
DLQ_SHA256 = "Aip-Dlq-Sha256"
#: How many leading bytes of the payload the body holds (equal to the size when whole).
DLQ_KEPT = "Aip-Dlq-Kept"


def dlq_material(body: bytes, headers: Mapping[str, str]) -> bytes:
    """What a DLQ entry's worker signature (`Aip-Signer`/`Aip-Signature` headers) covers:
    its `Aip-Dlq-*` headers as `name: value` lines, sorted, a blank line, then the body."""
    lines = sorted(
        f"{name}: {value}" for name, value in headers.items() if name.startswith("Aip-Dlq-")
    )
    return ("\n".join(lines) + "\n\n").encode() + body
