"""Secrets at rest: DKIM keys, webhook secrets and the service's own secrets are sealed in the
database.

The raw rows are read with a direct driver connection, as someone holding a copy of the
database would read them. A database written in clear by older code is sealed on start and
keeps signing and presenting the same keys; a wrong or missing master key stops start-up.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import smtplib
import sqlite3
import ssl
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from trio.testing import MockClock

from postroom import config
from postroom.master_key import MasterKeyError
from postroom.service import serve
from postroom.startup import open_runtime
from relay.tls import self_signed
from storage import domains
from storage.database import open_database
from storage.sealing import DKIM_PRIVATE_KEY, SERVICE_SECRET, Sealer, SealingError
from tests.harness import service as harness
from tests.harness.cli import assert_stops_with_one_log_record
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.sending import SENDING_DOMAIN, dkim_verifies, message, ready_account, route_mail
from tests.harness.service import SMTP_HOST, Service, ServiceProcess
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

SEALED = "enc:v1:"


def raw(database_url: str, sql: str, *params: str) -> list[tuple[Any, ...]]:
    """Run one statement (`?` parameters) on a connection of our own; its rows, committed."""
    if database_url.startswith("sqlite:///"):
        with closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as conn:
            rows = conn.execute(sql, params).fetchall()
            conn.commit()
            return rows
    with psycopg.connect(database_url) as pg:
        cursor = pg.execute(sql.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []


def service_secrets(database_url: str) -> dict[str, str]:
    return dict(raw(database_url, "SELECT name, value FROM service_secrets"))


def stored_key(database_url: str, domain_id: str) -> str:
    [(value,)] = raw(database_url, "SELECT dkim_private_key FROM domains WHERE id = ?", domain_id)
    assert isinstance(value, str)
    return value


async def start_once(settings: config.Settings) -> None:
    """Start up and stop at once: migrate, take the master key, seal what is in clear."""
    async with open_database(settings.database_url) as db:
        await open_runtime(db, settings)


async def start_error(settings: config.Settings) -> MasterKeyError:
    """The error that stops start-up (there must be one)."""
    async with open_database(settings.database_url) as db:
        with pytest.raises(MasterKeyError) as raised:
            await open_runtime(db, settings)
    return raised.value


@asynccontextmanager
async def running(settings: config.Settings, clock: MockClock) -> AsyncIterator[Service]:
    """The service in this process until the block ends, so a test can restart it."""
    async with trio.open_nursery() as nursery:
        service = Service(await nursery.start(serve, settings), clock)
        try:
            yield service
        finally:
            await service.aclose()
            service.running.stop()


def relay_certificate(address: tuple[str, int]) -> bytes:
    """The certificate the SMTP relay presents after STARTTLS (DER)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the stored self-signed certificate is the point
    with smtplib.SMTP(*address, timeout=15) as smtp:
        smtp.starttls(context=context)
        assert isinstance(smtp.sock, ssl.SSLSocket)
        der = smtp.sock.getpeercert(binary_form=True)
    assert der is not None
    return der


async def test_a_new_domain_key_is_stored_sealed_never_as_pem_or_its_base64(
    service: Service, database_url: str
) -> None:
    account = await service.account()
    created = await account.client.post("/v1/domains/", json={"name": "sealed.example"})
    assert created.status_code == 201
    domain_id = created.json()["id"]

    domain = await service.running.runtime.db.read(domains.get, account.workspace_id, domain_id)
    assert domain is not None
    pem = domain.dkim_private_key
    assert pem.startswith("-----BEGIN PRIVATE KEY-----")
    der_base64 = "".join(line for line in pem.splitlines() if not line.startswith("-----"))
    stored = await trio.to_thread.run_sync(stored_key, database_url, domain_id)
    assert stored.startswith(SEALED)
    assert "PRIVATE KEY" not in stored
    assert not any(line in stored for line in pem.splitlines()[1:-1])  # no line of the body
    blob = base64.b64decode(stored.removeprefix(SEALED))
    assert pem.encode() not in blob
    assert base64.b64decode(der_base64) not in blob  # nor the key's DER bytes
    assert der_base64.encode() not in blob


async def test_the_signing_secret_is_stored_sealed(service: Service, database_url: str) -> None:
    stored = await trio.to_thread.run_sync(service_secrets, database_url)

    assert stored["secret_key"].startswith(SEALED)
    assert service.running.runtime.secret_key not in stored["secret_key"]
    assert all(value.startswith(SEALED) for value in stored.values())


async def test_clear_secrets_of_an_older_database_are_sealed_on_start_and_keep_working(
    database_url: str,
    tmp_path: Path,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    clock: MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = harness.test_settings(
        database_url,
        dns_server,
        delivery_port=str(smtp_sink.port),
        secret_key_file=str(tmp_path / "secret.key"),
    )
    async with running(settings, clock) as service:
        account = await ready_account(service, dns_server)  # its DKIM record is published
        [listed] = (await account.client.get("/v1/domains/")).json()
        domain = await service.running.runtime.db.read(
            domains.get, account.workspace_id, listed["id"]
        )
        assert domain is not None
    # What the code before sealing left behind: every secret in clear, and no key file.
    tls_pem = self_signed(SMTP_HOST, datetime.now(UTC))
    plant = [
        (
            "UPDATE domains SET dkim_private_key = ? WHERE id = ?",
            domain.dkim_private_key,
            domain.id,
        ),
        ("DELETE FROM service_secrets",),
        ("INSERT INTO service_secrets VALUES ('secret_key', ?)", "signing secret from before"),
        ("INSERT INTO service_secrets VALUES ('relay_tls_self_signed', ?)", tls_pem),
    ]
    for sql, *params in plant:
        await trio.to_thread.run_sync(raw, database_url, sql, *params)
    (tmp_path / "secret.key").unlink()

    with caplog.at_level(logging.INFO, logger="postroom"):
        async with running(settings, clock) as service:
            assert "sealed 3 secrets that were stored in clear" in caplog.messages
            assert (tmp_path / "secret.key").exists()
            stored = await trio.to_thread.run_sync(service_secrets, database_url)
            assert all(value.startswith(SEALED) for value in stored.values())
            sealed_key = await trio.to_thread.run_sync(stored_key, database_url, domain.id)
            assert sealed_key.startswith(SEALED)
            assert service.running.runtime.secret_key == "signing secret from before"

            route_mail(dns_server, "customer.example")
            client = service.client(headers={"Authorization": f"Bearer {account.api_key}"})
            sent = await client.post("/v1/emails/", json=message("ann@customer.example"))
            assert sent.status_code == 202
            [received] = await smtp_sink.wait_for_messages(1)
            assert await trio.to_thread.run_sync(dkim_verifies, received.data, dns_server)
            assert f"d={SENDING_DOMAIN}".encode() in received.data
            presented = await trio.to_thread.run_sync(relay_certificate, service.submission_address)
            planted = x509.load_pem_x509_certificate(tls_pem.encode())
            assert presented == planted.public_bytes(Encoding.DER)


async def test_the_key_file_is_created_on_first_start_readable_by_its_owner_only(
    database_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "keys" / "secret.key"
    settings = harness.test_settings(database_url, secret_key_file=str(path))

    await start_once(settings)

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(path.read_text().strip()) >= 32
    first_key = path.read_text()
    await start_once(settings)
    assert path.read_text() == first_key  # kept, not made again


def test_a_different_key_file_stops_serve_with_one_line_and_changes_nothing(
    service_process: ServiceProcess, database_url: str
) -> None:
    # The first start in this process, at the path the child finds by default.
    path = service_process.cwd / config.load(service_process.env).secret_key_file
    trio.run(start_once, harness.test_settings(database_url, secret_key_file=str(path)))
    before = service_secrets(database_url)
    path.write_text("a key from some other installation\n")

    result = service_process.cli("serve", check=False)

    assert result.returncode == 1
    assert_stops_with_one_log_record(result.stderr, str(path), "does not open the secrets sealed")
    assert service_secrets(database_url) == before  # nothing was sealed again under it


async def test_a_different_secret_key_setting_refuses_to_start(database_url: str) -> None:
    await start_once(harness.test_settings(database_url, secret_key="the key it was sealed with"))

    refused = await start_error(harness.test_settings(database_url, secret_key="another key"))

    assert refused.detail.startswith("POSTROOM_SECRET_KEY does not open the secrets sealed")


async def test_a_lost_key_file_is_not_replaced_while_sealed_secrets_exist(
    database_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "secret.key"
    settings = harness.test_settings(database_url, secret_key_file=str(path))
    await start_once(settings)
    path.unlink()

    refused = await start_error(settings)

    assert refused.detail.startswith(f"no key file at {path}, but this database holds secrets")
    assert not path.exists()


def test_a_sealed_value_opens_only_with_its_key_in_its_own_row() -> None:
    sealer = Sealer(b"the master key")
    sealed = sealer.seal(DKIM_PRIVATE_KEY, "domain-a", "-----BEGIN PRIVATE KEY-----")
    blob = bytearray(base64.b64decode(sealed.removeprefix(SEALED)))
    blob[20] ^= 1  # one bit of the ciphertext
    altered = SEALED + base64.b64encode(blob).decode()

    assert sealer.unseal(DKIM_PRIVATE_KEY, "domain-a", sealed) == "-----BEGIN PRIVATE KEY-----"
    assert sealed != sealer.seal(DKIM_PRIVATE_KEY, "domain-a", "-----BEGIN PRIVATE KEY-----")
    refusals = [
        (Sealer(b"another master key"), DKIM_PRIVATE_KEY, "domain-a", sealed),
        (sealer, DKIM_PRIVATE_KEY, "domain-b", sealed),  # moved to another row
        (sealer, SERVICE_SECRET, "domain-a", sealed),  # moved to another column
        (sealer, DKIM_PRIVATE_KEY, "domain-a", altered),
        (sealer, DKIM_PRIVATE_KEY, "domain-a", "-----BEGIN PRIVATE KEY-----"),  # in clear
    ]
    for opener, column, row, value in refusals:
        with pytest.raises(SealingError):
            opener.unseal(column, row, value)


async def test_webhook_signing_secrets_are_sealed_and_clear_ones_are_sealed_on_start(
    database_url: str,
    tmp_path: Path,
    https_receiver: HttpsReceiver,
    tls_ca: TlsAuthority,
    clock: MockClock,
) -> None:
    """Issue 28, item 6: signing secrets were the one secret kept in clear."""
    settings = harness.test_settings(
        database_url,
        extra_ca_file=str(tls_ca.ca_file),
        secret_key_file=str(tmp_path / "secret.key"),
    )
    body = {"url": https_receiver.url + "/hook", "events": ["email.delivered"]}
    async with running(settings, clock) as service:
        account = await service.account()
        hook = (await account.client.post("/v1/webhooks/", json=body)).json()
    [(stored,)] = await trio.to_thread.run_sync(
        raw, database_url, "SELECT secret FROM webhooks WHERE id = ?", hook["id"]
    )
    assert stored.startswith(SEALED) and hook["secret"] not in stored

    # What a release before this one left behind: the secret in clear.
    await trio.to_thread.run_sync(
        raw, database_url, "UPDATE webhooks SET secret = ? WHERE id = ?", "whsec_older", hook["id"]
    )
    async with running(settings, clock) as service:
        [(stored,)] = await trio.to_thread.run_sync(
            raw, database_url, "SELECT secret FROM webhooks WHERE id = ?", hook["id"]
        )
        assert stored.startswith(SEALED) and "whsec_older" not in stored
        client = service.client(headers={"Authorization": f"Bearer {account.api_key}"})
        [listed] = (await client.get("/v1/webhooks/")).json()
        assert listed["secret"] == "whsec_older"  # the receiver's copy still verifies
        await client.post(f"/v1/webhooks/{hook['id']}/test")
        [request] = await https_receiver.wait_for_requests(1)
        expected = hmac.new(b"whsec_older", request.body, hashlib.sha256).hexdigest()
        assert request.headers["x-webhook-signature"] == expected
