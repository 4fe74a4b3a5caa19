"""The reference connector's `AIP_HERMES_*` names set our settings (#26 item 6)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker.endpoints import EndpointDescriptor
from worker.errors import SettingsError
from worker.reference_names import REFERENCE_NAMES, reference_values
from worker.settings import Settings

#: The sixteen names of the reference's bundled server (§4.8), by their own spelling.
BUNDLED = (
    "AIP_HERMES_ENDPOINTS",
    "AIP_HERMES_API_KEY",
    *(
        "AIP_HERMES_OPERATOR_" + suffix
        for suffix in (
            "DELEGATION_ENABLED", "MODEL", "INSTRUCTIONS", "INSTRUCTIONS_FILE", "TIMEOUT_MS",
            "POLL_MS", "MAX_EVENTS", "MAX_INPUT_BYTES", "MAX_DELEGATION_DEPTH", "CLAIM_TTL_MS",
            "CANCEL_GRACE_MS", "CAPABILITY_PREFIXES", "APPROVAL_EXEMPT_CAPABILITY_PREFIXES",
            "SCOPE_PREFIXES",
        )
    ),
)


def test_every_bundled_name_sets_a_field_of_ours() -> None:
    assert len(BUNDLED) == 16
    for name in BUNDLED:
        assert REFERENCE_NAMES[name] in Settings.model_fields, name


def test_reference_names_configure_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("AIPD_", "AIP_HERMES_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AIP_HERMES_ENDPOINTS", "h1=http://a:1; h2=http://b:2\nh3=http://c:3")
    monkeypatch.setenv("AIP_HERMES_OPERATOR_TIMEOUT_MS", "5000")
    monkeypatch.setenv("AIP_HERMES_OPERATOR_POLL_MS", "125")
    monkeypatch.setenv("AIP_HERMES_OPERATOR_CLAIM_TTL_MS", "30000")
    monkeypatch.setenv("AIP_HERMES_OPERATOR_DELEGATION_ENABLED", "true")
    monkeypatch.setenv("AIP_HERMES_OPERATOR_CAPABILITY_PREFIXES", "cap:a:")
    monkeypatch.setenv("AIP_HERMES_OPERATOR_SCOPE_PREFIXES", "scope:a")
    settings = Settings()
    assert settings.hermes_endpoints == "h1=http://a:1,h2=http://b:2,h3=http://c:3"
    assert settings.hermes_operator_timeout_ms == 5000
    assert settings.hermes_operator_poll_interval_ms == 125
    assert settings.hermes_operator_start_claim_ttl_ms == 30000
    assert settings.hermes_operator_delegation_enabled is True
    # The same value under both spellings is one setting, not a conflict.
    monkeypatch.setenv("AIPD_HERMES_OPERATOR_TIMEOUT_MS", "5000")
    assert Settings().hermes_operator_timeout_ms == 5000


def test_two_spellings_that_disagree_stop_start_up() -> None:
    with pytest.raises(SettingsError, match="AIP_HERMES_OPERATOR_MODEL and AIPD_"):
        reference_values(
            {"AIP_HERMES_OPERATOR_MODEL": "a", "AIPD_HERMES_OPERATOR_MODEL": "b"}
        )


@pytest.mark.parametrize(
    "name", ["AIP_HERMES_OPERATOR_POLICY_FILE", "AIP_HERMES_MAX_JSON_RESPONSE_BYTES"]
)
def test_a_reference_name_without_a_counterpart_is_refused_not_ignored(name: str) -> None:
    with pytest.raises(SettingsError, match=f"{name} is not supported"):
        reference_values({name: "1"})


def test_instructions_as_a_value_and_as_a_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "instructions.txt"
    path.write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match="set one"):
        Settings(hermes_operator_instructions="y", hermes_operator_instructions_file=path)


def test_the_reference_endpoints_file_shape_is_read() -> None:
    entry = {"id": "h1", "base_url": "http://a:1", "display_name": "Hermes one"}
    descriptor = EndpointDescriptor.model_validate(entry)
    assert (descriptor.url, descriptor.display_name) == ("http://a:1", "Hermes one")
    with pytest.raises(ValueError, match="Extra inputs"):
        EndpointDescriptor.model_validate({**entry, "url": "http://b:2"})
    with pytest.raises(ValueError, match="Extra inputs"):
        EndpointDescriptor.model_validate({**entry, "unknown": 1})


def test_run_names_the_conflict_in_one_line_and_exits_with_the_configuration_code() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIPD_", "AIP_HERMES_"))}
    env |= {"AIP_HERMES_OPERATOR_MODEL": "a", "AIPD_HERMES_OPERATOR_MODEL": "b"}
    done = subprocess.run(
        [sys.executable, "-m", "worker", "run"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "AIP_HERMES_OPERATOR_MODEL" in line]
    assert len(lines) == 1, done.stderr
