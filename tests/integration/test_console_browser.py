"""The console in a real browser: headless Chromium (Debian's package) driven by Playwright.

A person logs in with the form, watches a run appear, stream and end, and an escalation
appear and disappear when it is resolved; every page is photographed under the test's tmp
dir. With `AIPD_TEST_CONSOLE_SCREENSHOTS_DIR` set (`docs/console`), the runs page and the run
page are also written there, for the README. Without Chromium or Playwright the test skips
locally and fails under `CI=true` (the project's policy for a missing service).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from schemas.result import ResultStatus
from tests.integration.console_support import ALL, ConsoleProcess, answer_once, console_process
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_escalations import escalations
from worker.testing.pytest_plugin import service_unavailable
from worker.testing.scenario import NEEDS_APPROVAL, SLOW_REPLY

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS_ENV = "AIPD_TEST_CONSOLE_SCREENSHOTS_DIR"
#: How long a page may take to show what the bus already holds.
SHOWN_S = 30.0


@pytest.fixture
def stack_env() -> dict[str, str]:
    return {"AIPD_HERMES_SHARED_ENDPOINTS": ENDPOINT}


@pytest.fixture
async def browser_page() -> AsyncIterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        service_unavailable(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        service_unavailable("the playwright package is not installed (the test extra)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = await browser.new_context(viewport={"width": 1400, "height": 900})
            yield await context.new_page()
        finally:
            await browser.close()


@pytest.fixture
async def console(stack: Stack) -> AsyncIterator[ConsoleProcess]:
    await stack.spawn("w1")
    async with console_process(stack) as process:
        yield process


async def _shows(page: Any, url: str, selector: str, *, present: bool = True) -> None:
    """Reload `url` until `selector` is (or is no longer) on it: pages are read per request."""
    deadline = time.monotonic() + SHOWN_S
    while True:
        await page.goto(url)
        if (await page.locator(selector).count() > 0) is present:
            return
        assert time.monotonic() < deadline, f"{selector} never {'appeared' if present else 'left'}"
        await asyncio.sleep(0.3)


async def _text_until(page: Any, selector: str, wanted: Callable[[str], bool]) -> str:
    """The text of `selector` once `wanted` holds for it (polled from Python: the console's
    Content-Security-Policy refuses the string evaluation `wait_for_function` needs)."""
    from playwright.async_api import Error as PlaywrightError

    deadline = time.monotonic() + SHOWN_S
    while True:
        if await page.locator(selector).count() == 0:
            # Not on the page as shown (a clean-clone CI run once waited 30 s for `#chunks`
            # on a run page that never had it): ask for the page again, within the bound. The
            # page may be reloading itself (it does once a run settles); a reload that meets
            # that navigation fails and is asked again on the next turn.
            text = ""
            with contextlib.suppress(PlaywrightError):
                await page.reload()
        else:
            text = await page.locator(selector).text_content() or ""
            if wanted(text):
                return text
        assert time.monotonic() < deadline, f"{selector} never matched: {text[-500:]!r}"
        await asyncio.sleep(0.1)


async def test_a_person_watches_a_run_stream_and_an_escalation_come_and_go(
    stack: Stack, console: ConsoleProcess, browser_page: Any, tmp_path: Path
) -> None:
    page = browser_page
    shots = tmp_path / "screenshots"
    shots.mkdir()

    # Logging in: the form, then the cookie carries the token.
    await page.goto(console.url + "/runs")
    assert await page.locator("input[name=token]").count() == 1
    await page.screenshot(path=str(shots / "login.png"))
    await page.fill("input[name=token]", ALL)
    await page.click("button:has-text('Log in')")
    await page.wait_for_url(console.url + "/runs")
    cookies = await page.context.cookies()
    [cookie] = [c for c in cookies if c["name"] == "aipd_console_token"]
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"

    # A run appears, streams, ends.
    action, handle = await stack.operator(f"{SLOW_REPLY} summarise the logs")
    await _shows(page, console.url + "/runs", f"text={action.id}")
    await page.click(f"text={action.id}")
    await page.wait_for_url(f"**/runs/{ENDPOINT}/{action.id}")
    streaming = await _text_until(page, "#chunks", lambda text: text.count("\n") >= 3)
    assert " done " not in streaming  # caught while it streams
    await page.screenshot(path=str(shots / "run-streaming.png"), full_page=True)
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    # The terminal chunk ends the stream; the page reloads once and shows the result.
    await _text_until(page, "#result", lambda text: "completed" in text)
    await _text_until(page, "#stream-state", lambda text: text == "ended")
    assert " done " in await _text_until(page, "#chunks", lambda text: " done " in text)
    await page.screenshot(path=str(shots / "run.png"))
    await page.screenshot(path=str(shots / "run-full.png"), full_page=True)
    await page.goto(console.url + "/runs")
    assert await page.locator(f"tr:has-text('{action.id}') .completed").count() == 1
    await page.screenshot(path=str(shots / "runs.png"), full_page=True)

    # An escalation appears, with its command, and disappears when resolved.
    _source, paused = await stack.operator(f"{NEEDS_APPROVAL} tidy the files")
    assert (await paused.result(timeout_s=60)).status is ResultStatus.REQUIRES_HUMAN
    [escalation] = await escalations(stack)
    card = f"[data-escalation={escalation.escalation_id}]"
    await _shows(page, console.url + "/escalations", card)
    command = await page.locator(f"{card} pre.command").text_content()
    assert command.startswith(
        f"aip-hermes-worker escalations resolve {escalation.escalation_id} --endpoint {ENDPOINT}"
    )
    await page.screenshot(path=str(shots / "escalations.png"), full_page=True)
    await answer_once(stack, escalation.escalation_id)
    await _shows(page, console.url + "/escalations", card, present=False)
    await page.screenshot(path=str(shots / "escalations-resolved.png"), full_page=True)

    await page.goto(console.url + "/dlq")
    await page.screenshot(path=str(shots / "dlq.png"), full_page=True)
    await page.goto(console.url + "/workers")
    assert await page.locator("td:has-text('w1')").count() == 1
    await page.screenshot(path=str(shots / "workers.png"), full_page=True)
    pages = ("login", "run-streaming", "run", "run-full", "runs", "escalations", "dlq", "workers")
    for name in pages:
        assert (shots / f"{name}.png").stat().st_size > 10_000, name

    keep = os.environ.get(SCREENSHOTS_ENV)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for name in ("runs", "run"):
            shutil.copy(shots / f"{name}.png", Path(keep) / f"{name}.png")
