"""The pytest side of `aip-hermes-worker conformance`: run only the family-tagged tests, on
the Hermes the report asks for, and write what each did to one JSON file.

Loaded with `-p worker.testing.conformance_plugin` by the conformance command only (the
normal suite never loads it, so it selects nothing there). A test proves a family's
assertions with `@pytest.mark.aip_family("family", assertions=[...])`; it may record
artifact ids (an Action id, a run id) with pytest's own `record_property("aip_artifact", id)`.

Which variant of a test runs: a test parametrized over the fake and the real Hermes (a
parameter value `real`, or the `real_hermes` marker) runs its fake variant for the
`deterministic` provider and both for `live`; the post-0.19 `fake-upstream` variant never
runs (the pinned Hermes is 0.19.0). Under xdist the outcome travels in the report's
`user_properties`, so the controller alone writes the file.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from worker.conformance.families import check_tag
from worker.errors import UnknownFamily

MARKER = "aip_family"
ARTIFACT_PROPERTY = "aip_artifact"
_TAGS = "aip_conformance_tags"
_HERMES = "aip_conformance_hermes"
_FAILED = {"failed", "error"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aip-conformance")
    group.addoption("--aip-conformance-out", metavar="FILE", help="where node outcomes go")
    group.addoption(
        "--aip-conformance-provider",
        choices=("deterministic", "live"),
        default="deterministic",
        help="fake Hermes variants only, or the real Hermes variants too",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(family, assertions): the AIP conformance assertions a test proves"
    )
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Collector(config), "aip_conformance_collector")


def tags_of(item: pytest.Item) -> list[dict[str, Any]]:
    """The item's family tags, checked against the kit's vocabulary."""
    tags = []
    for mark in item.iter_markers(MARKER):
        family = mark.args[0] if mark.args else mark.kwargs.get("family")
        assertions = tuple(mark.kwargs.get("assertions", mark.args[1:]))
        try:
            check_tag(str(family), assertions)
        except UnknownFamily as exc:
            raise pytest.UsageError(f"{item.nodeid}: {exc}") from exc
        tags.append({"family": family, "assertions": list(assertions)})
    return tags


def hermes_of(item: pytest.Item) -> str:
    """`real`, `fake-upstream` or `fake`: which Hermes the variant runs against. Its
    parameter says so (a value `real`/`fake`/`fake-upstream`, or the operator tests' id
    `hermes-upstream`); an unparametrized test marked `real_hermes` runs on the real one."""
    params = getattr(item, "callspec", None)
    values = [v for v in params.params.values() if isinstance(v, str)] if params is not None else []
    if "fake-upstream" in values or (params is not None and "hermes-upstream" in params.id):
        return "fake-upstream"
    for kind in ("real", "fake"):
        if kind in values:
            return kind
    return "real" if item.get_closest_marker("real_hermes") is not None else "fake"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    live = config.getoption("--aip-conformance-provider") == "live"
    wanted = {"fake", "real"} if live else {"fake"}
    keep, drop = [], []
    for item in items:
        if item.get_closest_marker(MARKER) is not None and hermes_of(item) in wanted:
            tags_of(item)  # a bad tag stops the run before anything runs
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if item.get_closest_marker(MARKER) is not None:
        report.user_properties.append((_TAGS, tags_of(item)))
        report.user_properties.append((_HERMES, hermes_of(item)))


class _Collector:
    """Folds the setup, call and teardown reports of each node into one outcome."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.nodes: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if _TAGS not in props:
            return
        node = self.nodes.setdefault(
            report.nodeid,
            {
                "nodeid": report.nodeid,
                "outcome": "passed",
                "hermes": props[_HERMES],
                "tags": props[_TAGS],
                "recorded": [],
                "ran_call": False,
            },
        )
        node["recorded"] = [
            str(value) for name, value in report.user_properties if name == ARTIFACT_PROPERTY
        ] or node["recorded"]
        if report.outcome in _FAILED:
            node["outcome"] = "failed"
        elif report.outcome == "skipped" and node["outcome"] != "failed":
            node["outcome"] = "skipped"
        if report.when == "call":
            node["ran_call"] = True

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        target = self.config.getoption("--aip-conformance-out")
        if not target:
            return
        rows = []
        for node in self.nodes.values():
            # A node that never reached its call (an error in setup) did not prove anything.
            if node["outcome"] == "passed" and not node.pop("ran_call"):
                node["outcome"] = "failed"
            node.pop("ran_call", None)
            rows.append(node)
        Path(target).write_text(json.dumps({"nodes": rows}, indent=1) + "\n")
