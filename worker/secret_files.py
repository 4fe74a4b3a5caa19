"""Read secrets from owner-only files, and keep them out of every repr.

A key is accepted only from a regular, non-empty, bounded file that neither group nor
others may read or write: a key that others could read is already leaked, and refusing it
at startup is cheaper than discovering it later.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from worker.errors import SecretFileError

MAX_SECRET_BYTES = 64 * 1024


class Secret:
    """A string that never shows itself in repr, str, logs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def check_owner_only(path: Path, *, what: str, max_bytes: int = MAX_SECRET_BYTES) -> os.stat_result:
    try:
        info = path.stat()
    except OSError as exc:
        raise SecretFileError(f"{what} {path}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise SecretFileError(f"{what} {path}: not a regular file")
    if info.st_mode & 0o077:
        raise SecretFileError(
            f"{what} {path}: mode {stat.filemode(info.st_mode)} lets group or others in; "
            "chmod 600 it"
        )
    if info.st_size == 0:
        raise SecretFileError(f"{what} {path}: empty")
    if info.st_size > max_bytes:
        raise SecretFileError(f"{what} {path}: larger than {max_bytes} bytes")
    return info


def read_secret_file(path: Path, *, what: str = "secret file") -> Secret:
    check_owner_only(path, what=what)
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise SecretFileError(f"{what} {path}: only whitespace")
    return Secret(value)
