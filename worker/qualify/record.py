"""The retained qualification record: one JSON document and the same facts as Markdown.

The spec asks to "record exact AIP, connector-host, Hermes, policy, endpoint, tenant,
credential, and storage identities with timestamps and retained results". The JSON is the
record; the Markdown is its rendering for people (and for the repository's docs). Neither
holds a secret: files appear as sha256 digests, URLs without credentials, tokens and keys
not at all.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from worker.qualify.items import ItemResult, Status
from worker.qualify.probe import Facts

SCHEMA = "aip-hermes-worker/qualification-record/v1"
BASENAME = "qualification-record"


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def build(
    facts: Facts,
    results: list[ItemResult],
    *,
    endpoint_ids: list[str],
    started: float,
    finished: float,
    cleanup: list[str],
    topology: str,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "started_at": iso(started),
        "finished_at": iso(finished),
        "seconds": round(finished - started, 1),
        "endpoints_under_qualification": endpoint_ids,
        "topology": topology,
        "verdict": verdict(results),
        "project": facts.project,
        "hermes": facts.hermes,
        "gateway": facts.gateway,
        "nats": facts.nats,
        "redis": facts.redis,
        "digests": facts.digests,
        "items": [
            {
                "number": r.number,
                "title": r.title,
                "status": r.status.value,
                "detail": r.detail,
                "seconds": round(r.seconds, 1),
                "evidence": r.evidence.as_dict(),
            }
            for r in results
        ],
        "runs_left_behind": cleanup,
    }


def verdict(results: list[ItemResult]) -> str:
    statuses = {r.status for r in results}
    if Status.FAIL in statuses:
        return "failed"
    if Status.SKIP in statuses:
        return "incomplete"
    return "qualified"


def paths(target: Path) -> tuple[Path, Path]:
    """`target` is a directory (the record's two files go in it) or a file name whose
    suffix is replaced by `.json` and `.md`."""
    if target.is_dir() or not target.suffix:
        target.mkdir(parents=True, exist_ok=True)
        return target / f"{BASENAME}.json", target / f"{BASENAME}.md"
    return target.with_suffix(".json"), target.with_suffix(".md")


def write(record: dict[str, Any], target: Path) -> tuple[Path, Path]:
    json_path, md_path = paths(target)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    md_path.write_text(markdown(record), encoding="utf-8")
    return json_path, md_path


def _table(rows: list[tuple[str, str]]) -> list[str]:
    out = ["| | |", "|---|---|"]
    out += [f"| {key} | {value} |" for key, value in rows]
    return out


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(record: dict[str, Any]) -> str:
    project = record["project"]
    lines = [
        "# Qualification record",
        "",
        f"Verdict: **{record['verdict']}** — {record['started_at']} to {record['finished_at']} "
        f"({record['seconds']} s), endpoints {', '.join(record['endpoints_under_qualification'])}.",
        "",
        f"Topology: {record['topology']}",
        "",
        "The same record as JSON is beside this file (`qualification-record.json`); "
        "regenerate both with "
        "`python -m worker.testing.qualify_local --record docs/qualification/`.",
        "",
        "## Items",
        "",
        "| # | item | result | evidence |",
        "|---|---|---|---|",
    ]
    for item in record["items"]:
        evidence = item["evidence"]
        cited = []
        if evidence["action_ids"]:
            cited.append("actions " + ", ".join(f"`{a}`" for a in evidence["action_ids"][:8]))
            if len(evidence["action_ids"]) > 8:
                cited[-1] += f" (+{len(evidence['action_ids']) - 8} in the JSON)"
        if evidence["run_ids"]:
            cited.append("runs " + ", ".join(f"`{r}`" for r in evidence["run_ids"][:6]))
        if evidence["receipts"]:
            cited.append("receipts " + ", ".join(f"`{r}`" for r in evidence["receipts"][:6]))
        lines.append(
            f"| {item['number']} | {_cell(item['title'])} | **{item['status']}** "
            f"({item['seconds']} s): {_cell(item['detail'])} | {_cell('; '.join(cited))} |"
        )
    lines += ["", "## Project", ""]
    lines += _table([(k, f"`{v}`") for k, v in project.items()])
    lines += ["", "## Hermes endpoints", ""]
    for endpoint_id, facts in record["hermes"].items():
        lines += [f"### {endpoint_id}", ""]
        lines += _table([(k, _cell(v)) for k, v in facts.items()])
        lines.append("")
    lines += ["## Gateway", ""]
    lines += _table([(k, _cell(v)) for k, v in record["gateway"].items()]) or ["(none)"]
    lines += ["", "## NATS", ""]
    lines += _table([(k, _cell(v)) for k, v in record["nats"].items()])
    lines += ["", "## Redis", ""]
    lines += _table([(k, _cell(v)) for k, v in record["redis"].items()])
    lines += ["", "## Configuration digests", ""]
    lines += _table([(k, f"`{v}`") for k, v in record["digests"].items()])
    lines += ["", "## Runs left behind", ""]
    lines += [f"- {line}" for line in record["runs_left_behind"]] or [
        "None: every run the driver started had ended when it finished."
    ]
    return "\n".join(lines) + "\n"
