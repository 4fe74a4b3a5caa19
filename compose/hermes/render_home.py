#!/usr/bin/env python3
"""Render a Hermes 0.19 HERMES_HOME from a config template and two secret files.

No secret is ever in the compose file, an image, argv or the process environment:

- `$HERMES_HOME/config.yaml`: the template (`AIP_HERMES_CONFIG`) with every `${AIP_MCP_TOKEN}`
  replaced by the MCP bearer token read from `AIP_MCP_TOKEN_FILE`;
- `$HERMES_HOME/.env`: API_SERVER_ENABLED/KEY/HOST/PORT, the key read from
  `AIP_HERMES_API_KEY_FILE` (host and port from API_SERVER_HOST/PORT, default 0.0.0.0:8642).

Both owner-only (0600). Why the token is written into the private config instead of being left
to Hermes' own `${VAR}` interpolation: Hermes hands its environment to the commands of its
terminal tool and strips only the names it knows (API_SERVER_KEY is one; an AIP_MCP_TOKEN
would not be), so a token in the environment would be one `env` away from the model. The
template stays a valid Hermes config either way.

The image's entrypoint runs this as root before the gateway starts; the image's config test
(tests/compose/test_hermes_image.py) runs it on the host and has the real Hermes load the
result. Standard library only: the image's base may be a minimal Debian root filesystem.
Exit status 2, with the reason on stderr (never a secret), when a file is missing or unfit.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

PLACEHOLDER = "${AIP_MCP_TOKEN}"
#: Hermes 0.19 logs "Refusing to start" for a shorter key, and then never listens.
MIN_KEY_LENGTH = 16
#: What a secret may hold: nothing that could end the `.env` line or the YAML string.
_SAFE = re.compile(r"[A-Za-z0-9._~+/=_-]+")


class RenderError(Exception):
    """A template or secret file the home cannot be rendered from."""


def _secret(path: Path, what: str) -> str:
    try:
        value = path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise RenderError(f"cannot read {what} from {path}: {exc.__class__.__name__}") from None
    if not value:
        raise RenderError(f"{what} in {path} is empty")
    if not _SAFE.fullmatch(value):
        raise RenderError(f"{what} in {path} holds a character other than [A-Za-z0-9._~+/=_-]")
    return value


def _write_private(path: Path, text: str) -> None:
    """Write `text` owner-only, replacing `path` atomically."""
    part = path.with_name(path.name + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(part, path)


def render(
    home: Path, template: Path, key_file: Path, token_file: Path, host: str, port: str
) -> None:
    """Write `home`'s config.yaml and .env, or raise RenderError having written neither."""
    try:
        config = template.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RenderError(f"no config template at {template}: {exc.__class__.__name__}") from None
    key = _secret(key_file, "the API server key")
    if len(key) < MIN_KEY_LENGTH:
        raise RenderError(f"the API server key in {key_file} is shorter than {MIN_KEY_LENGTH}")
    if PLACEHOLDER in config:
        config = config.replace(PLACEHOLDER, _secret(token_file, "the MCP token"))
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write_private(home / "config.yaml", config)
    _write_private(
        home / ".env",
        f"API_SERVER_ENABLED=true\nAPI_SERVER_KEY={key}\n"
        f"API_SERVER_HOST={host}\nAPI_SERVER_PORT={port}\n",
    )


def main() -> int:
    env = os.environ
    home = env.get("HERMES_HOME")
    if not home:
        print("hermes-render-home: HERMES_HOME is not set", file=sys.stderr)
        return 2
    try:
        render(
            Path(home),
            Path(env.get("AIP_HERMES_CONFIG", "/etc/aip/hermes/config.yaml")),
            Path(env.get("AIP_HERMES_API_KEY_FILE", "/run/secrets/hermes_api_key")),
            Path(env.get("AIP_MCP_TOKEN_FILE", "/run/secrets/mcp_token")),
            env.get("API_SERVER_HOST", "0.0.0.0"),  # noqa: S104 (in its own container)
            env.get("API_SERVER_PORT", "8642"),
        )
    except RenderError as exc:
        print(f"hermes-render-home: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
