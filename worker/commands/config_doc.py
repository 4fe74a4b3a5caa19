"""Render `docs/configuration.md` from the worker's `Settings`, the gateway's
`GatewaySettings` and the console's `ConsoleSettings` fields (drift-checked by a test), so no
table can drift from what its process reads."""

from __future__ import annotations

from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from worker.commands.cli_settings import NO_FLAG
from worker.console.settings import ConsoleSettings
from worker.gateway.settings import GatewaySettings
from worker.reference_names import REFERENCE_NAMES, UNSUPPORTED, aipd_name
from worker.settings import Settings

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

_HEADER = """# Configuration reference

Generated from `worker/settings.py` and `worker/gateway/settings.py` by `aip-hermes-worker
schemas export`; a test fails when this file and the code disagree. Every worker setting is an
environment variable `AIPD_<NAME>` and a flag of `run` and `provision`; a flag wins over the
variable. The gateway's settings are [below](#gateway). A bad value stops the process with a
message naming the field.

Secrets are only ever read from owner-only files (mode 600, regular, non-empty, < 64 KiB).
`AIPD_HERMES_API_KEY` (a value) is accepted for compatibility with a startup warning, and has
no flag: a key is never accepted on the command line.

| variable | flag | default | meaning |
|---|---|---|---|
"""


_GATEWAY_HEADER = """
## Gateway

`aip-hermes-worker gateway` takes no flags: it reads only these `AIPD_*` variables (its own
model, so a worker never needs a gateway-only file), plus the `AIPD_NATS_*` credential files
of the table above for its NATS connection. What they do in context: docs/gateway.md.

| variable | default | meaning |
|---|---|---|
"""

_REFERENCE_HEADER = """
## The reference connector's names

The reference Hermes connector (`getaip/core`) names its settings `AIP_HERMES_*`. The worker
reads each name below as the setting beside it, so an environment written for the reference
connector works unchanged. Both spellings set to different values stop start-up with a
message naming both; a reference name with no counterpart here stops start-up with what to
set instead (a limit or policy that is not in force must not look as if it were).
`AIP_HERMES_ENDPOINTS` also separates its `ID=URL` pairs by `;` or a new line, and the
endpoints file also reads the reference's `base_url` and `display_name`.

| reference name | the setting it sets |
|---|---|
"""

_CONSOLE_HEADER = """
## Console

`aip-hermes-worker console` (docs/console.md) reads these `AIPD_CONSOLE_*` variables of its
own; how it reaches NATS and Redis and which worker keys it believes are the worker's
settings above (`AIPD_NATS_*`, `AIPD_REDIS_*`, `AIPD_SUBJECT_PREFIX`,
`AIPD_TRUSTED_WORKER_KEYS_FILE`, `AIPD_LOG_*`), also as its flags.

| variable | default | meaning |
|---|---|---|
"""

#: Defaults computed at start, by what they are made of.
_COMPUTED = {"worker_id": "host-pid", "gateway_id": "`gw-{host}-{pid}`"}


def _default(name: str, field: FieldInfo) -> str:
    if name in _COMPUTED:
        return _COMPUTED[name]
    if field.is_required():
        return "required"
    if field.default is None:
        return "-"
    value = field.default
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    return f"`{value}`"


def _rows(model: type[BaseSettings], *, flags: bool) -> str:
    rows = []
    for name, field in model.model_fields.items():
        cells = [f"`AIPD_{name.upper()}`"]
        if flags:
            cells.append("-" if name in NO_FLAG else f"`--{name.replace('_', '-')}`")
        cells += [_default(name, field), " ".join((field.description or "").split())]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _reference_rows() -> str:
    rows = [f"| `{name}` | `{aipd_name(field)}` |" for name, field in REFERENCE_NAMES.items()]
    rows += [f"| `{name}` | none: refused; {instead} |" for name, instead in UNSUPPORTED.items()]
    return "\n".join(rows) + "\n"


def render() -> str:
    return (
        _HEADER
        + _rows(Settings, flags=True)
        + _REFERENCE_HEADER
        + _reference_rows()
        + _GATEWAY_HEADER
        + _rows(GatewaySettings, flags=False)
        + _CONSOLE_HEADER
        + _rows(ConsoleSettings, flags=False)
    )


def export(path: Path = DOC_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(), encoding="utf-8")
    return path


def drifted(path: Path = DOC_PATH) -> bool:
    return not path.exists() or path.read_text(encoding="utf-8") != render()
