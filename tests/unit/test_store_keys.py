"""The key layout of `ActionKeys` (docs/architecture.md §5), checked against literal keys:
the keys of a slot are printed once, when the keys are made, so a bad id fails there."""

from __future__ import annotations

import pytest

from subjects.grammar import Subjects
from worker.store.keys import NAMESPACE, ActionKeys

ACTION = "act_" + "1" * 32
SOURCE = "act_" + "2" * 32


def test_an_actions_keys_sit_under_its_own_tag() -> None:
    keys = ActionKeys.of(ACTION)
    base = f"{NAMESPACE}:{{{ACTION}}}"
    assert (keys.lease, keys.result, keys.terminal, keys.owed_chunks) == (
        f"{base}:lease",
        f"{base}:result",
        f"{base}:terminal",
        f"{base}:owed_chunks",
    )
    assert (keys.cancel, keys.cancel_pending, keys.binding) == (
        f"{base}:cancel",
        f"{base}:cancel_pending",
        f"{base}:binding",
    )
    assert keys.resume_alias == f"{base}:resume_of"
    assert keys.approvals == f"aip:approvals:{{{ACTION}}}"
    assert not keys.is_resume


def test_a_resumes_keys_sit_under_its_sources_tag_with_its_id_as_suffix() -> None:
    keys = ActionKeys.of(ACTION, source_action_id=SOURCE)
    base = f"{NAMESPACE}:{{{SOURCE}}}"
    assert keys.lease == f"{base}:lease:{ACTION}"
    assert keys.result == f"{base}:result:{ACTION}"
    assert keys.binding == f"{base}:binding"  # shared with the source
    assert keys.resume_alias == f"{NAMESPACE}:{{{ACTION}}}:resume_of"
    assert keys.is_resume


def test_keys_compare_by_their_ids() -> None:
    assert ActionKeys.of(ACTION) == ActionKeys.of(ACTION)
    assert hash(ActionKeys.of(ACTION)) == hash(ActionKeys.of(ACTION))
    assert ActionKeys.of(ACTION) != ActionKeys.of(ACTION, source_action_id=SOURCE)


@pytest.mark.parametrize(
    ("action_id", "source"),
    [("act_}x", None), ("", None), (ACTION, "act_{other}"), (ACTION, "job_1")],
)
def test_keys_are_never_made_from_an_id_that_is_not_one(action_id: str, source: str | None) -> None:
    with pytest.raises(ValueError, match="not an action id"):
        ActionKeys.of(action_id, source_action_id=source)


def test_the_audit_subject_refuses_a_bad_id_every_time_it_is_asked() -> None:
    subjects = Subjects()
    assert subjects.audit("h1", ACTION) == f"aip.hermes.h1.audit.{ACTION}"
    assert subjects.audit("h1", ACTION) == f"aip.hermes.h1.audit.{ACTION}"
    dlq_id = "dlq_" + "a" * 32
    assert subjects.audit("h1", dlq_id) == f"aip.hermes.h1.audit.{dlq_id}"
    for _ in range(2):  # a refusal is not remembered as an answer
        with pytest.raises(ValueError, match="not an action id"):
            subjects.audit("h1", "act_*.>")
