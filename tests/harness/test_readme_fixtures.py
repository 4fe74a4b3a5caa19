"""The README's fixture example, as a new user gets it: a fresh project, a fresh venv,
`pip install '<this project>[testing]'`, `pytest`.

The configuration block and the example test are cut from README.md between their markers
(`fixtures-config`, `fixtures-example`) and written unchanged into an empty directory, so
the README cannot drift from what passes. The inner run must report every example passed,
none skipped, and no warning. The project is installed from a copy of what its
wheel holds (pyproject.toml, README.md and the three packages), not from this checkout in
place: setuptools writes `build/` next to the sources, and a test must not write into the
tree other tests import from. pip's cache is the user's own, so only the first run on a
machine downloads anything.

One test, not parametrized: it runs once in the normal suite (on whichever xdist process
takes it), and the inner run's tests are nowhere under `tests/`, so this suite never
collects them itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: What the wheel is built from (pyproject.toml's packages.find and readme).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "schemas", "subjects", "worker")
#: Variables of this run that must not leak into the new user's: they would point the inner
#: pytest at this suite's plugins, options, servers or interpreter.
_OUTER_ONLY = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")

pytestmark = pytest.mark.timeout(900)


def readme_block(name: str) -> str:
    """The fenced code block between `<!-- name:start -->` and `<!-- name:end -->`."""
    text = README.read_text(encoding="utf-8")
    found = re.search(
        rf"<!-- {name}:start -->\n```[a-z]*\n(.*?)```\n<!-- {name}:end -->", text, re.DOTALL
    )
    assert found is not None, f"README.md has no fenced block between the {name} markers"
    return found.group(1)


def _copy_wheel_sources(target: Path) -> Path:
    target.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in WHEEL_SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=ignore)
        else:
            shutil.copy2(source, target / name)
    return target


def _run(command: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"`{' '.join(command)}` exited {done.returncode}:\n" + "\n".join(
        output.splitlines()[-60:]
    )
    return output


def test_the_readme_fixture_example_passes_in_a_fresh_project(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in _OUTER_ONLY}
    project = tmp_path / "my-project"
    project.mkdir()
    (project / "pyproject.toml").write_text(readme_block("fixtures-config"), encoding="utf-8")
    (project / "test_example.py").write_text(readme_block("fixtures-example"), encoding="utf-8")
    source = _copy_wheel_sources(tmp_path / "aip-hermes-worker")

    began = time.monotonic()
    venv = tmp_path / "venv"
    # No pip inside the venv (ensurepip alone took 38 s on a loaded machine): this run's pip
    # installs into it (`pip --python`), exactly as the venv's own would. No byte-compiling
    # either, the larger part of the install's CPU time; Python compiles what it imports.
    _run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        cwd=tmp_path,
        env=env,
        timeout_s=120,
    )
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-compile"]
    _run([*pip, f"{source}[testing]"], cwd=tmp_path, env=env, timeout_s=600)
    installed = time.monotonic() - began

    # The installed project, not this checkout: nothing of the source tree is importable.
    where = _run(
        [python, "-c", "import worker, pytest_asyncio; print(worker.__file__)"],
        cwd=project,
        env=env,
        timeout_s=60,
    )
    assert str(venv) in where, where

    ran = time.monotonic()
    output = _run([python, "-m", "pytest", "-q"], cwd=project, env=env, timeout_s=300)
    examples = readme_block("fixtures-example").count("\nasync def test_")
    assert re.search(rf"\b{examples} passed\b", output), output
    assert not re.search(r"\b(skipped|failed|error|warnings?)\b", output), output
    print(f"fresh venv and install {installed:.0f}s, example run {time.monotonic() - ran:.0f}s")
