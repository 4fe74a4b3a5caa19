"""What one Action's audit receipts cost to seal as AIP 1.0 Envelopes, in CPU per Action.

    .venv/bin/python -m tests.bench.aip_receipt_sealing [--actions 2000] [--per-action 8]

A micro-benchmark, not a test, for the move of `aip.hermes.{endpoint}.audit.{action_id}` to
AIP (issue #25; shared/reference/aip-1.0-wire.md §1.15, §2.7). It seals `--per-action`
receipts shaped like `AuditLog.emit`'s three ways and prints the CPU per Action next to the
worker's 1.38 ms per operator Action (BENCHMARKS.md figure 1):

- **today**: each receipt msgspec-encoded and linked (`prev_sha256` = sha256 of the bytes
  before), one nkey header signature per segment (one segment per Action, measured);
- **AIP, every receipt signed**: each receipt an AIP Receipt (`hash` = sha256 of its
  canonical JSON without `hash`, `previous_hash` the one before) in its own signed
  `aip.audit.v1.receipt_chain` Envelope;
- **AIP, one signature per segment**: the same hash-linked Receipts, each in an unsigned
  Envelope sent at once (a killed worker still leaves them), and the segment's last receipt
  sent again in one signed Envelope, which vouches for every receipt it links back to;
- **the same, lean**: framed without `seal`'s checks (`check_envelope`, the `_plain` walk,
  a fresh RFC 3339 `sent_at` and message id per Envelope): dicts printed by msgspec with
  sorted keys, which is AIP's canonical form for what a receipt holds (strings, integers,
  floats in their usual range), and one Ed25519 signature. What a worker-side receipt
  writer could pay if it framed its own, already well-formed, receipts.

Run on a shared 2-core machine the absolute figures move with the load; compare the rows
of one run.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from schemas.audit import Receipt
from schemas.codec import encode
from tests.bench.receipt_signing import CPU_PER_ACTION_MS, receipts
from worker.aip.canonical import canonical_bytes
from worker.aip.envelope import AIP_VERSION
from worker.trust.responses import ResponseSigner
from worker.trust.signing import generate_keypair, write_seed_file
from worker.wire.actions import timestamp_of_ms
from worker.wire.envelopes import seal

CHAIN_TYPE = "aip.audit.v1.receipt_chain"


def aip_receipt(receipt: Receipt, previous_hash: str | None) -> dict[str, Any]:
    """One receipt as an AIP Receipt with its hash (§1.15): our facts in `data`."""
    out: dict[str, Any] = {
        "id": "rcpt_" + hashlib.sha256(receipt.receipt_id.encode()).hexdigest()[:32],
        "receipt_type": "policy_decision",
        "actor": {"id": receipt.worker_id, "kind": "service"},
        "occurred_at": timestamp_of_ms(receipt.ts_unix_ms),
        "data": {
            "event": receipt.event.value,
            "action_id": receipt.action_id,
            "endpoint_id": receipt.endpoint_id,
            "fence": receipt.fence,
            "details": receipt.details,
        },
    }
    if previous_hash is not None:
        out["previous_hash"] = previous_hash
    out["hash"] = hashlib.sha256(canonical_bytes(out)).hexdigest()
    return out


def chain_payload(action_id: str, receipt: dict[str, Any]) -> dict[str, Any]:
    return {
        "chain_id": action_id,
        "receipts": [receipt],
        "root_hash": hashlib.sha256(receipt["hash"].encode()).hexdigest(),
    }


def cpu_us_per_action(work: Callable[[], object], actions: int, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.process_time()
        work()
        best = min(best, time.process_time() - began)
    return best / actions * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--actions", type=int, default=2_000)
    parser.add_argument("--per-action", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        seed_file = Path(directory) / "worker.seed"
        write_seed_file(seed_file, generate_keypair().seed)
        signer = ResponseSigner.load(seed_file)
    per = args.per_action
    sample = receipts(args.actions * per)
    groups = [sample[n : n + per] for n in range(0, len(sample), per)]
    sender = {"id": "agent:hermes_operator:hermes-1", "kind": "agent"}

    def today() -> None:
        for group in groups:
            link = None
            for receipt in group:
                data = encode(msgspec.structs.replace(receipt, prev_sha256=link))
                link = hashlib.sha256(data).hexdigest()
            signer.headers(data)

    def aip(*, sign_each: bool) -> None:
        for group in groups:
            previous = None
            for receipt in group:
                linked = aip_receipt(receipt, previous)
                previous = linked["hash"]
                payload = chain_payload(receipt.action_id, linked)
                seal(CHAIN_TYPE, payload, sender=sender, signer=signer.aip if sign_each else None)
            if not sign_each:  # the segment's last receipt again, signed
                seal(CHAIN_TYPE, payload, sender=sender, signer=signer.aip)

    sorted_json = msgspec.json.Encoder(order="sorted")
    aip_signer = signer.aip
    signed_sender = {**sender, "did": aip_signer.did}

    def lean() -> None:
        for group in groups:
            previous: str | None = None
            envelope: dict[str, Any] = {}
            for receipt in group:
                linked: dict[str, Any] = {
                    "id": "rcpt_" + hashlib.sha256(receipt.receipt_id.encode()).hexdigest()[:32],
                    "receipt_type": "policy_decision",
                    "actor": {"id": receipt.worker_id, "kind": "service"},
                    "occurred_at": "2026-12-06T05:00:00.123Z",
                    "data": {
                        "event": receipt.event.value,
                        "action_id": receipt.action_id,
                        "endpoint_id": receipt.endpoint_id,
                        "fence": receipt.fence,
                        "details": receipt.details,
                    },
                }
                if previous is not None:
                    linked["previous_hash"] = previous
                linked["hash"] = previous = hashlib.sha256(sorted_json.encode(linked)).hexdigest()
                envelope = {
                    "aip_version": AIP_VERSION,
                    "message_type": CHAIN_TYPE,
                    "message_id": "msg_" + linked["id"][5:],
                    "sent_at": linked["occurred_at"],
                    "from": sender,
                    "body": {"receipt_chain": chain_payload(receipt.action_id, linked)},
                }
                sorted_json.encode(envelope)
            envelope["from"] = signed_sender
            envelope["security"] = {"did": aip_signer.did}
            envelope["security"]["signature"] = aip_signer.sign(sorted_json.encode(envelope))
            sorted_json.encode(envelope)

    figures = {
        "today (nkey header signature per segment)": cpu_us_per_action(today, len(groups)),
        "AIP, every receipt signed": cpu_us_per_action(lambda: aip(sign_each=True), len(groups)),
        "AIP, one signature per segment": cpu_us_per_action(
            lambda: aip(sign_each=False), len(groups)
        ),
        "AIP, one signature per segment, lean framing": cpu_us_per_action(lean, len(groups)),
    }
    print(f"{len(groups)} Actions x {per} receipts; CPU to seal one Action's receipts:")
    for what, us in figures.items():
        share = us / 1000 / CPU_PER_ACTION_MS * 100
        print(f"  {what:<44} {us:7.0f} us = {share:5.1f} % of {CPU_PER_ACTION_MS} ms")


if __name__ == "__main__":
    main()
