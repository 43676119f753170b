"""The `postroom` command in real child processes: accounts, migrate, settings, signals, restarts."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.harness.cli import PASSWORD, assert_stops_with_one_log_record, create_account
from tests.harness.service import POSTGRES_ENV, REPO, ServiceProcess, free_port


def key_client(url: str, api_key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30)


def assert_one_line_error(stderr: str, *mentions: str) -> None:
    """The operator sees a single line naming the problem, never a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("postroom: "), stderr
    for mention in mentions:
        assert mention in lines[0], stderr


@pytest.fixture
def sqlite_process(tmp_path: Path) -> Iterator[ServiceProcess]:
    """Like `service_process`, on SQLite only: for failures that happen before any database
    engine matters (settings, a busy port), so they need not run once per engine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_")}
    env.update(
        {
            "POSTROOM_DATABASE_URL": f"sqlite:///{tmp_path / 'postroom.db'}",
            "POSTROOM_API_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_SUBMISSION_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_INBOUND_LISTEN": f"127.0.0.1:{free_port()}",
            "PYTHONPATH": str(REPO),
        }
    )
    proc = ServiceProcess(env, tmp_path)
    try:
        yield proc
    finally:
        proc.stop()


def answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_accounts_create_prints_the_account_and_its_key_works(
    service_process: ServiceProcess,
) -> None:
    before = create_account(service_process, "before@example.org", "starter")
    service_process.start()
    during = create_account(service_process, "During@Example.org", "pro")

    assert before["email"] == "before@example.org"
    assert before["plan"] == "starter"
    assert during["email"] == "during@example.org"
    assert during["plan"] == "pro"
    for created in (before, during):
        assert str(uuid.UUID(created["user_id"])) == created["user_id"]
        assert str(uuid.UUID(created["workspace_id"])) == created["workspace_id"]
        assert created["api_key"].startswith("svc_k_")
        with key_client(service_process.url, created["api_key"]) as client:
            keys = client.get("/v1/api-keys/")
            assert keys.status_code == 200
            assert [k["name"] for k in keys.json()] == ["default"]
            assert client.post("/v1/api-keys/", json={"name": "second"}).status_code == 201


def test_creating_an_existing_email_fails_with_one_line(service_process: ServiceProcess) -> None:
    create_account(service_process, "taken@example.org")

    for spelling in ("taken@example.org", "TAKEN@example.org"):
        result = service_process.cli(
            "accounts", "create", "--email", spelling, "--password", PASSWORD, check=False
        )
        assert result.returncode == 1
        assert result.stdout == ""
        assert_one_line_error(result.stderr, "taken@example.org")


def test_set_plan_raises_the_key_cap_and_is_logged(service_process: ServiceProcess) -> None:
    created = create_account(service_process, "upgrade@example.org", "free")

    result = service_process.cli(
        "accounts", "set-plan", "--email", created["email"], "--plan", "starter"
    )

    changed = json.loads(result.stdout)
    assert changed["plan"] == "starter"
    assert changed["workspaces"] == [created["workspace_id"]]
    service_process.start()
    with key_client(service_process.url, created["api_key"]) as client:
        statuses = [
            client.post("/v1/api-keys/", json={"name": f"k{i}"}).status_code for i in range(5)
        ]
        assert statuses == [201, 201, 201, 201, 403]  # Starter allows 5, Free only 2
        billing = client.get("/v1/audit-log", params={"category": "billing"}).json()
    (entry,) = billing["items"]
    assert entry["action"] == "workspace.plan_changed"
    assert entry["category"] == "Billing"
    assert entry["actor"] == created["email"]
    assert entry["target_id"] == created["workspace_id"]
    assert entry["meta"] == {"from": "free", "to": "starter"}


def test_set_plan_of_an_unknown_email_fails_with_one_line(
    service_process: ServiceProcess,
) -> None:
    result = service_process.cli(
        "accounts", "set-plan", "--email", "ghost@example.org", "--plan", "pro", check=False
    )
    assert result.returncode == 1
    assert_one_line_error(result.stderr, "ghost@example.org")


@pytest.mark.empty_database
def test_migrate_is_idempotent(service_process: ServiceProcess) -> None:
    first = service_process.cli("migrate")
    second = service_process.cli("migrate")

    assert first.stdout.startswith("applied migrations: [")
    assert second.stdout.strip() == "schema is up to date"
    created = create_account(service_process, "migrated@example.org")
    service_process.start()
    with key_client(service_process.url, created["api_key"]) as client:
        assert client.get("/v1/api-keys/").status_code == 200
    assert service_process.cli("migrate").stdout.strip() == "schema is up to date"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("POSTROOM_API_LISTEN", "nonsense"),
        ("POSTROOM_DATABASE_URL", "mysql://x"),
        ("POSTROOM_DELIVERY_PORT", "99999"),
        ("POSTROOM_PUBLIC_URL", "ftp://postroom.example"),
        ("POSTROOM_DOMAIN_TRANSFERS", "perhaps"),
    ],
)
def test_bad_setting_stops_serve_with_one_line(
    sqlite_process: ServiceProcess, variable: str, value: str
) -> None:
    sqlite_process.env[variable] = value

    result = sqlite_process.cli("serve", check=False)

    assert result.returncode == 2
    assert_one_line_error(result.stderr, variable, repr(value))


def test_busy_api_address_stops_serve_with_one_line(sqlite_process: ServiceProcess) -> None:
    host, port = sqlite_process.env["POSTROOM_API_LISTEN"].split(":")
    with socket.socket() as squatter:
        squatter.bind((host, int(port)))
        squatter.listen()

        result = sqlite_process.cli("serve", check=False)

    assert result.returncode == 1
    assert_stops_with_one_log_record(result.stderr, "in use")


@pytest.mark.parametrize(
    ("public_url", "warned"),
    [("http://mail.example.com", True), ("https://mail.example.com", False)],
)
def test_serve_warns_once_when_unsubscribe_links_are_not_https(
    sqlite_process: ServiceProcess, public_url: str, warned: bool
) -> None:
    sqlite_process.env["POSTROOM_PUBLIC_URL"] = public_url
    host, port = sqlite_process.env["POSTROOM_API_LISTEN"].split(":")
    with socket.socket() as squatter:  # the start stops early, after the warning
        squatter.bind((host, int(port)))
        squatter.listen()

        result = sqlite_process.cli("serve", check=False)

    records = [json.loads(line) for line in result.stderr.strip().splitlines()]
    warnings = [
        r["message"] for r in records if r["level"] == "warning" and "https" in r["message"]
    ]
    assert len(warnings) == warned, result.stderr
    assert all(public_url in w and "one-click unsubscribe" in w for w in warnings)


def test_unusable_database_stops_serve_with_one_line(
    sqlite_process: ServiceProcess, tmp_path: Path
) -> None:
    sqlite_process.env["POSTROOM_DATABASE_URL"] = f"sqlite:///{tmp_path}"  # a directory

    result = sqlite_process.cli("serve", check=False)

    assert result.returncode == 1
    assert_stops_with_one_log_record(result.stderr, "POSTROOM_DATABASE_URL")


@pytest.mark.parametrize(
    ("config", "mention"),
    [
        ("api_listen = 'nonsense'", "POSTROOM_API_LISTEN"),
        ("no_such_setting = 1", "no_such_setting"),
        ("this is not toml", "--config"),
    ],
)
def test_bad_config_file_stops_serve_with_one_line(
    sqlite_process: ServiceProcess, tmp_path: Path, config: str, mention: str
) -> None:
    config_file = tmp_path / "postroom.toml"
    config_file.write_text(config + "\n")
    del sqlite_process.env["POSTROOM_API_LISTEN"]

    result = sqlite_process.cli("--config", str(config_file), "serve", check=False)

    assert result.returncode == 2
    assert_one_line_error(result.stderr, mention)


def test_config_file_is_honoured(service_process: ServiceProcess, tmp_path: Path) -> None:
    env = service_process.env
    api_listen = f"127.0.0.1:{free_port()}"
    config_file = tmp_path / "postroom.toml"
    config_file.write_text(
        f"database_url = '{env.pop('POSTROOM_DATABASE_URL')}'\n"
        f"api_listen = '{api_listen}'\n"
        f"submission_listen = '{env.pop('POSTROOM_SUBMISSION_LISTEN')}'\n"
        f"inbound_listen = '{env.pop('POSTROOM_INBOUND_LISTEN')}'\n"
        "allow_private_targets = true\n"
    )
    del env["POSTROOM_API_LISTEN"]

    options = ("--config", str(config_file))
    result = service_process.cli(
        *options, "accounts", "create", "--email", "file@example.org", "--password", PASSWORD
    )
    created = json.loads(result.stdout)
    url = f"http://{api_listen}"
    service_process.start(*options, url=url)

    with key_client(url, created["api_key"]) as client:
        assert client.get("/v1/api-keys/").status_code == 200


def test_environment_wins_over_the_config_file(
    service_process: ServiceProcess, tmp_path: Path
) -> None:
    file_listen = f"127.0.0.1:{free_port()}"
    config_file = tmp_path / "postroom.toml"
    # Both values in the file are overridden: the bad port would stop the service otherwise.
    config_file.write_text(f"api_listen = '{file_listen}'\ndelivery_port = 99999\n")
    service_process.env["POSTROOM_DELIVERY_PORT"] = "2525"

    service_process.start("--config", str(config_file))

    assert answers(service_process.url)
    assert not answers(f"http://{file_listen}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_serve_cleanly(
    service_process: ServiceProcess, signum: signal.Signals
) -> None:
    created = create_account(service_process, "signal@example.org")
    service_process.start()
    with key_client(service_process.url, created["api_key"]) as client:
        assert client.get("/v1/api-keys/").status_code == 200

    status = service_process.signal(signum)

    assert status == 0
    output = service_process.output()
    assert "Traceback" not in output, output
    assert f"{signum.name}, stopping" in output
    assert not answers(service_process.url)


def test_data_survives_a_kill_and_restart(service_process: ServiceProcess) -> None:
    created = create_account(service_process, "durable@example.org", "starter")
    service_process.start()
    with key_client(service_process.url, created["api_key"]) as client:
        made = client.post("/v1/api-keys/", json={"name": "made-before-kill"})
        assert made.status_code == 201
        suppressed = client.post("/v1/suppressions/", json={"email": "gone@example.net"})
        assert suppressed.status_code == 201

    assert service_process.signal(signal.SIGKILL) == -signal.SIGKILL
    service_process.stop()
    service_process.start()

    with key_client(service_process.url, made.json()["key"]) as client:
        keys = client.get("/v1/api-keys/")
        assert keys.status_code == 200
        assert {k["name"] for k in keys.json()} == {"default", "made-before-kill"}
        listed = client.get("/v1/suppressions/").json()
        assert [s["email"] for s in listed["items"]] == ["gone@example.net"]
        actions = [i["action"] for i in client.get("/v1/audit-log").json()["items"]]
        assert actions.count("api_key.created") == 2
        assert "suppression.created" in actions


def test_a_database_not_in_utf8_is_refused_with_one_line(tmp_path: Path) -> None:
    """A PostgreSQL database made without a UTF-8 locale (SQL_ASCII) would hand text back as
    bytes: it is refused at start with one line, not a traceback later."""
    admin_url = os.environ.get(POSTGRES_ENV)
    if not admin_url:
        pytest.skip(f"PostgreSQL not configured ({POSTGRES_ENV} unset)")
    name = "postroom_ascii_" + secrets.token_hex(4)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"
            " TEMPLATE template0"
        )
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_")}
        env["POSTROOM_DATABASE_URL"] = admin_url.rpartition("/")[0] + "/" + name
        env["PYTHONPATH"] = str(REPO)
        result = subprocess.run(
            [sys.executable, "-m", "postroom", "migrate"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1
        assert_one_line_error(result.stderr, "SQL_ASCII", "UTF8")
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
