"""`python -m worker.testing.fake_hermes --port N --api-key-file FILE [--host H]`.

Prints exactly one line, `listening on http://HOST:PORT`, once it accepts connections (port
0 picks a free one), then serves until SIGTERM or SIGINT. With `--mcp-url` and
`--mcp-token-file` its agent calls `aip_call` on that MCP server for delegated runs, as a
real Hermes configured with the AIP MCP server does. `--upstream` turns on every behaviour
upstream Hermes added after 0.19 (`FakeConfig` flags, `config.upstream`).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from worker.testing.fake_hermes.config import FakeConfig, upstream
from worker.testing.fake_hermes.server import FakeHermes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker.testing.fake_hermes")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--api-key-file", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--keepalive-s", type=float, default=30.0)
    parser.add_argument("--approval-timeout-s", type=float, default=120.0)
    parser.add_argument("--build-delay-s", type=float, default=0.05)
    parser.add_argument("--max-concurrent-runs", type=int, default=10)
    parser.add_argument("--missing-stream-delay-s", type=float, default=1.0)
    parser.add_argument("--mcp-url", help="AIP MCP server whose aip_call delegated runs use")
    parser.add_argument("--mcp-token-file", type=Path, help="bearer token for --mcp-url")
    parser.add_argument(
        "--upstream", action="store_true", help="model Hermes after 0.19 (config.upstream)"
    )
    return parser


async def _serve(args: argparse.Namespace) -> None:
    api_key = args.api_key_file.read_text().strip()
    config = FakeConfig(
        api_key=api_key,
        keepalive_s=args.keepalive_s,
        approval_timeout_s=args.approval_timeout_s,
        build_delay_s=args.build_delay_s,
        max_concurrent_runs=args.max_concurrent_runs,
        missing_stream_delay_s=args.missing_stream_delay_s,
    )
    if args.upstream:
        config = upstream(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with FakeHermes(host=args.host, port=args.port, config=config) as fake:
        if args.mcp_url:
            from worker.testing.fake_hermes.mcp_client import remote_aip_call

            if args.mcp_token_file is None:
                raise SystemExit("--mcp-url needs --mcp-token-file")
            token = args.mcp_token_file.read_text().strip()
            fake.mcp_tools["aip_call"] = remote_aip_call(args.mcp_url, token)
        sys.stdout.write(f"listening on {fake.url}\n")
        sys.stdout.flush()
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    asyncio.run(_serve(_parser().parse_args(argv)))


if __name__ == "__main__":
    main()
