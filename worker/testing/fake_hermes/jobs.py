"""The cron jobs store (Hermes' `cron/jobs.json`) and its schedule grammar.

The fake never executes a job: `run` only moves `next_run_at` to now, which is all a client
can observe synchronously from Hermes 0.19.0 (its scheduler ticks every 60 s).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from worker.testing._errors import HarnessError

MAX_NAME = 200
MAX_PROMPT = 5000
JOB_ID = re.compile(r"^[0-9a-f]{12}$")
UPDATABLE = ("name", "schedule", "prompt", "deliver", "skills", "skill", "repeat", "enabled")
_UNITS = {"m": 1, "h": 60, "d": 1440}
_INTERVAL = re.compile(r"^every\s+(\d+)\s*([mhd])$", re.IGNORECASE)
_DURATION = re.compile(r"^(\d+)\s*([mhd])$", re.IGNORECASE)
_CRON_FIELD = re.compile(r"^[\d*/,\-]+$")
_INJECTION = re.compile(
    r"ignore\s+(all\s+)?(previous|prior|above)\s+instructions|disregard\s+your\s+instructions",
    re.IGNORECASE,
)
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
SCHEDULE_HELP = (
    "Use:\n"
    "  - Duration: '30m', '2h', '1d' (one-time)\n"
    "  - Interval: 'every 30m', 'every 2h' (recurring)\n"
    "  - Cron: '0 9 * * *' (cron expression)\n"
    "  - Timestamp: '2024-01-15T09:00:00' (one-time)"
)


class JobError(HarnessError):
    """A rejected jobs request: HTTP status and the flat error string."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def _cron_values(field: str, low: int, high: int) -> set[int]:
    values: set[int] = set()
    for part in field.split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if body == "*":
            start, end = low, high
        elif "-" in body:
            first, _, last = body.partition("-")
            start, end = int(first), int(last)
        else:
            start = end = int(body)
        if step < 1 or start < low or end > high + (1 if high == 6 else 0) or start > end:
            raise ValueError(field)
        values.update(v % 7 if high == 6 else v for v in range(start, end + 1, step))
    return values


def _next_cron(fields: list[set[int]], after: datetime) -> datetime:
    moment = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(366 * 24 * 60):
        if (
            moment.minute in fields[0]
            and moment.hour in fields[1]
            and moment.day in fields[2]
            and moment.month in fields[3]
            and (moment.weekday() + 1) % 7 in fields[4]
        ):
            return moment
        moment += timedelta(minutes=1)
    raise ValueError("cron expression never fires")


def parse_schedule(text: str, current: datetime) -> tuple[dict[str, Any], datetime, bool]:
    """(schedule object, next run time, is one-shot) or ValueError for an unknown form."""
    text = text.strip()
    if match := _INTERVAL.match(text):
        minutes = int(match[1]) * _UNITS[match[2].lower()]
        schedule = {"kind": "interval", "minutes": minutes, "display": f"every {minutes}m"}
        return schedule, current + timedelta(minutes=minutes), False
    if match := _DURATION.match(text):
        run_at = current + timedelta(minutes=int(match[1]) * _UNITS[match[2].lower()])
        return {"kind": "once", "run_at": _iso(run_at), "display": f"once in {text}"}, run_at, True
    parts = text.split()
    if len(parts) == 5 and all(_CRON_FIELD.match(p) for p in parts):
        fields = [_cron_values(p, lo, hi) for p, (lo, hi) in zip(parts, _CRON_RANGES, strict=True)]
        return {"kind": "cron", "expr": text, "display": text}, _next_cron(fields, current), False
    run_at = datetime.fromisoformat(text)
    if run_at.tzinfo is None:
        run_at = run_at.replace(tzinfo=UTC)
    display = f"once at {run_at.strftime('%Y-%m-%d %H:%M')}"
    return {"kind": "once", "run_at": _iso(run_at), "display": display}, run_at, True


@dataclass(slots=True)
class _Job:
    data: dict[str, Any]


class JobStore:
    """Jobs by 12-hex id; survives a fake restart like `jobs.json` survives Hermes'."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    def list(self, include_disabled: bool) -> list[dict[str, Any]]:
        """Jobs with `latest_execution` (always null: the fake runs nothing)."""
        return [
            {**job.data, "latest_execution": None}
            for job in self._jobs.values()
            if include_disabled or job.data["enabled"]
        ]

    def get(self, job_id: str) -> dict[str, Any]:
        """The job object, or 404."""
        job = self._jobs.get(job_id)
        if job is None:
            raise JobError(404, "Job not found")
        return job.data

    def create(self, body: dict[str, Any], peer: str, model: str) -> dict[str, Any]:
        """Validate and store a new job (create answers 200, not 201)."""
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise JobError(400, "Name is required")
        if len(name) > MAX_NAME:
            raise JobError(400, f"Name must be ≤ {MAX_NAME} characters")
        schedule_text = body.get("schedule")
        if not isinstance(schedule_text, str) or not schedule_text.strip():
            raise JobError(400, "Schedule is required")
        prompt = str(body.get("prompt") or "")
        _check_prompt(prompt)
        repeat = body.get("repeat")
        if repeat is not None and (not isinstance(repeat, int) or repeat < 1):
            raise JobError(400, "Repeat must be a positive integer")
        current = datetime.now(UTC)
        schedule, next_run, once = _schedule_or_500(schedule_text, current)
        job_id = secrets.token_hex(6)
        skills = body.get("skills") or []
        self._jobs[job_id] = _Job(
            {
                "id": job_id,
                "name": name,
                "prompt": prompt,
                "skills": list(skills),
                "skill": None,
                "model": None,
                "provider": None,
                "provider_snapshot": "custom",
                "model_snapshot": model,
                "base_url": None,
                "script": None,
                "no_agent": False,
                "context_from": None,
                "schedule": schedule,
                "schedule_display": schedule["display"],
                "repeat": {
                    "times": repeat if repeat is not None else (1 if once else None),
                    "completed": 0,
                },
                "enabled": True,
                "state": "scheduled",
                "paused_at": None,
                "paused_reason": None,
                "created_at": _iso(current),
                "next_run_at": _iso(next_run),
                "last_run_at": None,
                "last_status": None,
                "last_error": None,
                "last_delivery_error": None,
                "deliver": body.get("deliver") or "local",
                "origin": {
                    "platform": "api_server",
                    "chat_id": "api",
                    "source_ip": peer,
                    "peer_ip": peer,
                },
                "enabled_toolsets": None,
                "workdir": None,
            }
        )
        return self._jobs[job_id].data

    def update(self, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """PATCH: unknown keys are silently dropped; a new schedule is re-parsed."""
        job = self.get(job_id)
        changes = {k: body[k] for k in UPDATABLE if k in body}
        if not changes:
            raise JobError(400, "No valid fields to update")
        if "prompt" in changes:
            _check_prompt(str(changes["prompt"] or ""))
        if "schedule" in changes:
            schedule, next_run, _ = _schedule_or_500(
                str(changes.pop("schedule")), datetime.now(UTC)
            )
            job.update(
                schedule=schedule, schedule_display=schedule["display"], next_run_at=_iso(next_run)
            )
        if "repeat" in changes:
            job["repeat"] = {
                "times": changes.pop("repeat"),
                "completed": job["repeat"]["completed"],
            }
        if "enabled" in changes:
            enabled = bool(changes.pop("enabled"))
            job.update(enabled=enabled, state="scheduled" if enabled else "paused")
        job.update(changes)
        return job

    def delete(self, job_id: str) -> None:
        """Remove a job (a second delete is a 404)."""
        self.get(job_id)
        del self._jobs[job_id]

    def pause(self, job_id: str) -> dict[str, Any]:
        """Disable a job until resumed."""
        job = self.get(job_id)
        job.update(enabled=False, state="paused", paused_at=_iso(datetime.now(UTC)))
        return job

    def resume(self, job_id: str) -> dict[str, Any]:
        """Re-enable a job; its next run is recomputed from now."""
        job = self.get(job_id)
        current = datetime.now(UTC)
        schedule = job["schedule"]
        if schedule["kind"] == "interval":
            next_run = _iso(current + timedelta(minutes=schedule["minutes"]))
        elif schedule["kind"] == "cron":
            next_run = _iso(parse_schedule(schedule["expr"], current)[1])
        else:
            next_run = schedule["run_at"]
        job.update(enabled=True, state="scheduled", paused_at=None, next_run_at=next_run)
        return job

    def trigger(self, job_id: str) -> dict[str, Any]:
        """`run`: due now, for the scheduler's next tick; nothing runs synchronously."""
        job = self.get(job_id)
        job["next_run_at"] = _iso(datetime.now(UTC))
        return job


def _check_prompt(prompt: str) -> None:
    if len(prompt) > MAX_PROMPT:
        raise JobError(400, f"Prompt must be ≤ {MAX_PROMPT} characters")
    if _INJECTION.search(prompt):
        raise JobError(
            400,
            "Blocked: prompt matches threat pattern 'prompt_injection'. "
            "Cron prompts must not contain injection or exfiltration payloads.",
        )


def _schedule_or_500(text: str, current: datetime) -> tuple[dict[str, Any], datetime, bool]:
    try:
        return parse_schedule(text, current)
    except ValueError:
        raise JobError(500, f"Invalid schedule '{text}'. {SCHEDULE_HELP}") from None
