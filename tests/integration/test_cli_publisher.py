"""The publisher's CLI against real processes (issue 28 item 2): `python -m worker` as a
subprocess, against the test's own NATS and Redis, a real worker process and the fake Hermes.

- `submit` signs with `AIPD_GATEWAY_SIGNING_KEY_FILE` without `--sign-key`, and refuses to
  publish unsigned (one line, exit 2, nothing on the stream);
- `submit --wait` exits by outcome: 0 completed, 6 when the Action was dead-lettered (named
  with its code), 5 on a timeout that says it was not dead-lettered;
- governed publishing is one input: `submit --write-action` → `approve` → `submit
  --action-file` runs the Action once;
- every expected failure is one line on stderr with its own exit status, no traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec
import pytest

from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from tests.nats_process import nats_process
from worker.commands.exit_codes import Exit
from worker.testing.identities import (
    APPROVER_UNTENANTED,
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
)
from worker.testing.scenario import NEEDS_APPROVAL
from worker.trust.signing import generate_keypair, write_seed_file

POST_RUNS = "POST /v1/runs"


async def cli(
    stack: Stack, *args: str, env: Mapping[str, str] | None = None, unset: tuple[str, ...] = ()
) -> tuple[int, str, str]:
    """`python -m worker ARGS` with the stack's settings and the gateway key set (off the
    event loop: the in-process fake Hermes keeps answering)."""
    full = {
        **os.environ,
        **stack.env,
        "AIPD_GATEWAY_SIGNING_KEY_FILE": str(stack.trust.seed_file),
        **(env or {}),
    }
    for name in unset:
        full.pop(name, None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker",
        *args,
        env=full,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def one_line(stderr: str) -> str:
    """The single line an expected failure prints (and never a traceback)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def identity_flags() -> tuple[str, ...]:
    return (
        "--principal", USER_UNTENANTED, "--principal-kind", PRINCIPAL_KIND,
        "--issuer", ISSUER, "--revision", str(REVISION),
    )  # fmt: skip


async def stored_actions(stack: Stack) -> int:
    info = await stack.nc.jetstream().stream_info(stack.subjects.stream_name("actions"))
    return int(info.state.last_seq)


async def test_submit_signs_with_the_gateway_key_setting_and_exits_0_on_completed(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    code, out, err = await cli(
        stack, "submit", "--endpoint", ENDPOINT, "--operation", "models", *identity_flags(),
        "--wait", "30",
    )  # fmt: skip
    assert code == Exit.OK, err
    action_id, *_, last = out.strip().splitlines()
    result = json.loads(last)  # AIP's ActionResult
    assert (result["action_id"], result["status"]) == (action_id, "completed")
    assert "Traceback" not in err


async def test_submit_ack_prints_aips_ack_body(stack: Stack) -> None:
    """`submit --ack` prints AIP's Ack (ack.schema.json: `action_id` and `status` required,
    status one of accepted/rejected/queued/streaming/cached, no other field here), checked
    against those rules, not against the project's codec."""
    code, out, err = await cli(
        stack, "submit", "--endpoint", ENDPOINT, "--operation", "models", *identity_flags(),
        "--ack",
    )  # fmt: skip
    assert code == Exit.OK, err
    [line] = out.strip().splitlines()
    ack = json.loads(line)
    assert set(ack) == {"action_id", "status"}
    assert re.fullmatch(r"act_[0-9a-f]{32}", ack["action_id"])
    assert ack["status"] == "queued"  # stored on the actions stream, not yet run
    assert await stored_actions(stack) == 1


async def test_submit_without_a_key_refuses_in_one_line_and_publishes_nothing(
    stack: Stack,
) -> None:
    code, out, err = await cli(
        stack, "submit", "--endpoint", ENDPOINT, "--operation", "models", *identity_flags(),
        unset=("AIPD_GATEWAY_SIGNING_KEY_FILE",),
    )  # fmt: skip
    assert code == Exit.CONFIGURATION
    line = one_line(err)
    assert "unsigned" in line
    assert "AIPD_GATEWAY_SIGNING_KEY_FILE" in line
    assert "--sign-key" in line
    assert out == ""
    assert await stored_actions(stack) == 0


async def test_a_dead_lettered_action_is_reported_refused_with_its_code(
    stack: Stack, tmp_path: Path
) -> None:
    await stack.spawn("w1")
    untrusted = tmp_path / "untrusted.seed"  # a valid seed the workers do not trust
    write_seed_file(untrusted, generate_keypair().seed)
    code, out, err = await cli(
        stack, "submit", "--endpoint", ENDPOINT, "--operation", "models", *identity_flags(),
        "--sign-key", str(untrusted), "--wait", "4",
    )  # fmt: skip
    assert code == Exit.REFUSED, err
    line = one_line(err)
    action_id = out.strip()
    assert f"{action_id} was dead-lettered" in line
    assert "connector_host.authentication" in line


async def test_a_wait_without_a_worker_times_out_and_says_it_was_not_dead_lettered(
    stack: Stack,
) -> None:
    code, out, err = await cli(
        stack, "submit", "--endpoint", ENDPOINT, "--operation", "models", *identity_flags(),
        "--wait", "1",
    )  # fmt: skip
    assert code == Exit.TIMEOUT, err
    line = one_line(err)
    assert f"no result for {out.strip()} within 1 s" in line
    assert "not dead-lettered" in line


async def test_governed_publishing_writes_approves_and_runs_one_action_once(
    stack: Stack, tmp_path: Path
) -> None:
    await stack.spawn("w1")
    action_file = tmp_path / "action.json"
    code, out, err = await cli(
        stack, "submit", "--endpoint", ENDPOINT, "--operation", "operator",
        "--input", json.dumps({"objective": "list the files"}), *identity_flags(),
        "--write-action", str(action_file),
    )  # fmt: skip
    assert code == Exit.OK, err
    action_id = out.strip()
    written = json.loads(action_file.read_text())  # an unsigned AIP Action Envelope
    assert written["message_type"] == "aip.core.v1.action"
    assert written["body"]["action"]["id"] == action_id
    assert "security" not in written
    assert await stored_actions(stack) == 0  # written, not published

    code, _, err = await cli(
        stack, "approve", action_id, "--action-file", str(action_file),
        "--as", APPROVER_UNTENANTED, "--reason", "checked by the test",
        "--key", str(stack.trust.approver_seed_files[APPROVER_UNTENANTED]),
    )  # fmt: skip
    assert code == Exit.OK, err

    code, out, err = await cli(
        stack, "submit", "--action-file", str(action_file), "--wait", "30",
        "--trusted-worker-keys", str(stack.trust.worker_keys_file),
    )  # fmt: skip
    assert code == Exit.OK, err
    assert out.splitlines()[0] == action_id
    result = json.loads(out.strip().splitlines()[-1])  # AIP's ActionResult
    assert result["status"] == "completed", result.get("error")
    assert stack.fake is not None
    assert stack.fake.stats().count(POST_RUNS) == 1

    # The same prepared Action again is the same publish: stored once, run once.
    code, _, err = await cli(stack, "submit", "--action-file", str(action_file))
    assert code == Exit.OK, err
    assert "duplicate window" in err
    assert len(await stack.results(action_id)) == 1
    assert stack.fake.stats().count(POST_RUNS) == 1

    # --action-file takes the Action as it is: a flag that would build another is refused.
    code, _, err = await cli(
        stack, "submit", "--action-file", str(action_file), "--operation", "models"
    )
    assert code == Exit.CONFIGURATION
    assert "--operation" in one_line(err)


async def test_an_unapproved_governed_action_is_not_reported_completed(stack: Stack) -> None:
    await stack.spawn("w1")
    code, out, err = await cli(
        stack, "submit", "--endpoint", ENDPOINT, "--operation", "operator",
        "--input", json.dumps({"objective": "list the files"}), *identity_flags(),
        "--wait", "30", "--trusted-worker-keys", str(stack.trust.worker_keys_file),
    )  # fmt: skip
    result = json.loads(out.strip().splitlines()[-1])  # AIP's ActionResult
    assert result["status"] == "failed"
    assert code == Exit.FAILED, err


async def test_a_stale_prepared_action_is_refused_before_it_is_sent(
    stack: Stack, tmp_path: Path
) -> None:
    action = stack.action("models")
    stale = msgspec.structs.replace(
        action, created_at_unix_ms=time.time_ns() // 1_000_000 - 3_600_000
    )
    action_file = tmp_path / "stale.json"
    action_file.write_bytes(stack.trust.seal_action(stale, signed=False))
    code, _, err = await cli(stack, "submit", "--action-file", str(action_file))
    assert code == Exit.REFUSED
    assert "AIPD_MAX_ENVELOPE_AGE_MS" in one_line(err)
    assert await stored_actions(stack) == 0


# --- expected failures: one line, their own exit status ------------------------------------


async def test_provision_against_a_nats_without_jetstream_says_so(stack: Stack) -> None:
    with nats_process() as url:  # no -js: JetStream off
        code, _, err = await cli(stack, "provision", "--nats-url", url)
    assert code == Exit.UNREACHABLE
    line = one_line(err)
    assert url in line
    assert "JetStream" in line
    assert "-js" in line


async def test_manifest_with_no_worker_names_the_endpoint(stack: Stack) -> None:
    code, _, err = await cli(stack, "manifest", "--endpoint", ENDPOINT)
    assert code == Exit.UNREACHABLE
    line = one_line(err)
    assert "no worker answered" in line
    assert repr(ENDPOINT) in line


async def test_submit_to_an_unprovisioned_endpoint_says_provision(stack: Stack) -> None:
    code, _, err = await cli(
        stack, "submit", "--endpoint", "h9", "--operation", "models", *identity_flags()
    )
    assert code == Exit.CONFIGURATION
    line = one_line(err)
    assert "'h9'" in line
    assert "aip-hermes-worker provision" in line


async def test_result_wait_on_the_wrong_endpoint_times_out_in_one_line(stack: Stack) -> None:
    await stack.spawn("w1")
    handle = await stack.publish(stack.action("models"))
    await handle.result(timeout_s=30)
    code, _, err = await cli(
        stack, "result", handle.action_id, "--endpoint", "h2", "--wait", "1",
        "--trusted-worker-keys", str(stack.trust.worker_keys_file),
    )  # fmt: skip
    assert code == Exit.TIMEOUT
    assert "not dead-lettered" in one_line(err)
    # `tail` is in the same row of docs/operations.md: the same timeout, the same line.
    code, _, err = await cli(
        stack, "tail", handle.action_id, "--endpoint", "h2", "--timeout", "1",
        "--trusted-worker-keys", str(stack.trust.worker_keys_file),
    )  # fmt: skip
    assert code == Exit.TIMEOUT, err
    line = one_line(err)
    assert f"no result for {handle.action_id} within 1 s" in line, line
    assert "not dead-lettered" in line, line
    code, out, err = await cli(
        stack, "result", handle.action_id, "--endpoint", ENDPOINT,
        "--trusted-worker-keys", str(stack.trust.worker_keys_file),
    )  # fmt: skip
    assert code == Exit.OK, err
    assert json.loads(out)["status"] == "completed"


async def test_a_result_that_requires_a_human_exits_7(stack: Stack) -> None:
    """`requires_human` is neither done nor failed: a script must stop for a person."""
    await stack.spawn("w1")
    source, handle = await stack.operator(f"{NEEDS_APPROVAL} tidy the files")
    paused = await handle.result(timeout_s=60)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    code, out, err = await cli(
        stack, "result", source.id, "--endpoint", ENDPOINT,
        "--trusted-worker-keys", str(stack.trust.worker_keys_file),
    )  # fmt: skip
    assert code == Exit.REQUIRES_HUMAN == 7, err
    assert json.loads(out)["status"] == "requires_human"


async def test_an_unreachable_nats_is_one_line_naming_the_url(
    stack: Stack, refused_port: int
) -> None:
    url = f"nats://127.0.0.1:{refused_port}"
    code, _, err = await cli(stack, "manifest", "--endpoint", ENDPOINT, "--nats-url", url)
    assert code == Exit.UNREACHABLE
    line = one_line(err)
    assert url in line
    assert "AIPD_NATS_URL" in line


async def test_a_url_that_hangs_up_is_not_a_nats_server_not_a_credential_problem(
    stack: Stack,
) -> None:
    """Something that accepts and hangs up at once (no NATS `INFO`): the line says the URL
    did not answer as a NATS server, and does not send the operator to the credentials."""

    async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"nats://127.0.0.1:{port}"
    async with server:
        code, _, err = await cli(stack, "manifest", "--endpoint", ENDPOINT, "--nats-url", url)
    assert code == Exit.UNREACHABLE
    line = one_line(err)
    assert url in line
    assert "did not answer as a NATS server" in line
    assert "AIPD_NATS_URL" in line
    assert "credential" not in line


async def test_a_nats_refusing_the_password_names_the_credential_settings(
    stack: Stack, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password")
    wrong.chmod(0o600)
    with nats_process("--user", "publisher", "--pass", "right") as url:
        code, _, err = await cli(
            stack, "manifest", "--endpoint", ENDPOINT, "--nats-url", url,
            env={"AIPD_NATS_USER": "publisher", "AIPD_NATS_PASSWORD_FILE": str(wrong)},
        )  # fmt: skip
    assert code == Exit.UNREACHABLE
    line = one_line(err)
    assert url in line
    assert "refused the connection" in line
    assert "AIPD_NATS_* credential settings" in line
    assert "not-the-password" not in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("submit", "--action-file", "/nonexistent/action.json"),
         "configuration error: /nonexistent/action.json: No such file or directory"),
        (("submit", "--endpoint", ENDPOINT, "--operation", "models", "--principal", "u",
          "--sign-key", "/nonexistent/gateway.seed"),
         "/nonexistent/gateway.seed: cannot be read (No such file or directory)"),
        (("keys", "public", "/nonexistent/approver.seed"),
         "seed file /nonexistent/approver.seed: cannot be read (No such file or directory)"),
        (("submit", "--endpoint", ENDPOINT, "--operation", "models", "--principal", "u",
          "--input", "@/nonexistent/input.json"),
         "configuration error: --input @/nonexistent/input.json: No such file or directory"),
        (("submit", "--endpoint", ENDPOINT, "--operation", "models", "--principal", "u",
          "--input", "[1, 2]"),
         "configuration error: --input [1, 2]: not a JSON object"),
        (("submit", "--endpoint", ENDPOINT, "--operation", "models", "--principal", "u",
          "--input", "{bad"),
         "configuration error: --input {bad: not valid JSON ("),
        (("submit", "--endpoint", ENDPOINT, "--operation", "models"),
         "configuration error: submit needs --principal (or --action-file with a prepared "
         "Action)"),
    ],
    ids=["action-file", "sign-key", "keys-public", "input-file", "input-shape", "input-json",
         "no-principal"],
)  # fmt: skip
async def test_a_bad_file_or_missing_flag_is_one_configuration_line(
    stack: Stack, args: tuple[str, ...], says: str
) -> None:
    """Each is a row of docs/operations.md "Publisher commands": the line it documents."""
    code, _, err = await cli(stack, *args)
    assert code == Exit.CONFIGURATION
    assert says in one_line(err), err


async def test_cancel_without_a_key_refuses_in_one_line(stack: Stack) -> None:
    action = stack.action("models")
    code, _, err = await cli(
        stack, "cancel", action.id, "--endpoint", ENDPOINT, "--requested-by", "ops",
        unset=("AIPD_GATEWAY_SIGNING_KEY_FILE",),
    )  # fmt: skip
    assert code == Exit.CONFIGURATION
    assert "unsigned" in one_line(err)


async def test_cancel_of_a_finished_action_prints_its_terminal_result(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("models")
    result = await (await stack.publish(action)).result(timeout_s=30)
    code, out, err = await cli(
        stack, "cancel", action.id, "--endpoint", ENDPOINT, "--requested-by", "user:demo",
        "--reason", "too late", "--wait", "0",
    )  # fmt: skip
    answer = json.loads(out)
    assert (answer["accepted"], answer["state"], answer["action_id"]) == (
        False,
        "settled",
        action.id,
    ), err
    # The answer is AIP's: the ActionResult body as the worker signed it.
    assert set(answer["answer"]) == {"action_result"}
    aip_result = answer["answer"]["action_result"]
    assert (aip_result["action_id"], aip_result["status"]) == (action.id, "completed")
    assert result.status.value == "completed"
    assert code == Exit.FAILED  # nothing was cancelled: the Action had ended


async def test_a_seed_file_others_may_read_is_named_with_its_chmod(
    stack: Stack, tmp_path: Path
) -> None:
    seed = tmp_path / "gateway.seed"
    write_seed_file(seed, generate_keypair().seed)
    seed.chmod(0o644)
    code, _, err = await cli(
        stack, "submit", "--endpoint", ENDPOINT, "--operation", "models", *identity_flags(),
        "--sign-key", str(seed),
    )  # fmt: skip
    assert code == Exit.CONFIGURATION
    line = one_line(err)
    assert f"{seed}: mode -rw-r--r-- lets group or others in" in line, line
    assert "chmod 600" in line
    assert await stored_actions(stack) == 0


async def test_a_timeout_under_a_user_that_cannot_read_the_dlq_says_it_is_unknown(
    stack: Stack, tmp_path: Path
) -> None:
    """The compose gateway role may not read the DLQ stream (docs/security.md "Roles"):
    the timeout line says the DLQ could not be read instead of "not dead-lettered"."""
    from tests.integration.stack import provision_streams

    password = tmp_path / "publisher.password"
    password.write_text("publisher-password-" + "5" * 16)
    password.chmod(0o600)
    config = tmp_path / "nats.conf"
    config.write_text(
        f"""
        jetstream {{ store_dir: "{tmp_path / "js"}" }}
        authorization {{
          users: [
            {{ user: admin, password: admin-password }}
            {{ user: publisher, password: "{password.read_text()}",
               permissions: {{ publish: {{
                 allow: ">", deny: "$JS.API.STREAM.MSG.GET.AIP_HERMES_DLQ" }} }} }}
          ]
        }}
        """
    )
    with nats_process("-c", str(config)) as url:
        host = url.removeprefix("nats://")
        await provision_streams(f"nats://admin:admin-password@{host}")
        code, out, err = await cli(
            stack, "submit", "--endpoint", ENDPOINT, "--operation", "models", *identity_flags(),
            "--wait", "1", "--trusted-worker-keys", str(stack.trust.worker_keys_file),
            env={"AIPD_NATS_URL": url, "AIPD_NATS_USER": "publisher",
                 "AIPD_NATS_PASSWORD_FILE": str(password)},
        )  # fmt: skip
    assert code == Exit.TIMEOUT, err
    line = one_line(err)
    assert f"no result for {out.strip()} within 1 s" in line
    assert "whether it was dead-lettered is unknown" in line


ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


async def test_tail_text_and_audit_show_iso_utc_times_and_json_keeps_them_raw(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    handle = await stack.publish(stack.action("models"))
    result = await handle.result(timeout_s=30)
    keys = ("--trusted-worker-keys", str(stack.trust.worker_keys_file))
    code, out, err = await cli(
        stack, "tail", handle.action_id, "--endpoint", ENDPOINT, "--format", "text", *keys
    )
    assert code == Exit.OK, err
    lines = out.strip().splitlines()
    # `models` does not stream (as upstream AIP): no chunk line, the result and its output.
    assert len(lines) == 2, out
    assert " result completed (settled by " in lines[0], out
    assert lines[-1].startswith("output: "), out
    assert ISO_UTC.match(lines[0])
    code, out, err = await cli(stack, "tail", handle.action_id, "--endpoint", ENDPOINT, *keys)
    assert code == Exit.OK, err
    [line] = out.splitlines()  # the AIP ActionResult alone
    assert json.loads(line)["status"] == "completed"
    assert set(json.loads(line)) <= {"action_id", "status", "output", "error"}

    code, out, err = await cli(stack, "audit", handle.action_id, "--endpoint", ENDPOINT, *keys)
    assert code == Exit.OK, err
    assert out.strip()
    assert all(ISO_UTC.match(line) for line in out.strip().splitlines()), out
    code, out, err = await cli(
        stack, "audit", handle.action_id, "--endpoint", ENDPOINT, "--json", *keys
    )
    assert code == Exit.OK, err
    assert all(isinstance(json.loads(line)["ts_unix_ms"], int) for line in out.splitlines())
    assert result.status is ResultStatus.COMPLETED


async def test_tail_and_result_print_aip_shapes_and_envelopes_with_envelope(
    stack: Stack,
) -> None:
    """`tail`/`result` JSON lines are AIP's StreamChunk and ActionResult (#25 item 7), read
    here with plain `json`; `--envelope` prints the Envelopes as published, whose bodies
    are those lines."""
    await stack.spawn("w1")
    turn = {"messages": [{"role": "user", "content": "stream a short answer"}]}
    handle = await stack.publish(stack.action("chat_stream", turn))
    await handle.result(timeout_s=30)
    keys = ("--trusted-worker-keys", str(stack.trust.worker_keys_file))
    tail = ("tail", handle.action_id, "--endpoint", ENDPOINT, *keys)
    code, out, err = await cli(stack, *tail)
    assert code == Exit.OK, err
    *chunks, result = [json.loads(line) for line in out.splitlines()]
    assert chunks, out
    assert [c["sequence"] for c in chunks] == list(range(len(chunks)))
    assert all(set(c) <= {"action_id", "sequence", "kind", "data", "part"} for c in chunks)
    assert chunks[-1]["kind"] == "done"
    assert set(result) <= {"action_id", "status", "output", "error"}
    assert (result["action_id"], result["status"]) == (handle.action_id, "completed")
    code, out, err = await cli(stack, *tail, "--envelope")
    assert code == Exit.OK, err
    envelopes = [json.loads(line) for line in out.splitlines()]
    assert [e["message_type"] for e in envelopes] == [
        *["aip.core.v1.stream_chunk"] * len(chunks),
        "aip.core.v1.action_result",
    ]
    assert [e["body"]["stream_chunk"] for e in envelopes[:-1]] == chunks
    assert envelopes[-1]["body"]["action_result"] == result
    assert "signature" in envelopes[-1]["security"]
    code, out, err = await cli(stack, "result", handle.action_id, "--endpoint", ENDPOINT, *keys)
    assert code == Exit.OK, err
    assert json.loads(out) == result
    code, out, err = await cli(
        stack, "result", handle.action_id, "--endpoint", ENDPOINT, "--envelope", *keys
    )
    assert code == Exit.OK, err
    assert json.loads(out) == envelopes[-1]
