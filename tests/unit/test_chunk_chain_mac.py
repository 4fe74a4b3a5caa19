"""A chunk's chain MAC (`AIP-Chunk-Mac`) is HMAC-SHA256 as RFC 2104 and the standard
library define it, whatever the key's length: `chain_mac` finishes HMAC's two sha256 states
itself (worker/execution/chunk_chain.py), so it is held to `hmac.new` here; a takeover
(another worker, another release) checks the MACs an earlier owner made."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.execution.chunk_chain import MAC_HEX, chain_mac, mac_is_valid, new_chain_key


def reference(key_hex: str, fence: int, sha256_hex: str) -> str:
    mac = hmac.new(bytes.fromhex(key_hex), sha256_hex.encode(), hashlib.sha256)
    return f"{fence}:{mac.hexdigest()[:MAC_HEX]}"


@settings(max_examples=200)
@given(st.binary(min_size=0, max_size=150), st.integers(1, 2**40), st.binary(max_size=64))
def test_the_mac_is_hmac_sha256_of_the_chunks_hash(key: bytes, fence: int, chunk: bytes) -> None:
    sha = hashlib.sha256(chunk).hexdigest()
    assert chain_mac(key.hex(), fence, sha) == reference(key.hex(), fence, sha)


def test_a_delivery_key_makes_valid_macs_only_for_its_own_earlier_fence() -> None:
    key = new_chain_key()
    sha = hashlib.sha256(b"chunk").hexdigest()
    header = chain_mac(key, 2, sha)
    assert header == reference(key, 2, sha)
    assert mac_is_valid(header, sha, {2: key}, below_fence=3)
    assert not mac_is_valid(header, sha, {2: key}, below_fence=2)
    assert not mac_is_valid(header, hashlib.sha256(b"other").hexdigest(), {2: key}, 3)
    assert not mac_is_valid(header, sha, {2: new_chain_key()}, below_fence=3)
