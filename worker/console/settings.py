"""The console's own settings (`AIPD_CONSOLE_*`): where it listens and whom it lets in.

How it reaches NATS and Redis and which worker keys it believes are the worker's settings
(`AIPD_NATS_*`, `AIPD_REDIS_*`, `AIPD_TRUSTED_WORKER_KEYS_FILE`, also as flags), read as the
`escalations` and `dlq` commands read them; only what no other command has lives here, so a
worker never needs a console-only file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsoleSettings(BaseSettings):
    """`aip-hermes-worker console` configuration (every field is an `AIPD_*` variable).

    The docstring under each field is its documentation: `docs/configuration.md`
    ("Console", generated and drift-checked) says the same thing."""

    model_config = SettingsConfigDict(
        env_prefix="AIPD_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    console_host: str = "127.0.0.1"
    """Where the console listens (its pages, `/login` and the open `/health`)."""
    console_port: Annotated[int, Field(ge=0, le=65_535)] = 8090
    """The port of `console_host` (0: any free port)."""
    console_tokens_file: Path
    """The console's bearer tokens: a JSON array of token hashes (never tokens), each scoped
    to one tenant or `*` (all), owner-only like the gateway's principals file
    (docs/console.md, "Tokens")."""
    console_max_runs: Annotated[int, Field(ge=1, le=100_000)] = 500
    """The newest runs one runs page reads (the streams' retention is the real limit)."""
