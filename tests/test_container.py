"""The container image and the compose file, run as a self-hoster runs them (podman).

The image is built from the repository's Containerfile on a local Debian base
(tests/harness/containers.py), run with host networking and its data volume, and sends mail to
the test sink; a restart keeps the email and its events, and a stop drains and exits 0. The
compose file is brought up with a PostgreSQL image built the same way. Skipped, saying why,
where podman is missing.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from tests.harness import containers
from tests.harness.containers import podman
from tests.harness.dns_server import DnsServer
from tests.harness.service import SMTP_HOST, free_port
from tests.harness.smtp_sink import SmtpSink

SENDING_DOMAIN = "shop.example.org"
PASSWORD = "container-password"
CREATE_ACCOUNT = (
    *("postroom", "accounts", "create", "--email", "ops@example.org"),
    *("--password", PASSWORD, "--plan", "starter"),
)


@pytest.fixture(scope="module")
def image() -> str:
    containers.require_podman()
    return containers.build(
        containers.POSTROOM_IMAGE, containers.REPO / "Containerfile", containers.REPO
    )


@pytest.fixture
def volume() -> Iterator[str]:
    name = "postroom-test-" + secrets.token_hex(4)
    podman("volume", "create", name)
    yield name
    podman("volume", "rm", "--force", name, check=False)


def _wait_healthy(url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    # One client for every try: `httpx.get` loads the CA store each time (26 ms of CPU).
    with httpx.Client(verify=False, timeout=1) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(url + "/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    raise AssertionError(f"{url}/healthz did not answer 200 within {timeout:.0f} s")


async def _send_and_follow(
    client: httpx.AsyncClient, dns_server: DnsServer, smtp_sink: SmtpSink
) -> str:
    """Verify a domain, send one email and wait until the sink has it; the email's id."""
    domain = (await client.post("/v1/domains/", json={"name": SENDING_DOMAIN})).json()
    dkim = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim["host"], "TXT", [dkim["value"]])
    verified = await client.post(f"/v1/domains/{domain['id']}/verify")
    assert verified.json()["status"] == "verified", verified.text
    await client.post("/v1/senders/", json={"email": f"hello@{SENDING_DOMAIN}"})
    dns_server.set("customer.example", "MX", ["10 mx.customer.example."])
    dns_server.set("mx.customer.example", "A", ["127.0.0.1"])
    sent = await client.post(
        "/v1/emails/",
        json={
            "from_": {"email": f"hello@{SENDING_DOMAIN}"},
            "to": [{"email": "ann@customer.example"}],
            "subject": "Your receipt",
            "text": "Thanks!",
        },
    )
    assert sent.status_code == 202, sent.text
    (message,) = await smtp_sink.wait_for_messages(1, timeout=60)
    assert b"Subject: Your receipt" in message.data
    assert b"DKIM-Signature:" in message.data
    email_id: str = sent.json()["id"]
    with trio.fail_after(30):
        status = ""
        while status != "delivered":
            await trio.sleep(0.2)
            status = (await client.get(f"/v1/emails/{email_id}")).json()["status"]
    return email_id


async def test_image_sends_keeps_its_data_across_a_restart_and_drains_on_stop(
    image: str, volume: str, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    api = f"127.0.0.1:{free_port()}"
    name = "postroom-test-" + secrets.token_hex(4)
    settings = {
        "POSTROOM_API_LISTEN": api,
        "POSTROOM_SUBMISSION_LISTEN": f"127.0.0.1:{free_port()}",
        "POSTROOM_INBOUND_LISTEN": f"127.0.0.1:{free_port()}",
        "POSTROOM_SMTP_HOST": SMTP_HOST,
        "POSTROOM_PUBLIC_URL": f"http://{api}",
        "POSTROOM_DNS_SERVERS": dns_server.nameserver,
        "POSTROOM_DELIVERY_PORT": str(smtp_sink.port),
        "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",  # the sink is on loopback
    }
    env_args = [arg for key, value in settings.items() for arg in ("--env", f"{key}={value}")]
    run = ("run", "--detach", "--name", name, "--network", "host")
    data = ("--volume", f"{volume}:/var/lib/postroom")
    await trio.to_thread.run_sync(lambda: podman(*run, *data, *env_args, image))
    url = f"http://{api}"
    try:
        await trio.to_thread.run_sync(_wait_healthy, url)
        # The image's HEALTHCHECK (`postroom health`) agrees.
        await trio.to_thread.run_sync(lambda: podman("healthcheck", "run", name))
        created = await trio.to_thread.run_sync(lambda: podman("exec", name, *CREATE_ACCOUNT))
        key = json.loads(created)["api_key"]
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as client:
            email_id = await _send_and_follow(client, dns_server, smtp_sink)

            # A restart (SIGTERM, then the same container again) keeps everything in the volume.
            await trio.to_thread.run_sync(lambda: podman("restart", "--time", "60", name))
            await trio.to_thread.run_sync(_wait_healthy, url)
            email = (await client.get(f"/v1/emails/{email_id}")).json()
            assert email["status"] == "delivered"
            kinds = {event["event_type"] for event in email["events"]}
            assert {"queued", "sent", "delivered"} <= kinds

        # A stop is SIGTERM to the service itself: it drains and exits 0.
        await trio.to_thread.run_sync(lambda: podman("stop", "--time", "60", name))
        state = json.loads(await trio.to_thread.run_sync(lambda: podman("inspect", name)))[0]
        logs = await trio.to_thread.run_sync(containers.logs, name)
        assert state["State"]["ExitCode"] == 0, logs
        assert "stopped cleanly" in logs
        assert state["Config"]["User"] == "postroom"
    finally:
        await trio.to_thread.run_sync(lambda: podman("rm", "--force", name, check=False))


def test_lock_pins_every_dependency_of_the_project() -> None:
    """The image installs from deploy/requirements.lock: every pinned dependency of
    pyproject.toml must be in it at the same version (regenerate with scripts/lock)."""
    import tomllib

    project = tomllib.loads((containers.REPO / "pyproject.toml").read_text())
    lock = (containers.REPO / "deploy" / "requirements.lock").read_text().lower()
    for requirement in project["project"]["dependencies"]:
        name, _, version = requirement.partition("==")
        name = name.split("[")[0].strip().lower().replace("_", "-")
        assert f"\n{name}=={version.strip()} " in lock, f"{requirement} is not in the lock"


@pytest.fixture(scope="module")
def postgres_image() -> str:
    containers.require_podman()
    folder = containers.REPO / "tests" / "containers"
    return containers.build(containers.POSTGRES_IMAGE, folder / "postgres.Containerfile", folder)


async def test_compose_file_runs_two_postroom_nodes_on_postgresql(
    image: str, postgres_image: str, dns_server: DnsServer, smtp_sink: SmtpSink, tmp_path: Path
) -> None:
    if not containers.COMPOSE.exists():
        pytest.skip("podman-compose is not installed: the compose file is not tried")
    api_port, second_api_port = free_port(), free_port()
    project = "postroom-test-" + secrets.token_hex(4)
    env = {
        "POSTROOM_IMAGE": image,
        "POSTROOM_POSTGRES_IMAGE": postgres_image,
        "POSTGRES_PASSWORD": secrets.token_hex(12),
        "POSTROOM_SECRET_KEY": secrets.token_hex(32),
        "POSTROOM_DB_HOST": "127.0.0.1",
        "POSTROOM_DB_PORT": str(free_port()),
        "POSTROOM_SMTP_HOST": SMTP_HOST,
        "POSTROOM_PUBLIC_URL": f"http://127.0.0.1:{api_port}",
        "TEST_API_PORT": str(api_port),
        "TEST_API_PORT_2": str(second_api_port),
        "TEST_SUBMISSION_PORT_2": str(free_port()),
        "TEST_INBOUND_PORT_2": str(free_port()),
        "TEST_SUBMISSION_PORT": str(free_port()),
        "TEST_INBOUND_PORT": str(free_port()),
        "TEST_DNS_SERVER": dns_server.nameserver,
        "TEST_DELIVERY_PORT": str(smtp_sink.port),
    }
    files = [
        "--project-name", project,
        "--file", str(containers.REPO / "compose.yaml"),
        "--file", str(containers.REPO / "tests" / "containers" / "compose.host.yaml"),
    ]  # fmt: skip
    run = partial(containers.compose, cwd=tmp_path, env=env)
    # The cluster profile: a second node on the same database.
    up = ("--profile", "cluster", "up", "--detach", "--no-build")
    await trio.to_thread.run_sync(lambda: run(*files, *up))
    url = f"http://127.0.0.1:{api_port}"
    try:
        await trio.to_thread.run_sync(_wait_healthy, url)
        await trio.to_thread.run_sync(_wait_healthy, f"http://127.0.0.1:{second_api_port}")
        node = f"{project}_postroom_1"
        created = await trio.to_thread.run_sync(lambda: podman("exec", node, *CREATE_ACCOUNT))
        key = json.loads(created)["api_key"]
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            email_id = await _send_and_follow(client, dns_server, smtp_sink)
        # The second node serves the same data: one database behind both.
        second = f"http://127.0.0.1:{second_api_port}"
        async with httpx.AsyncClient(base_url=second, headers=headers, timeout=30) as client:
            email = (await client.get(f"/v1/emails/{email_id}")).json()
            assert email["status"] == "delivered"
    finally:
        down = ("--profile", "cluster", "down", "--volumes")
        await trio.to_thread.run_sync(lambda: run(*files, *down))
