"""The bench's optional imports: missing ones are named with the command that installs them."""

from __future__ import annotations

import sys

import pytest

from tests.bench import OPTIONAL, BenchExtraMissing, require


def test_a_missing_bench_module_is_named_with_its_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # as if the extra were not installed
    monkeypatch.setitem(sys.modules, "arq", None)
    with pytest.raises(BenchExtraMissing) as caught:
        require("psutil", "arq")
    message = str(caught.value)
    assert "psutil, arq" in message
    assert OPTIONAL["psutil"] in message
    assert OPTIONAL["arq"] in message
    assert isinstance(caught.value, ModuleNotFoundError)

