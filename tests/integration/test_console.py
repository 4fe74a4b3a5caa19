"""The console (`aip-hermes-worker console`, docs/console.md) over HTTP: nothing but `/health`
answers without a token, a token sees only its tenant's records, and each page shows what
the bus and Redis hold. Real NATS, Redis, worker processes and the console process."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from schemas.result import ResultStatus
from tests.integration.console_support import (
    ALL,
    EXPIRED,
    ONLY_A,
    ONLY_B,
    ConsoleProcess,
    answer_once,
    console_process,
    write_tokens,
)
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_escalations import escalations
from worker.commands.exit_codes import Exit
from worker.testing.identities import (
    TENANT_A,
    TENANT_B,
    USER_A,
    USER_B,
    USER_UNTENANTED,
)
from worker.testing.scenario import NEEDS_APPROVAL, SLOW_REPLY

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture
def stack_env() -> dict[str, str]:
    # Both tenants and untenanted callers on one endpoint (docs/security.md, "Shared").
    return {"AIPD_HERMES_SHARED_ENDPOINTS": ENDPOINT}


@pytest.fixture
async def console(stack: Stack) -> AsyncIterator[ConsoleProcess]:
    await stack.spawn("w1")
    async with console_process(stack) as process:
        yield process


async def _completed(stack: Stack, principal: str, tenant: str | None) -> str:
    action = stack.action("models", principal_id=principal, tenant_id=tenant)
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    return action.id


async def test_nothing_but_health_answers_without_a_valid_token(console: ConsoleProcess) -> None:
    status, body, _ = await console.get("/health", None)
    assert status == 200
    assert "ok" in body
    for path in ("/runs", "/escalations", "/dlq", "/", f"/runs/{ENDPOINT}/act_x/chunks"):
        for token in (None, "not-a-token", EXPIRED):
            status, body, headers = await console.get(path, token)
            assert status == 401, (path, token, status)
            assert headers["WWW-Authenticate"].startswith("Bearer")
            assert 'name="token"' in body  # a browser gets the login form
    status, _, _ = await console.get("/runs", ALL)
    assert status == 200


async def test_login_sets_an_httponly_samesite_strict_cookie_that_lets_a_browser_in(
    console: ConsoleProcess,
) -> None:
    # unsafe: keep cookies for an IP address host (127.0.0.1), as a browser does.
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        async with session.post(
            console.url + "/login", data={"token": "wrong"}, allow_redirects=False
        ) as refused:
            assert refused.status == 401
            assert "Set-Cookie" not in refused.headers
        async with session.post(
            console.url + "/login", data={"token": ONLY_A}, allow_redirects=False
        ) as answer:
            assert answer.status == 303
            assert answer.headers["Location"] == "/runs"
            cookie = answer.headers["Set-Cookie"]
        assert "HttpOnly" in cookie
        assert "samesite=strict" in cookie.lower()
        assert "Path=/" in cookie
        async with session.get(console.url + "/runs") as page:
            assert page.status == 200, await page.text()
            assert "ops:a" in await page.text()
            assert page.headers["Cache-Control"] == "no-store"
            assert "script-src 'self'" in page.headers["Content-Security-Policy"]
        async with session.post(console.url + "/logout", allow_redirects=False) as out:
            assert out.status == 303
        async with session.get(console.url + "/runs", allow_redirects=False) as after:
            assert after.status == 401


async def test_a_token_sees_only_its_tenants_runs_and_the_filters_narrow_them(
    stack: Stack, console: ConsoleProcess
) -> None:
    a = await _completed(stack, USER_A, TENANT_A)
    b = await _completed(stack, USER_B, TENANT_B)
    plain = await _completed(stack, USER_UNTENANTED, None)

    _, every, _ = await console.get("/runs", ALL)
    assert a in every
    assert b in every
    assert plain in every
    assert every.count("completed") >= 3
    assert len(ISO.findall(every)) >= 6
    _, only_a, _ = await console.get("/runs", ONLY_A)
    assert a in only_a
    assert b not in only_a
    assert plain not in only_a
    _, only_b, _ = await console.get("/runs", ONLY_B)
    assert b in only_b
    assert a not in only_b
    assert plain not in only_b

    _, bob, _ = await console.get(f"/runs?principal={USER_B}", ALL)
    assert b in bob
    assert a not in bob
    assert plain not in bob
    _, here, _ = await console.get(f"/runs?endpoint={ENDPOINT}&state=completed", ALL)
    assert a in here
    assert b in here
    _, none, _ = await console.get("/runs?state=running", ALL)
    assert a not in none
    assert "No runs match" in none
    _, later, _ = await console.get("/runs?since=2999-01-01T00:00", ALL)
    assert a not in later
    status, _, _ = await console.get("/runs?since=yesterday", ALL)
    assert status == 400
    # A subject wildcard in a URL matches nothing (and breaks nothing).
    for wildcard in (">", "*", "h1.>"):
        status, page, _ = await console.get(f"/runs?endpoint={quote(wildcard)}", ALL)
        assert status == 200, page
        assert a not in page
        status, _, _ = await console.get(f"/runs/{quote(wildcard, safe='')}/{a}", ALL)
        assert status == 404

    # Another tenant's run does not exist for this token: the same 404 as a made-up id.
    status, _, _ = await console.get(f"/runs/{ENDPOINT}/{b}", ONLY_A)
    assert status == 404
    status, _, _ = await console.get(f"/runs/{ENDPOINT}/{b}/chunks", ONLY_A)
    assert status == 404
    status, page, _ = await console.get(f"/runs/{ENDPOINT}/{b}", ONLY_B)
    assert status == 200, page
    assert "&quot;status&quot;: &quot;completed&quot;" in page  # the result, escaped
    assert "&quot;settled_by&quot;: &quot;w1&quot;" in page
    for event in ("received", "admitted", "lease_acquired", "settled"):
        assert f"<strong>{event}</strong>" in page, event
    assert USER_B in page
    assert TENANT_B in page
    assert len(ISO.findall(page)) >= 5


async def test_a_runs_chunks_stream_as_server_sent_events_until_its_result(
    stack: Stack, console: ConsoleProcess
) -> None:
    """A streaming run (`chat_stream`): each chunk as an event, the terminal one last, then
    `end` carrying the result's status: the result, not the terminal chunk, ends it."""
    turn = {"messages": [{"role": "user", "content": "stream a short answer"}]}
    action = stack.action("chat_stream", turn)
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    status, body, headers = await console.get(f"/runs/{ENDPOINT}/{action.id}/chunks", ALL)
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    events = re.findall(r"^event: (\w+)$", body, re.M)
    assert events[-1] == "end", body
    assert events.count("chunk") >= 2, body
    assert set(events) == {"chunk", "end"}, body
    assert re.search(r"^data: " + ISO.pattern + r" #0 ", body, re.M), body
    chunk_lines = re.findall(r"^event: chunk\ndata: (.*)$", body, re.M)
    assert " done " in chunk_lines[-1], body  # the terminal chunk comes last
    assert body.rstrip().endswith("event: end\ndata: completed"), body
    _, page, _ = await console.get(f"/runs/{ENDPOINT}/{action.id}", ALL)
    assert "does not stream" not in page


async def test_a_non_streaming_run_has_no_chunk_event_and_ends_on_its_result(
    stack: Stack, console: ConsoleProcess
) -> None:
    """A `models` run (a non-streaming capability, as in AIP): its chunk subject stays empty,
    and the event stream is `end` alone, with the result's status, sent once the result is
    out (it does not wait for a terminal chunk that never comes)."""
    action_id = await _completed(stack, USER_UNTENANTED, None)
    assert await stack.chunks(action_id) == []
    started = time.monotonic()
    status, body, _ = await console.get(f"/runs/{ENDPOINT}/{action_id}/chunks", ALL)
    assert status == 200
    assert time.monotonic() - started < 10, "ended on the result, not on a silence timeout"
    assert re.findall(r"^event: (\w+)$", body, re.M) == ["end"], body
    assert "data: completed" in body, body
    status, page, _ = await console.get(f"/runs/{ENDPOINT}/{action_id}", ALL)
    assert status == 200
    assert "This capability does not stream" in page


async def test_an_escalation_shows_what_waits_for_whom_and_its_command_until_resolved(
    stack: Stack, console: ConsoleProcess
) -> None:
    action, handle = await stack.operator(f"{NEEDS_APPROVAL} tidy the files")
    paused = await handle.result(timeout_s=60)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    [escalation] = await escalations(stack)

    _, page, _ = await console.get("/escalations", ALL)
    eid = escalation.escalation_id
    assert eid in page
    assert action.id in page
    assert "approver of the approval authority" in page
    assert "approval.request" in page  # the redacted prompt, read from the binding
    assert "chmod" not in page  # the command stays sealed: a digest only
    assert (
        f"aip-hermes-worker escalations resolve {eid} --endpoint {ENDPOINT} --as "
        "&lt;APPROVER_ID&gt; --key &lt;APPROVER_SEED_FILE&gt; --choice &lt;"
    ) in page
    assert len(ISO.findall(page)) >= 1
    _, other_tenant, _ = await console.get("/escalations", ONLY_A)
    assert eid not in other_tenant
    assert "Nothing waits" in other_tenant

    await answer_once(stack, eid)
    _, after, _ = await console.get("/escalations", ALL)
    assert eid not in after


async def test_the_dlq_page_shows_reasons_to_an_all_tenants_token_only(
    stack: Stack, console: ConsoleProcess
) -> None:
    await stack.publish_raw(b'{"not": "an action"}')
    deadline = time.monotonic() + 20
    while not await stack.dlq():
        assert time.monotonic() < deadline, "nothing was dead-lettered"
        await asyncio.sleep(0.1)
    _, page, _ = await console.get("/dlq", ALL)
    assert "dlq_" in page
    assert "aip-hermes-worker dlq show dlq_" in page
    assert "schema.envelope.invalid" in page, page
    assert "unknown Envelope field" in page  # not an AIP Envelope
    assert len(ISO.findall(page)) >= 1
    _, scoped, _ = await console.get("/dlq", ONLY_A)
    assert "dlq_" not in scoped
    assert "all-tenants token" in scoped


async def test_the_workers_page_shows_each_workers_slots_leases_and_readiness(
    stack: Stack, console: ConsoleProcess
) -> None:
    await stack.spawn("w2", AIPD_CONCURRENCY="3")
    action, handle = await stack.operator(f"{SLOW_REPLY} count slowly")
    owner, deadline = "", time.monotonic() + 20
    while not owner:
        assert time.monotonic() < deadline, "no worker leased the run"
        owner = (await stack.lease(action.id)).get("owner", "")
        await asyncio.sleep(0.05)
    holder = owner.split("#")[0]
    capacity = "64" if holder == "w1" else "3"

    _, page, _ = await console.get("/workers", ALL)
    assert "<code>w1</code>" in page, page
    assert "<code>w2</code>" in page
    row = re.search(rf"<tr><td><code>{holder}</code></td>.*?</tr>", page)
    assert row is not None, page
    assert f"<td>1/{capacity}</td><td>1</td>" in row.group(0)  # one slot, one lease
    assert ">ready<" in row.group(0)
    assert "<td>serving</td>" in row.group(0)

    assert (await handle.result(timeout_s=60)).status is ResultStatus.COMPLETED
    await stack.settled_and_acked()
    _, after, _ = await console.get("/workers", ALL)
    assert f"<td>0/{capacity}</td><td>0</td>" in after
    _, scoped, _ = await console.get("/workers", ONLY_A)
    assert "<code>w1</code>" not in scoped
    assert "all-tenants token" in scoped


async def test_a_tokens_file_others_may_read_stops_the_console_before_it_serves(
    tmp_path: Path,
) -> None:
    tokens = write_tokens(tmp_path / "tokens.json")
    tokens.chmod(0o640)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker",
        "console",
        env={
            **os.environ,
            "AIPD_CONSOLE_TOKENS_FILE": str(tokens),
            "AIPD_CONSOLE_PORT": "0",
            "AIPD_NATS_URL": "nats://127.0.0.1:1",
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == Exit.CONFIGURATION, err
    assert b"console tokens file" in err
    assert b"chmod 600" in err
