"""Turn every Settings field into a CLI flag, so flags and `AIPD_*` variables never drift.

`--lease-ttl-ms 5000` overrides `AIPD_LEASE_TTL_MS`; booleans get `--x/--no-x`. The only field
without a flag is the API key value: a key is never accepted on the command line.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from worker.errors import SettingsError
from worker.settings import Settings

NO_FLAG = frozenset({"hermes_api_key"})


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings (each also AIPD_<NAME>)")
    for name, field in Settings.model_fields.items():
        if name in NO_FLAG:
            continue
        flag = "--" + name.replace("_", "-")
        description = " ".join((field.description or "").split()).replace("%", "%%")
        help_text = f"{description} (env AIPD_{name.upper()})"
        if field.annotation is bool:
            group.add_argument(
                flag,
                dest=f"setting_{name}",
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            group.add_argument(flag, dest=f"setting_{name}", default=None, help=help_text)


def settings_from(args: argparse.Namespace, **defaults: Any) -> Settings:
    """Environment first, then flags; raises SettingsError naming each bad field."""
    overrides = dict(defaults)
    for key, value in vars(args).items():
        if key.startswith("setting_") and value is not None:
            overrides[key.removeprefix("setting_")] = value
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SettingsError(problems) from None
