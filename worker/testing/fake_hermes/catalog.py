"""Static discovery data of Hermes 0.19.0: capabilities document and the toolset list.

The capabilities body is verbatim from the observed server (note `jobs_admin: false` although
the jobs routes work). Toolset names, order, `enabled`/`configured` flags and the terminal
entry are as observed; the other labels, descriptions and tool lists are best-effort copies.
"""

from __future__ import annotations

from typing import Any

from worker.testing.fake_hermes.config import ADVERTISED_MODEL

_FEATURES: dict[str, Any] = {
    "chat_completions": True,
    "chat_completions_streaming": True,
    "responses_api": True,
    "responses_streaming": True,
    "run_submission": True,
    "run_status": True,
    "run_events_sse": True,
    "run_stop": True,
    "run_approval_response": True,
    "tool_progress_events": True,
    "approval_events": True,
    "session_resources": True,
    "session_chat": True,
    "session_chat_streaming": True,
    "session_fork": True,
    "admin_config_rw": False,
    "jobs_admin": False,
    "memory_write_api": False,
    "skills_api": True,
    "audio_api": False,
    "realtime_voice": False,
    "session_continuity_header": "X-Hermes-Session-Id",
    "session_key_header": "X-Hermes-Session-Key",
    "cors": False,
}

_ENDPOINTS: tuple[tuple[str, str, str], ...] = (
    ("health", "GET", "/health"),
    ("health_detailed", "GET", "/health/detailed"),
    ("models", "GET", "/v1/models"),
    ("chat_completions", "POST", "/v1/chat/completions"),
    ("responses", "POST", "/v1/responses"),
    ("runs", "POST", "/v1/runs"),
    ("run_status", "GET", "/v1/runs/{run_id}"),
    ("run_events", "GET", "/v1/runs/{run_id}/events"),
    ("run_approval", "POST", "/v1/runs/{run_id}/approval"),
    ("run_stop", "POST", "/v1/runs/{run_id}/stop"),
    ("skills", "GET", "/v1/skills"),
    ("toolsets", "GET", "/v1/toolsets"),
    ("sessions", "GET", "/api/sessions"),
    ("session_create", "POST", "/api/sessions"),
    ("session", "GET", "/api/sessions/{session_id}"),
    ("session_update", "PATCH", "/api/sessions/{session_id}"),
    ("session_delete", "DELETE", "/api/sessions/{session_id}"),
    ("session_messages", "GET", "/api/sessions/{session_id}/messages"),
    ("session_fork", "POST", "/api/sessions/{session_id}/fork"),
    ("session_chat", "POST", "/api/sessions/{session_id}/chat"),
    ("session_chat_stream", "POST", "/api/sessions/{session_id}/chat/stream"),
)

_RUNTIME_DESCRIPTION = (
    "The API server creates a server-side Hermes AIAgent; tools execute on the API-server host "
    "unless a future explicit split-runtime mode is enabled."
)


def capabilities(*, runs_idempotency: bool = False) -> dict[str, Any]:
    """The `GET /v1/capabilities` body; `runs_idempotency` adds the post-0.19 flag."""
    features = dict(_FEATURES)
    if runs_idempotency:
        features["runs_idempotency"] = True
    return {
        "object": "hermes.api_server.capabilities",
        "platform": "hermes-agent",
        "model": ADVERTISED_MODEL,
        "auth": {"type": "bearer", "required": True},
        "runtime": {
            "mode": "server_agent",
            "tool_execution": "server",
            "split_runtime": False,
            "description": _RUNTIME_DESCRIPTION,
        },
        "features": features,
        "endpoints": {name: {"method": m, "path": p} for name, m, p in _ENDPOINTS},
    }


# (name, label with emoji, description, enabled, tools)
_TOOLSETS: tuple[tuple[str, str, str, bool, tuple[str, ...]], ...] = (
    (
        "web",
        "\U0001f50d Web Search & Scraping",
        "web_search, web_extract",
        True,
        ("web_extract", "web_search"),
    ),
    (
        "browser",
        "\U0001f310 Browser Automation",
        "navigate, click, type, scroll",
        True,
        ("browser_click", "browser_navigate", "browser_scroll", "browser_snapshot", "browser_type"),
    ),
    (
        "terminal",
        "\U0001f4bb Terminal & Processes",
        "terminal, process",
        True,
        ("process", "terminal"),
    ),
    (
        "file",
        "\U0001f4c1 File Operations",
        "read, write, patch, search",
        True,
        ("patch", "read_file", "search_files", "write_file"),
    ),
    ("code_execution", "\u26a1 Code Execution", "execute_code", True, ("execute_code",)),
    (
        "vision",
        "\U0001f441\ufe0f  Vision / Image Analysis",
        "vision_analyze",
        True,
        ("vision_analyze",),
    ),
    ("video", "\U0001f3ac Video Analysis", "video_analyze", False, ("video_analyze",)),
    ("image_gen", "\U0001f3a8 Image Generation", "image_generate", True, ("image_generate",)),
    ("video_gen", "\U0001f3ac Video Generation", "video_generate", False, ("video_generate",)),
    ("x_search", "\U0001f426 X (Twitter) Search", "x_search", False, ("x_search",)),
    ("tts", "\U0001f50a Text-to-Speech", "text_to_speech", False, ("text_to_speech",)),
    (
        "skills",
        "\U0001f4da Skills",
        "list, view, manage",
        True,
        ("skill_manage", "skill_view", "skills_list"),
    ),
    ("todo", "\U0001f4cb Task Planning", "todo", True, ("todo",)),
    ("memory", "\U0001f4be Memory", "persistent memory across sessions", True, ("memory",)),
    ("context_engine", "\U0001f9e0 Context Engine", "context engine tools", False, ()),
    (
        "session_search",
        "\U0001f50e Session Search",
        "search past conversations",
        True,
        ("session_search",),
    ),
    ("clarify", "\u2753 Clarifying Questions", "clarify", False, ("clarify",)),
    ("delegation", "\U0001f465 Task Delegation", "delegate_task", True, ("delegate_task",)),
    ("cronjob", "\u23f0 Cron Jobs", "create/list/update/pause/resume/run", True, ("cronjob",)),
    (
        "homeassistant",
        "\U0001f3e0 Home Assistant",
        "smart home device control",
        False,
        ("ha_call_service", "ha_get_state", "ha_list_entities", "ha_list_services"),
    ),
    ("spotify", "\U0001f3b5 Spotify", "spotify playback control", False, ("spotify",)),
    ("discord", "\U0001f4ac Discord", "discord messaging", False, ("discord",)),
    (
        "discord_admin",
        "\U0001f6e1\ufe0f  Discord Admin",
        "discord server administration",
        False,
        ("discord_admin",),
    ),
    ("yuanbao", "\U0001f916 Yuanbao", "yuanbao", False, ("yuanbao",)),
    (
        "computer_use",
        "\U0001f5b1\ufe0f  Computer Use (macOS)",
        "computer_use",
        False,
        ("computer_use",),
    ),
)


def toolsets() -> dict[str, Any]:
    """The `GET /v1/toolsets` body (25 entries; only homeassistant is unconfigured)."""
    return {
        "object": "list",
        "platform": "api_server",
        "data": [
            {
                "name": name,
                "label": label,
                "description": description,
                "enabled": enabled,
                "configured": name != "homeassistant",
                "tools": sorted(tools),
            }
            for name, label, description, enabled, tools in _TOOLSETS
        ],
    }
