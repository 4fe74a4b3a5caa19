"""The console's HTML: server-rendered, every value escaped here, no inline script.

Every text that came from the bus or Redis passes `esc` (html.escape, quotes too) before it
reaches a page; the only script is the run page's `/console.js` (worker/console/app.py),
which writes chunks with `textContent`, and the Content-Security-Policy the app sends lets
nothing else run. Times
are ISO 8601 UTC with milliseconds (`worker/commands/timestamps.py`), as `audit` prints them.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import msgspec

from schemas.escalation import Escalation, EscalationKind
from worker.commands.dlq_admin import Entry
from worker.commands.timestamps import iso_utc
from worker.console.reads import (
    RUNNING,
    WAITING,
    Escalations,
    Run,
    RunDetail,
    RunFilter,
    Waiting,
    Worker,
)
from worker.console.tokens import Viewer
from worker.operations.catalog import BY_NAME, STREAMING

#: The states the runs filter offers (a result's status, or no result yet).
STATES = (RUNNING, WAITING, "completed", "failed", "requires_human", "cancelled")

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330}
header{background:#1d2330;color:#fff;padding:.6em 1em;display:flex;gap:1.2em;align-items:center}
header a{color:#cfe0ff;text-decoration:none}header .who{margin-left:auto;opacity:.8}
main{padding:1em}table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #e3e6ec;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#f4f6f9}td:first-child{white-space:nowrap}
code,pre{font:12px/1.4 ui-monospace,monospace}
pre{background:#f4f6f9;padding:.6em;overflow:auto;white-space:pre-wrap}
.state{font-weight:600}.completed{color:#16794a}.failed{color:#b3261e}
.running{color:#1a56c4}.requires_human{color:#a05a00}.waiting{color:#6b7280}
form.filters{display:flex;gap:.6em;flex-wrap:wrap;margin-bottom:1em;align-items:end}
form.filters label{display:flex;flex-direction:column;font-size:12px}
.card{border:1px solid #e3e6ec;border-radius:6px;padding:.8em;margin-bottom:1em}
.muted{color:#6b7280}
"""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def when(unix_ms: int | None) -> str:
    return "" if unix_ms is None else iso_utc(unix_ms)


def age(unix_ms: int, now_ms: int) -> str:
    seconds = max(0, (now_ms - unix_ms) // 1000)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def page(title: str, viewer: Viewer | None, body: str) -> str:
    nav = ""
    if viewer is not None:
        nav = (
            '<a href="/runs">Runs</a><a href="/escalations">Escalations</a>'
            '<a href="/dlq">DLQ</a><a href="/workers">Workers</a>'
            f'<span class="who">{esc(viewer.principal_id)} · tenant {esc(viewer.scope)}</span>'
            '<form method="post" action="/logout"><button>Log out</button></form>'
        )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)} · aip-hermes-worker console</title>"
        f"<style>{_STYLE}</style></head><body><header><strong>aip console</strong>{nav}"
        f"</header><main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )


def login(error: str | None = None) -> str:
    note = f'<p class="failed">{esc(error)}</p>' if error else ""
    body = (
        f"{note}<p>Paste your console token. It is kept in an HttpOnly, SameSite=Strict "
        "cookie for this site only; <em>Log out</em> removes it.</p>"
        '<form method="post" action="/login"><input type="password" name="token" '
        'autocomplete="off" size="48" aria-label="token" autofocus> '
        "<button>Log in</button></form>"
    )
    return page("Log in", None, body)


def _table(heads: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in heads)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def run_href(endpoint_id: str, action_id: str) -> str:
    return f"/runs/{quote(endpoint_id)}/{quote(action_id)}"


def _state(state: str) -> str:
    return f'<span class="state {esc(state)}">{esc(state)}</span>'


def _filters(wanted: RunFilter, since: str, until: str) -> str:
    options = "".join(
        f"<option{' selected' if s == wanted.state else ''}>{esc(s)}</option>" for s in STATES
    )
    return (
        '<form class="filters" method="get" action="/runs">'
        f'<label>endpoint<input name="endpoint" value="{esc(wanted.endpoint_id)}"></label>'
        f'<label>state<select name="state"><option value="">any</option>{options}</select></label>'
        f'<label>principal<input name="principal" value="{esc(wanted.principal_id)}"></label>'
        '<label>since (UTC)<input name="since" placeholder="2026-12-05T10:00" '
        f'value="{esc(since)}"></label>'
        f'<label>until (UTC)<input name="until" value="{esc(until)}"></label>'
        "<button>Filter</button></form>"
    )


#: The heads of `_facts`' cells.
FACT_HEADS = ("state", "owner", "fence", "principal", "tenant", "received", "settled")


def _facts(r: Run) -> list[str]:
    """A run's state, owner and fence, principal, tenant and times: the cells the runs page
    and the run page share."""
    return [
        _state(r.state),
        esc(r.owner),
        esc(r.fence),
        esc(r.principal_id),
        esc(r.tenant_id),
        esc(when(r.received_at_ms)),
        esc(when(r.settled_at_ms)),
    ]


def runs(viewer: Viewer, found: list[Run], wanted: RunFilter, since: str, until: str) -> str:
    rows = [
        [
            f'<a href="{run_href(r.endpoint_id, r.action_id)}"><code>{esc(r.action_id)}</code></a>',
            esc(r.endpoint_id),
            esc(r.capability.rsplit(":", 1)[-1]),
            *_facts(r),
        ]
        for r in found
    ]
    heads = ("action", "endpoint", "operation", *FACT_HEADS)
    table = _table(heads, rows) if rows else '<p class="muted">No runs match.</p>'
    return page("Runs", viewer, _filters(wanted, since, until) + table)


def _json(value: Any) -> str:
    return esc(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())


def run(viewer: Viewer, detail: RunDetail) -> str:
    r = detail.run
    facts = _table(
        ("endpoint", "capability", *FACT_HEADS),
        [[esc(r.endpoint_id), f"<code>{esc(r.capability)}</code>", *_facts(r)]],
    )
    result = detail.result
    if result is None:
        result_html = '<p class="muted" id="result">No result yet.</p>'
    else:
        shown = {
            "status": result.status.value,
            "settled_by": result.settled_by,
            "fence": result.fence,
            "settled_at": when(result.settled_at_unix_ms),
            "error": result.error,
            "output": result.output,
        }
        result_html = f'<pre id="result">{_json(shown)}</pre>'
    receipts = _table(
        ("time (UTC)", "event", "worker", "fence", "details"),
        [
            [
                esc(when(e.receipt.ts_unix_ms)),
                f"<strong>{esc(e.receipt.event.value)}</strong>",
                esc(e.receipt.worker_id),
                esc(e.receipt.fence),
                "<code>"
                + esc(" ".join(f"{k}={v}" for k, v in e.receipt.details.items() if v is not None))
                + "</code>",
            ]
            for e in detail.chain.entries
        ],
    )
    aside = len(detail.chain.unverified) + len(detail.chain.malformed)
    aside_note = (
        f'<p class="muted">{aside} message(s) on the audit subject left out (not signed by '
        "a trusted worker, or not receipts).</p>"
        if aside
        else ""
    )
    src = f"{run_href(r.endpoint_id, r.action_id)}/chunks"
    # As in AIP, only a streaming capability's Action publishes chunks: any other one's
    # result is its whole answer, and its stream ends, empty, once that result is out.
    operation = r.capability.rsplit(":", 1)[-1]
    unstreamed = (
        '<p class="muted">This capability does not stream: its result is its whole answer, '
        "and it has no chunks.</p>"
        if operation in BY_NAME and operation not in STREAMING
        else ""
    )
    chunks = (
        f'{unstreamed}<p>Stream: <span id="stream-state">following…</span></p>'
        f'<pre id="chunks" data-src="{esc(src)}" '
        f'data-settled="{"yes" if result is not None else "no"}"></pre>'
        '<script src="/console.js"></script>'
    )
    body = (
        f"<p><code>{esc(r.action_id)}</code></p>{facts}<h2>Result</h2>{result_html}"
        f"<h2>Chunks</h2>{chunks}<h2>Receipts</h2>{receipts}{aside_note}"
    )
    return page("Run", viewer, body)


def resolve_command(escalation: Escalation) -> str:
    """The exact command that answers `escalation`, with what only its decider fills in as
    `<…>` placeholders (the console holds no approver key and decides nothing)."""
    head = [
        "aip-hermes-worker",
        "escalations",
        "resolve",
        escalation.escalation_id,
        "--endpoint",
        escalation.endpoint_id,
    ]
    text = shlex.join(head)
    if escalation.kind is EscalationKind.APPROVAL and escalation.approval is not None:
        choices = "|".join(c.value for c in escalation.approval.choices)
        return (
            f"{text} --as <APPROVER_ID> --key <APPROVER_SEED_FILE> --choice <{choices}> "
            '--sign-key <GATEWAY_SEED_FILE> --reason "<why>"'
        )
    return f'{text} --as <YOUR_ID> --key <YOUR_SEED_FILE> --reason "<why>"'


def _waiting(item: Waiting, now: int) -> str:
    e = item.view.escalation
    whom = (
        f"an approver of the approval authority for tenant {e.tenant_id or '(none)'}"
        if e.kind is EscalationKind.APPROVAL
        else "an operator (acknowledge after acting on the runbook)"
    )
    snapshot: Any = e.approval.prompt if e.approval is not None else None
    source = "the escalation"
    if item.pending is not None:
        source = str(item.pending.get("from", "the run's binding"))
        if item.pending.get("read") == "ok":
            snapshot = item.pending.get("prompt")
        else:
            snapshot = {"binding": item.pending.get("read"), "note": item.pending.get("note")}
    deadline = when(e.deadline_unix_ms) or "none"
    snap_html = (
        f'<p class="muted">Redacted snapshot, from {esc(source)}:</p><pre>{_json(snapshot)}</pre>'
        if snapshot is not None
        else ""
    )
    return (
        f'<div class="card escalation" data-escalation="{esc(e.escalation_id)}">'
        f"<strong>{esc(e.kind.value)}</strong> <code>{esc(e.escalation_id)}</code> for "
        f'<a href="{run_href(e.endpoint_id, e.action_id)}"><code>{esc(e.action_id)}</code></a>'
        f"<p>Waits for {esc(whom)}. Raised {esc(when(e.raised_at_unix_ms))} "
        f"({esc(age(e.raised_at_unix_ms, now))} ago) by {esc(e.raised_by)}; deadline "
        f"{esc(deadline)}. Principal {esc(e.principal_id)}, tenant {esc(e.tenant_id)}.</p>"
        f"<p>{esc(e.decision)} <span class=muted>({esc(e.runbook)})</span></p>{snap_html}"
        f"<p>Run:</p><pre class=command>{esc(resolve_command(e))}</pre></div>"
    )


def escalations(viewer: Viewer, found: Escalations, now: int) -> str:
    cards = "".join(_waiting(w, now) for w in found.waiting)
    body = cards or '<p class="muted">Nothing waits on anyone.</p>'
    if found.ignored:
        body += (
            f'<p class="muted">{found.ignored} message(s) on the escalation subjects ignored '
            "(not signed by a trusted worker, or unreadable).</p>"
        )
    return page("Approvals and escalations", viewer, body)


def _all_tenants_only(title: str, viewer: Viewer, why: str) -> str:
    """The page a tenant's token gets for what belongs to no one tenant."""
    body = (
        f'<p class="muted">{esc(why)}: only an all-tenants token (<code>*</code>) sees this '
        "page.</p>"
    )
    return page(title, viewer, body)


def _dlq_show(dlq_id: str, endpoint_id: str) -> str:
    return shlex.join(["aip-hermes-worker", "dlq", "show", dlq_id, "--endpoint", endpoint_id])


def dead_letters(viewer: Viewer, found: list[tuple[str, Entry]] | None) -> str:
    if found is None:
        why = "A DLQ entry is an envelope that was never authenticated, so it belongs to no tenant"
        return _all_tenants_only("Dead letters", viewer, why)
    rows = []
    for endpoint_id, entry in found:
        doc = entry.document(with_body=False)
        rows.append(
            [
                f"<code>{esc(doc['dlq_id'])}</code>",
                esc(endpoint_id),
                esc(when(int(entry.stored_at.timestamp() * 1000)) if entry.stored_at else ""),
                f"<code>{esc(doc['code'])}</code>",
                esc(doc["reason"]),
                esc(doc["worker"]),
                esc(doc["size"]),
                f"<code>{esc(_dlq_show(doc['dlq_id'], endpoint_id))}</code>",
            ]
        )
    heads = ("entry", "endpoint", "stored", "code", "reason", "worker", "bytes", "inspect")
    body = _table(heads, rows) if rows else '<p class="muted">The DLQ is empty.</p>'
    return page("Dead letters", viewer, body)


def workers(viewer: Viewer, found: list[Worker] | None) -> str:
    if found is None:
        return _all_tenants_only("Workers", viewer, "Workers serve every tenant")
    rows = []
    for w in found:
        s = w.status
        ready = "ready" if s.get("ready") else "not ready"
        why = "; ".join(str(r) for r in s.get("reasons") or []) or ""
        if s.get("publishing"):
            why = f"{why}; publishing: {s['publishing']}".strip("; ")
        rows.append(
            [
                f"<code>{esc(w.worker_id)}</code>",
                esc(", ".join(w.endpoints)),
                f"{esc(s.get('slots_in_use', '?'))}/{esc(s.get('slots', '?'))}",
                esc(s.get("leases", "?")),
                _state("completed" if s.get("ready") and s.get("serving") else "failed")
                .replace(">completed<", f">{ready}<")
                .replace(">failed<", f">{ready}<"),
                "draining"
                if s.get("draining")
                else ("serving" if s.get("serving") else "not serving"),
                esc(why),
                esc(w.version),
                esc(w.started),
            ]
        )
    heads = (
        "worker",
        "endpoints",
        "slots in use",
        "leases",
        "ready",
        "serving",
        "why not",
        "version",
        "started",
    )
    body = (
        _table(heads, rows)
        if rows
        else '<p class="muted">No worker answered <code>$SRV.STATS</code>.</p>'
    )
    return page("Workers", viewer, body)
