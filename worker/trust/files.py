"""Read the trust files (gateway keys, identity directory, approval authority) safely.

These files are policy: whoever can write one can admit any Action, so a file that group or
others may write is refused at startup rather than trusted. Each is read through one file
descriptor (checked with `fstat`, then read), so a swap between the check and the read is not
possible, and a FIFO or device cannot stall startup.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from worker.errors import TrustConfigError

#: The spec's bound for the authority directory; the other trust files share it.
MAX_POLICY_FILE_BYTES = 1_048_576


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PolicyFile:
    path: Path
    data: bytes
    mode: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def readable_by_others(self) -> bool:
        return bool(self.mode & 0o077)


def read_policy_file(path: Path, *, what: str) -> PolicyFile:
    """The bytes of a regular, non-empty file under 1 MiB that only its owner may write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise TrustConfigError(f"{what} {path}: cannot be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TrustConfigError(f"{what} {path}: not a regular file")
        if info.st_mode & 0o022:
            raise TrustConfigError(
                f"{what} {path}: mode {stat.filemode(info.st_mode)} lets group or others "
                "write it; chmod go-w it"
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_POLICY_FILE_BYTES)
    finally:
        os.close(fd)
    if not data.strip():
        raise TrustConfigError(f"{what} {path}: empty")
    if len(data) >= MAX_POLICY_FILE_BYTES:
        raise TrustConfigError(f"{what} {path}: not smaller than 1 MiB")
    return PolicyFile(path=path, data=data, mode=info.st_mode)


def has_expired(expires_at_unix_ms: int | None, now_ms: int) -> bool:
    """True for a record whose expiry has passed at `now_ms`: such a record of a trust file
    is skipped at load with a warning, never a reason to refuse the whole file (an entry
    expiring on schedule must not stop the next restart of every worker)."""
    return expires_at_unix_ms is not None and expires_at_unix_ms <= now_ms


def describe_principal(value: object) -> str:
    """A principal id fit for an error message: quoted, printable, and short."""
    text = value if isinstance(value, str) else "?"
    shown = "".join(ch if ch.isprintable() else "?" for ch in text[:80])
    return repr(shown + ("…" if len(text) > 80 else ""))


def policy_records(
    policy: PolicyFile, path: Path, *, what: str, noun: str, record_type: type[T]
) -> Iterator[tuple[int, str, T]]:
    """Each record of a JSON-array policy file, typed, with `where` to name it in errors.

    The identity directory and the approval authority share this shape: a non-empty array
    of strict records, every error naming the record's index and principal, never a value.
    """
    try:
        raw: Any = msgspec.json.decode(policy.data)
    except msgspec.DecodeError as exc:
        raise TrustConfigError(f"{what} {path}: not JSON ({exc})") from None
    return typed_records(raw, path, what=what, noun=noun, record_type=record_type)


def typed_records(
    raw: Any, path: Path, *, what: str, noun: str, record_type: type[T]
) -> Iterator[tuple[int, str, T]]:
    """`policy_records` of an already decoded array (a file whose records sit under a key)."""
    if not isinstance(raw, list) or not raw:
        raise TrustConfigError(f"{what} {path}: must be a non-empty JSON array")
    for index, item in enumerate(raw):
        where = f"{what} {path}: {noun} {index}"
        if isinstance(item, dict):
            where += f" (principal {describe_principal(item.get('principal_id'))})"
        try:
            record = msgspec.convert(item, record_type, strict=True)
        except msgspec.ValidationError as exc:
            raise TrustConfigError(f"{where}: {exc}") from None
        yield index, where, record
