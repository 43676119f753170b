"""`postroom mcp --stdio`: a local client's MCP session, bridged to the running service.

The SDK's client starts the real command as a subprocess and speaks MCP on its stdin and
stdout; the bridge holds only the API key and acts through the service's `/mcp`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.harness.dns_server import DnsServer
from tests.harness.mcp import activity, call, draft, set_policy
from tests.harness.sending import ready_account, route_mail, wait_for_status
from tests.harness.service import REPO, Service, free_port
from tests.harness.smtp_sink import SmtpSink


def bridge(url: str, api_key: str, cwd: Path) -> StdioServerParameters:
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "POSTROOM_API_KEY": api_key,
        "POSTROOM_LOG_FORMAT": "text",
    }
    command = ["-m", "postroom", "mcp", "--stdio", "--url", url]
    return StdioServerParameters(command=sys.executable, args=command, env=env, cwd=cwd)


async def test_stdio_client_searches_previews_confirms_and_is_attributed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tmp_path: Path
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    await set_policy(service, account, policy="send")
    info = types.Implementation(name="desktop-agent", version="2.0")
    url = f"{service.url}/mcp"
    async with Client(bridge(url, account.api_key, tmp_path), client_info=info) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"search_emails", "send_email", "confirm"} <= names
        assert (await call(client, "search_emails", q="to:customer.example"))["emails"] == []
        preview = await call(client, "send_email", **draft(["ann@customer.example"]))
        assert (preview["recipient_count"], preview["untrusted"]["first_recipient"]) == (
            1,
            "ann@customer.example",
        )
        sent = await call(client, "confirm", confirmation_token=preview["confirmation_token"])
        await call(client, "add_suppression", email="spam-trap@example.com")
        found: dict[str, Any] = await call(client, "search_emails", q="to:customer.example")
        assert [e["id"] for e in found["emails"]] == [sent["id"]]

    [received] = await smtp_sink.wait_for_messages(1)
    assert received.rcpt_to == ("ann@customer.example",)
    assert (await wait_for_status(account, sent["id"]))["source"] == "mcp"
    [entry] = [e for e in await activity(account) if e["action"] == "suppression.created"]
    assert (entry["meta"]["via"], entry["meta"]["client"]) == ("mcp", "desktop-agent")


def test_stdio_without_an_api_key_says_what_to_set(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "postroom", "mcp", "--stdio"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert "POSTROOM_API_KEY" in done.stderr
    assert done.stdout == ""


async def test_stdio_bridge_without_a_service_says_so_and_stays_up(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    async with Client(bridge(url, "svc_k_whatever", tmp_path)) as client:
        for _ in range(2):  # the failure is the call's answer; the bridge still serves
            with pytest.raises(MCPError) as raised:
                await client.list_tools()
            assert raised.value.data["code"] == "unreachable"
            assert url in raised.value.data["detail"]


# A local client's first exchange, written by hand: the bridge answers each line on stdout.
_HANDSHAKE_AND_TWO_CALLS: list[dict[str, Any]] = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "quiet-agent", "version": "1"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
]


def _talk(url: str, api_key: str, cwd: Path) -> tuple[list[dict[str, Any]], str]:
    """Run the bridge through `_HANDSHAKE_AND_TWO_CALLS`: its answers and its stderr."""
    params = bridge(url, api_key, cwd)
    bridged = subprocess.Popen(
        [params.command, *params.args],
        env=params.env,
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert bridged.stdin is not None and bridged.stdout is not None
    answers = []
    for message in _HANDSHAKE_AND_TWO_CALLS:
        bridged.stdin.write(json.dumps(message) + "\n")
        bridged.stdin.flush()
        if "id" in message:
            answers.append(json.loads(bridged.stdout.readline()))
    _, stderr = bridged.communicate(timeout=30)  # closes stdin: the bridge ends
    return answers, stderr


async def test_stdio_bridge_does_not_log_each_request(
    service: Service, dns_server: DnsServer, tmp_path: Path
) -> None:
    account = await ready_account(service, dns_server)
    url = f"{service.url}/mcp"
    answers, stderr = await trio.to_thread.run_sync(_talk, url, account.api_key, tmp_path)
    assert [a["id"] for a in answers] == [1, 2, 3]
    assert all("result" in a for a in answers), answers
    # Its stderr is the local client's log pane: three calls to /mcp leave no line there.
    assert "HTTP Request" not in stderr
    assert url not in stderr
