"""Credentials never cross a channel, in either direction: the one redaction both use.

Egress (normalize.py) sends results and escalations into Hermes sessions; ingress
(ingress.py) publishes what those sessions hold, tool output included, on the bus for any
reader of `aip.hermes.{endpoint}.inbound.*`. A tool that prints an API key must not put it
on the bus verbatim (issue 27), so both paths drop what names a credential:

- `scrub`: in a JSON value, every key naming a credential (`api_key`, `secret`, `token`,
  `password`, `authorization`, `credential`, `seed`, `cookie`, any case) has its value
  replaced by `[redacted]`, at any depth;
- `scrub_text`: free text that is a JSON object or array is scrubbed as above; any other
  text has `name: value` / `name=value` pairs whose name names a credential, and
  `Bearer …` credentials, replaced by `[redacted]`.

A redaction is a denylist: it catches credentials named as such, not a bare secret with
nothing around it (docs/channels.md, "What is redacted").
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

SECRET_KEY = re.compile(
    r"(api[_-]?key|secret|token|password|passwd|authorization|credential|seed|cookie)",
    re.IGNORECASE,
)
REDACTED = "[redacted]"
_MAX_DEPTH = 32
#: What follows a credential's name in `name: value`, `name=value`, `"name": "value"`:
#: matched only right after a name `SECRET_KEY` found, every repetition bounded, so the
#: cost stays linear in the text (a hostile provider chooses it).
_AFTER_NAME = re.compile(
    r"""[\w.-]{0,40}["']?(?P<sep>\s{0,8}[:=]\s{0,8})(?P<quote>["']?)"""
    r"""(?P<value>(?:bearer\s+)?[^\s"',;}]+)""",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)


def scrub(value: Any, depth: int = 0) -> Any:
    """`value` with the value of every credential-named key replaced (any depth)."""
    if depth > _MAX_DEPTH:
        return "…"
    if isinstance(value, dict):
        return {
            str(k): REDACTED if SECRET_KEY.search(str(k)) else scrub(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [scrub(v, depth + 1) for v in value]
    return value


def scrub_text(text: str) -> str:
    """`text` with credentials named in it replaced (module docstring)."""
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            document = msgspec.json.decode(text)
        except msgspec.DecodeError:
            pass
        else:
            scrubbed = scrub(document)
            return text if scrubbed == document else msgspec.json.encode(scrubbed).decode()
    return _BEARER.sub(lambda m: f"{m.group(1)}{REDACTED}", _named_values(text))


def _named_values(text: str) -> str:
    """`text` with the value after every credential name replaced."""
    parts: list[str] = []
    done = 0
    for name in SECRET_KEY.finditer(text):
        if name.start() < done:
            continue  # inside a value already replaced
        after = _AFTER_NAME.match(text, name.end())
        if after is None:
            continue
        parts += [text[done : after.start("value")], REDACTED]
        done = after.end("value")
    parts.append(text[done:])
    return "".join(parts)
