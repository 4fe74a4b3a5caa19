"""Render `docs/configuration.md` from the Settings fields (drift-checked by a test)."""

from __future__ import annotations

from pathlib import Path

from pydantic.fields import FieldInfo

from worker.commands.cli_settings import NO_FLAG
from worker.settings import Settings

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

_HEADER = """# Configuration reference

Generated from `worker/settings.py` by `aip-hermes-worker schemas export`; a test fails when
this file and the code disagree. Every setting is an environment variable `AIPD_<NAME>` and a
flag of `run` and `provision`; a flag wins over the variable. A bad value stops the process
with a message naming the field.

Secrets are only ever read from owner-only files (mode 600, regular, non-empty, < 64 KiB).
`AIPD_HERMES_API_KEY` (a value) is accepted for compatibility with a startup warning, and has
no flag: a key is never accepted on the command line.

| variable | flag | default | meaning |
|---|---|---|---|
"""


def _default(name: str, field: FieldInfo) -> str:
    if name == "worker_id":
        return "host-pid"
    if field.default is None:
        return "-"
    value = field.default
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    return f"`{value}`"


def render() -> str:
    rows = []
    for name, field in Settings.model_fields.items():
        flag = "-" if name in NO_FLAG else f"`--{name.replace('_', '-')}`"
        meaning = " ".join((field.description or "").split())
        rows.append(f"| `AIPD_{name.upper()}` | {flag} | {_default(name, field)} | {meaning} |")
    return _HEADER + "\n".join(rows) + "\n"


def export(path: Path = DOC_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(), encoding="utf-8")
    return path


def drifted(path: Path = DOC_PATH) -> bool:
    return not path.exists() or path.read_text(encoding="utf-8") != render()
