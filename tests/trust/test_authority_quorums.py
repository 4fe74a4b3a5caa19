"""The approval authority file's quorums: parsed strictly, matched by longest prefix, and
refused at startup when they are malformed or could never be met."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trust_support import now_ms

from worker.errors import TrustConfigError
from worker.testing.identities import (
    APPROVER_A,
    APPROVER_UNTENANTED,
    authority_memberships,
    write_json,
    write_trust_files,
)
from worker.trust.authority import ApprovalAuthority

OPERATOR = "cap:hermes_agent:h1:operator"


def _members(*extra: str) -> list[dict[str, Any]]:
    added = [
        {"principal_id": who, "revision": 1, "tenant_id": None,
         "capability_prefixes": ["cap:hermes_agent:h1:"]}
        for who in extra
    ]  # fmt: skip
    return [*authority_memberships(), *added]


def _load(tmp_path: Path, quorums: list[dict[str, Any]], *extra: str) -> ApprovalAuthority:
    files = write_trust_files(tmp_path, memberships=_members(*extra), quorums=quorums)
    return ApprovalAuthority.load(files.authority_file, now_ms=now_ms())


def test_the_array_form_needs_one_approval_everywhere(tmp_path: Path) -> None:
    files = write_trust_files(tmp_path)
    authority = ApprovalAuthority.load(files.authority_file, now_ms=now_ms())
    assert authority.quorum_for(OPERATOR).required == 1
    assert authority.quorums == []


def test_the_longest_matching_prefix_decides(tmp_path: Path) -> None:
    authority = _load(
        tmp_path,
        [
            {"capability_prefix": "cap:hermes_agent:", "required": 2},
            {"capability_prefix": OPERATOR, "required": 3},
        ],
        "approver:erin",
        "approver:frank",
    )
    assert authority.quorum_for(OPERATOR).required == 3
    assert authority.quorum_for("cap:hermes_agent:h1:models").required == 2
    assert authority.quorum_for("cap:other:h1:models").required == 1
    assert len(authority) == 5


def test_an_unrestricted_quorum_covers_every_capability(tmp_path: Path) -> None:
    authority = _load(tmp_path, [{"capability_prefix": "*", "required": 2}], "approver:erin")
    assert authority.quorum_for("cap:anything:x:y").required == 2


@pytest.mark.parametrize(
    ("quorums", "expected"),
    [
        ([{"capability_prefix": OPERATOR, "required": 0}], r"Expected `int` >= 1"),
        ([{"capability_prefix": OPERATOR, "required": 17}], r"Expected `int` <= 16"),
        ([{"capability_prefix": "", "required": 1}], r"length >= 1"),
        ([{"capability_prefix": OPERATOR, "required": 2, "tenant": "x"}], r"unknown field"),
        (
            [{"capability_prefix": OPERATOR, "required": 2}] * 2,
            r"quorum 1: duplicate capability_prefix",
        ),
        (
            # Three members may approve the operator, but one per tenant: a decision is
            # made within one tenant, so no Action could ever gather two.
            [{"capability_prefix": OPERATOR, "required": 2}],
            r"quorum 0 .*requires 2 distinct approvers but only 1 member\(s\) of any one",
        ),
    ],
    ids=["zero", "over-the-bound", "empty-prefix", "unknown-field", "duplicate", "unreachable"],
)
def test_bad_quorums_stop_startup(
    tmp_path: Path, quorums: list[dict[str, Any]], expected: str
) -> None:
    with pytest.raises(TrustConfigError, match=r"approval authority file .*" + expected):
        _load(tmp_path, quorums)


def test_a_quorum_only_members_of_other_capabilities_could_meet_is_refused(
    tmp_path: Path,
) -> None:
    memberships = [
        {"principal_id": APPROVER_A, "revision": 1, "tenant_id": None,
         "capability_prefixes": ["cap:hermes_agent:h1:operator"]},
        {"principal_id": APPROVER_UNTENANTED, "revision": 1, "tenant_id": None,
         "capability_prefixes": ["cap:hermes_agent:h2:"]},
    ]  # fmt: skip
    files = write_trust_files(
        tmp_path, memberships=memberships, quorums=[{"capability_prefix": OPERATOR, "required": 2}]
    )
    with pytest.raises(TrustConfigError, match="only 1 member"):
        ApprovalAuthority.load(files.authority_file, now_ms=now_ms())


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"quorums": []}, r"missing required field `memberships`"),
        ({"memberships": [], "quorums": []}, r"must be a non-empty JSON array"),
        ({"memberships": [{"principal_id": "x"}], "extra": 1}, r"unknown field `extra`"),
        ({"memberships": [{"principal_id": "x", "revision": 1}]}, r"membership 0 .*public_key"),
    ],
    ids=["no-memberships", "empty-memberships", "unknown-key", "bad-membership"],
)
def test_a_malformed_object_form_stops_startup(
    tmp_path: Path, document: dict[str, Any], expected: str
) -> None:
    path = write_json(tmp_path / "authority.json", document, mode=0o644)
    with pytest.raises(TrustConfigError, match=expected):
        ApprovalAuthority.load(path, now_ms=now_ms())
