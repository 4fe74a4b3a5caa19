"""Scheduled jobs (`/api/jobs…`, Hermes' `cron/jobs.json`).

A job is a prompt the scheduler hands to the agent later, so creating, editing, resuming,
triggering or deleting one is high risk and needs approval: each decides what the agent will
do unattended (or destroys that decision). Pausing only stops future runs and is medium.
`job_run` does not run synchronously: it sets `next_run_at` to now for the next 60 s tick.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from schemas._base import WireStruct
from worker.operations.calls import HermesCall, JsonOperation, body_of
from worker.operations.input_types import JobId, Label
from worker.operations.retry import ReadRetryPolicy
from worker.operations.specs import spec

JobName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
#: `every 30m`, `0 9 * * *`, `30m`, or an ISO timestamp; Hermes parses it (a bad one is 500).
Schedule = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
JobPrompt = Annotated[str, msgspec.Meta(max_length=5000)]
Skills = Annotated[list[Label], msgspec.Meta(max_length=64)]
Repeat = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]


class JobListInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    #: Paused jobs are hidden unless this is true.
    include_disabled: bool | None = None


class JobRef(WireStruct, kw_only=True, frozen=True):
    job_id: JobId


class JobCreateInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    name: JobName
    schedule: Schedule
    prompt: JobPrompt | None = None
    deliver: Label | None = None
    skills: Skills | None = None
    repeat: Repeat | None = None


class JobUpdateInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    """The fields Hermes lets a PATCH change; at least one is required."""

    job_id: JobId
    name: JobName | msgspec.UnsetType = msgspec.UNSET
    schedule: Schedule | msgspec.UnsetType = msgspec.UNSET
    prompt: JobPrompt | msgspec.UnsetType = msgspec.UNSET
    deliver: Label | msgspec.UnsetType = msgspec.UNSET
    skills: Skills | msgspec.UnsetType = msgspec.UNSET
    skill: Label | msgspec.UnsetType | None = msgspec.UNSET
    repeat: Repeat | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        if len(body_of(self, exclude={"job_id"})) == 0:
            raise ValueError("at least one field to update is required")


def _list(params: JobListInput) -> HermesCall:
    return HermesCall(query=body_of(params))


def _create(params: JobCreateInput) -> HermesCall:
    return HermesCall(body=body_of(params))


def _ref(params: Any) -> HermesCall:
    return HermesCall(params={"job_id": params.job_id})


def _update(params: JobUpdateInput) -> HermesCall:
    return HermesCall(params={"job_id": params.job_id}, body=body_of(params, exclude={"job_id"}))


def _action(name: str, description: str) -> JsonOperation:
    return JsonOperation(spec(name, JobRef, description), _ref)


def job_operations(retry: ReadRetryPolicy) -> list[JsonOperation]:
    return [
        JsonOperation(
            spec(
                "jobs_list",
                JobListInput,
                "Scheduled jobs with their latest execution",
            ),
            _list,
            retry=retry,
        ),
        JsonOperation(
            spec("job_create", JobCreateInput, "Schedule a prompt for the agent to run unattended"),
            _create,
        ),
        JsonOperation(spec("job_get", JobRef, "One job"), _ref, retry=retry),
        JsonOperation(
            spec(
                "job_update", JobUpdateInput, "Change a job's prompt, schedule, delivery or state"
            ),
            _update,
        ),
        JsonOperation(
            spec("job_delete", JobRef, "Delete a job"),
            _ref,
        ),
        _action("job_pause", "Pause a job (no further runs until resumed)"),
        _action("job_resume", "Resume a paused job (next run recomputed from now)"),
        _action("job_run", "Run a job at the scheduler's next tick (within 60 s)"),
    ]
