"""The `postroom` command line as tests drive it: `accounts create` checked to print one JSON
object, and a `serve` that stops with one error record in its log format."""

from __future__ import annotations

import json

from tests.harness.service import ServiceProcess

PASSWORD = "correct horse battery staple"
CREATED_FIELDS = {"user_id", "workspace_id", "email", "plan", "api_key"}


def create_account(proc: ServiceProcess, email: str, plan: str = "free") -> dict[str, str]:
    """`postroom accounts create`, checked to print exactly one JSON object."""
    result = proc.cli(
        "accounts", "create", "--email", email, "--password", PASSWORD, "--plan", plan
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    created: dict[str, str] = json.loads(lines[0])
    assert set(created) == CREATED_FIELDS
    return created


def assert_stops_with_one_log_record(stderr: str, *mentions: str) -> None:
    """`serve` stops with an error record in its log format (JSON), like every other line."""
    assert "Traceback" not in stderr, stderr
    records = [json.loads(line) for line in stderr.strip().splitlines()]
    last = records[-1]
    assert last["level"] == "error" and last["logger"] == "postroom", stderr
    for mention in mentions:
        assert mention in last["message"], stderr
