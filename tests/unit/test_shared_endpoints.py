"""Which endpoints are shared between tenants: configured explicitly, never by accident."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.endpoints import endpoint_descriptors
from worker.operations.partition import partition_prefix
from worker.settings import Settings


def test_the_shared_list_marks_exactly_the_endpoints_it_names() -> None:
    settings = Settings(
        hermes_endpoints="h1=http://127.0.0.1:1,h2=http://127.0.0.1:2",
        hermes_shared_endpoints="H1",
    )
    assert {d.id: d.shared for d in endpoint_descriptors(settings)} == {"h1": True, "h2": False}


def test_a_shared_list_naming_an_unconfigured_endpoint_stops_startup() -> None:
    settings = Settings(hermes_endpoints="h1=http://127.0.0.1:1", hermes_shared_endpoints="h9")
    with pytest.raises(ValueError, match="h9, which is not configured"):
        endpoint_descriptors(settings)


def test_an_endpoint_is_bound_to_a_tenant_or_shared_never_both(tmp_path: Path) -> None:
    bound = {"id": "h1", "url": "http://127.0.0.1:1", "tenant_id": "tenant-a"}
    both = tmp_path / "both.json"
    both.write_text(json.dumps([{**bound, "shared": True}]), encoding="utf-8")
    with pytest.raises(ValueError, match="bound to a tenant or shared"):
        endpoint_descriptors(Settings(hermes_endpoints_file=both))
    listed = tmp_path / "bound.json"
    listed.write_text(json.dumps([bound]), encoding="utf-8")
    with pytest.raises(ValueError, match="bound to a tenant or shared"):
        endpoint_descriptors(Settings(hermes_endpoints_file=listed, hermes_shared_endpoints="h1"))


def test_partition_prefixes_differ_per_tenant_and_are_valid_hermes_ids() -> None:
    prefixes = {partition_prefix(t) for t in ("tenant-a", "tenant-b", None)}
    assert len(prefixes) == 3
    assert partition_prefix(None) == "t7a95719888c0-"  # documented in docs/security.md
    for prefix in prefixes:
        assert prefix.isascii()
        for forbidden in ("/", "\\", ".."):  # what Hermes refuses in a session id
            assert forbidden not in prefix
