"""Path identifiers and bounded text shared by the operation input types.

Every id that lands in a URL path is validated against the shape Hermes 0.19 mints, so an
input can never address another route (route filling also percent-quotes each value). Text
that Hermes passes to the model is bounded here; the whole Action envelope is additionally
capped by `Settings.max_envelope_bytes` before any of this is decoded.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from schemas.ids import RUN_ID_PATTERN

#: `run_` + 32 hex, as `POST /v1/runs` answers.
RunId = Annotated[str, msgspec.Meta(pattern=RUN_ID_PATTERN)]
#: 12 hex, the only form the jobs API accepts (anything else is its 400).
JobId = Annotated[str, msgspec.Meta(pattern=r"^[a-f0-9]{12}\Z")]
#: `resp_` + 28 hex, as `/v1/responses` mints them.
ResponseId = Annotated[str, msgspec.Meta(pattern=r"^resp_[0-9a-f]{28}\Z")]
#: Session ids as Hermes creates them (`api_<epoch>_<hex>`, `api-<hex>`, uuid4, run ids,
#: `aip-operator-act_…`) or a caller chose them: ≤ 256 characters, no path separators, no
#: `..`, no drive prefix, no control characters. Stricter than Hermes' fork (which accepts
#: `/`), so a session only a fork could name is not addressable here.
SessionId = Annotated[str, msgspec.Meta(pattern=r"^(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_.-]{0,255}\Z")]

#: Model route names and other short labels.
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
#: Titles as Hermes bounds them (100 after cleaning; longer is a 400, or a 500 on create).
Title = Annotated[str, msgspec.Meta(max_length=100)]
#: A prompt, a message or instructions sent to the model.
Prompt = Annotated[str, msgspec.Meta(min_length=1, max_length=262_144)]
#: Instructions appended to Hermes' system prompt.
Instructions = Annotated[str, msgspec.Meta(max_length=65_536)]
#: One OpenAI-style content part (`{"type": "text", "text": …}`); Hermes validates the type.
ContentPart = Annotated[dict[str, Any], msgspec.Meta(min_length=1, max_length=16)]
ContentParts = Annotated[list[ContentPart], msgspec.Meta(min_length=1, max_length=64)]
#: A free-form provider object (a tool schema, a prior tool call): bounded in keys here and
#: in bytes by the envelope limit.
ProviderObject = Annotated[dict[str, Any], msgspec.Meta(max_length=64)]
