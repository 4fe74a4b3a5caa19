"""The skip-or-fail policy, and external services that refuse to be controlled."""

from __future__ import annotations

import re

import pytest

from worker.testing.pytest_plugin import (
    CONTAINERS_ENV,
    NATS_URL_ENV,
    pytester_args,
    require_control,
    require_engine,
    service_unavailable,
)
from worker.testing.services import (
    ExternalService,
    NatsServer,
    ServiceControlUnavailable,
    ServiceStartError,
    port_accepts,
)
from worker.testing.shared import SharedView

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("value", ["true", "TRUE", "1"])
def test_unavailable_service_fails_the_test_under_ci(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="no nats-server binary"):
        service_unavailable("no nats-server binary")


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_unavailable_service_skips_the_test_outside_ci(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception, match="no nats-server binary"):
        service_unavailable("no nats-server binary")


@pytest.mark.parametrize("action", ["stop", "kill", "pause", "resume", "restart"])
def test_external_service_refuses_control_and_names_its_source(action: str) -> None:
    external = ExternalService("nats", "nats://127.0.0.1:4222", NATS_URL_ENV)
    with pytest.raises(ServiceControlUnavailable, match=NATS_URL_ENV):
        getattr(external, action)()
    assert not external.controllable


def test_require_control_applies_the_policy_only_to_handles_it_cannot_control(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    owned = NatsServer()
    try:
        require_control(owned)
    finally:
        owned.close()
    external = ExternalService("nats", "nats://127.0.0.1:4222", NATS_URL_ENV)
    with pytest.raises(pytest.skip.Exception, match="not owned by the harness"):
        require_control(external)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="not owned by the harness"):
        require_control(external)


@pytest.mark.parametrize("ci", ["true", "false"])
def test_require_control_fails_a_test_that_shares_its_server(
    monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=r"mark the test `@pytest.mark.chaos`"):
        require_control(SharedView("nats", "nats://127.0.0.1:4222"))


def test_external_service_that_does_not_answer_cannot_start(refused_port: int) -> None:
    port = refused_port
    assert not port_accepts(port)
    with pytest.raises(ServiceStartError, match=str(port)):
        ExternalService("redis", f"redis://127.0.0.1:{port}/0", "AIPD_TEST_REDIS_URL").start()


_INNER_TEST = """
def test_uses_external_url_then_tries_to_kill(nats_server):
    assert nats_server.url == "{url}"
    assert not nats_server.controllable
    nats_server.kill()
"""


@pytest.mark.parametrize(("ci", "outcome"), [("true", "failed"), ("false", "skipped")])
def test_fixture_uses_the_external_url_and_refusals_follow_the_policy(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, outcome: str
) -> None:
    with NatsServer() as owned_elsewhere:
        monkeypatch.setenv(NATS_URL_ENV, owned_elsewhere.url)
        monkeypatch.setenv("CI", ci)
        pytester.makepyfile(_INNER_TEST.format(url=owned_elsewhere.url))

        result = pytester.runpytest(*pytester_args(), "-rsf")

        result.assert_outcomes(**{outcome: 1})
        result.stdout.fnmatch_lines([f"*cannot kill nats at {owned_elsewhere.url}*"])
        assert owned_elsewhere.running


_INNER_HERMES_TEST = """
import pytest

from worker.testing.real_hermes import HermesUnavailable


@pytest.fixture
def real_hermes():
    raise HermesUnavailable("no registry answers")


def test_in_a_fixture(real_hermes):
    pass


def test_in_the_test():
    raise HermesUnavailable("no registry answers")
"""


@pytest.mark.parametrize(
    ("ci", "outcomes"),
    # Under CI a failure in a fixture is reported as an error of the test's setup.
    [("true", {"errors": 1, "failed": 1}), ("false", {"skipped": 2})],
)
def test_a_real_hermes_that_cannot_be_installed_follows_the_policy(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, outcomes: dict[str, int]
) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(_INNER_HERMES_TEST)

    result = pytester.runpytest(*pytester_args(), "-rsfE")

    result.assert_outcomes(**outcomes)
    result.stdout.fnmatch_lines(["*the real Hermes is unavailable: no registry answers*"])


@pytest.mark.parametrize(
    ("ci", "expected", "outcome", "says"),
    [
        ("true", "required", pytest.fail.Exception, "AIPD_TEST_CONTAINERS=required"),
        ("true", "unavailable: starting one needs root", pytest.skip.Exception, "needs root"),
        ("true", None, pytest.skip.Exception, "--containers"),
        (None, "required", pytest.skip.Exception, "no Docker engine answers"),
    ],
    ids=["ci-engine-allowed-fails", "ci-not-allowed-skips", "ci-not-asked-skips", "local-skips"],
)
def test_a_container_test_without_an_engine_fails_only_in_ci_where_one_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
    ci: str | None,
    expected: str | None,
    outcome: type[BaseException],
    says: str,
    refused_port: int,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{refused_port}")  # nothing answers
    for name, value in (("CI", ci), (CONTAINERS_ENV, expected)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    with pytest.raises(outcome, match=re.escape(says)):
        require_engine()
