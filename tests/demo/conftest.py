"""The demo tests run real processes for tens of seconds: `-m "not demo"` deselects them."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "demo: runs `aip-hermes-worker demo` end to end (deselect with -m 'not demo')"
    )
