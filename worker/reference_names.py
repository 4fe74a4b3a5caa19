"""The reference Hermes connector's setting names (`AIP_HERMES_*`), accepted beside ours.

A GetAIP operator who moves a deployment from the reference connector
(`getaip/core`, `crates/aip-connector-hermes-agent`; shared/reference/aip-1.0-wire.md §4.8)
keeps the environment they have: each `AIP_HERMES_*` name below sets the `AIPD_HERMES_*`
setting that means the same thing. This module is the one place that knows the pairs and the
two rules around them:

* **Conflicts stop start-up.** A name set under both spellings with different values is
  refused (`SettingsError`, naming both variables); one meaning, one value.
* **Nothing is ignored quietly.** A reference name that has no counterpart here (the host
  binary's policy file and response-size triple) is refused with what to set instead: a
  deployment that believes a limit or a policy is in force, while it is not, fails quietly.

Value forms follow the reference where they differ from ours: `AIP_HERMES_ENDPOINTS` also
separates `ID=URL` pairs by `;` or a new line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from worker.errors import SettingsError

#: Reference name -> our field (its variable is `AIPD_` + the field in capitals).
REFERENCE_NAMES: Final[Mapping[str, str]] = {
    # The bundled server's sixteen.
    "AIP_HERMES_ENDPOINTS": "hermes_endpoints",
    "AIP_HERMES_API_KEY": "hermes_api_key",
    "AIP_HERMES_OPERATOR_DELEGATION_ENABLED": "hermes_operator_delegation_enabled",
    "AIP_HERMES_OPERATOR_MODEL": "hermes_operator_model",
    "AIP_HERMES_OPERATOR_INSTRUCTIONS": "hermes_operator_instructions",
    "AIP_HERMES_OPERATOR_INSTRUCTIONS_FILE": "hermes_operator_instructions_file",
    "AIP_HERMES_OPERATOR_TIMEOUT_MS": "hermes_operator_timeout_ms",
    "AIP_HERMES_OPERATOR_POLL_MS": "hermes_operator_poll_interval_ms",
    "AIP_HERMES_OPERATOR_MAX_EVENTS": "hermes_operator_max_events",
    "AIP_HERMES_OPERATOR_MAX_INPUT_BYTES": "hermes_operator_max_input_bytes",
    "AIP_HERMES_OPERATOR_MAX_DELEGATION_DEPTH": "hermes_operator_max_delegation_depth",
    "AIP_HERMES_OPERATOR_CLAIM_TTL_MS": "hermes_operator_start_claim_ttl_ms",
    "AIP_HERMES_OPERATOR_CANCEL_GRACE_MS": "hermes_operator_cancel_grace_ms",
    "AIP_HERMES_OPERATOR_CAPABILITY_PREFIXES": "hermes_operator_capability_prefixes",
    "AIP_HERMES_OPERATOR_APPROVAL_EXEMPT_CAPABILITY_PREFIXES": (
        "hermes_operator_delegation_approval_exempt_prefixes"
    ),
    "AIP_HERMES_OPERATOR_SCOPE_PREFIXES": "hermes_operator_scope_prefixes",
    # The host binary's endpoints file (its `base_url` and `display_name` are read too).
    "AIP_HERMES_ENDPOINTS_FILE": "hermes_endpoints_file",
}

#: Reference names with no counterpart here, and what to do instead.
UNSUPPORTED: Final[Mapping[str, str]] = {
    "AIP_HERMES_OPERATOR_POLICY_FILE": (
        "this connector's operator policy is the AIPD_HERMES_OPERATOR_* settings and "
        "AIPD_APPROVAL_AUTHORITY_FILE (docs/configuration.md, docs/operator.md)"
    ),
    "AIP_HERMES_MAX_JSON_RESPONSE_BYTES": (
        "response sizes are fixed here (16 MiB per JSON body; streams are bounded by "
        "AIPD_HERMES_STREAM_MAX_IDLE_BYTES and the operator's AIPD_HERMES_OPERATOR_MAX_EVENTS)"
    ),
    "AIP_HERMES_MAX_STREAM_RESPONSE_BYTES": (
        "streams are bounded by AIPD_HERMES_STREAM_MAX_IDLE_BYTES, "
        "AIPD_HERMES_STREAM_MAX_IDLE_MS and AIPD_HERMES_OPERATOR_MAX_EVENTS"
    ),
    "AIP_HERMES_MAX_SSE_FRAME_BYTES": (
        "an SSE frame is bounded by AIPD_HERMES_STREAM_MAX_IDLE_BYTES"
    ),
}

_PAIR_SEPARATORS = re.compile(r"[;\n]")


def aipd_name(field: str) -> str:
    return "AIPD_" + field.upper()


def reference_values(environ: Mapping[str, str]) -> dict[str, str]:
    """Our field -> value for every reference name set in `environ` (raises
    SettingsError for a conflict or an unsupported name, naming the variables)."""
    for name, instead in UNSUPPORTED.items():
        if name in environ:
            raise SettingsError(f"{name} is not supported by aip-hermes-worker: {instead}")
    values: dict[str, str] = {}
    for name, field in REFERENCE_NAMES.items():
        if name not in environ:
            continue
        value = environ[name]
        if name == "AIP_HERMES_ENDPOINTS":
            value = ",".join(p.strip() for p in _PAIR_SEPARATORS.split(value) if p.strip())
        ours = aipd_name(field)
        if ours in environ and environ[ours] != value:
            raise SettingsError(
                f"{name} and {ours} are both set, to different values: they are the same "
                "setting (the reference connector's name and ours); set one of them"
            )
        values[field] = value
    return values


class ReferenceNamesSource(PydanticBaseSettingsSource):
    """The settings source of the reference names (below flags and `AIPD_*` variables; a
    disagreement between the two spellings never gets that far, see `reference_values`)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._values = reference_values(environ)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)
