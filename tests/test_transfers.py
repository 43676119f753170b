"""Domain transfers end to end: invitation mail with the accept token, acceptance mail with the
stop token, the 24-hour window and the 7-day expiry in virtual time, every refusal of the
spec, the admin's force transfer and the feature switch.

Tokens are read out of the mail that reaches the SMTP sink, as a user would read them.
"""

from __future__ import annotations

import re
import smtplib
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import httpx
import trio
from trio.testing import MockClock

from engine.domains.checker import GIVE_UP_AFTER, INTERVAL
from engine.platform.runtime import Runtime
from postroom.service import serve
from storage import broadcasts
from storage.codec import new_id
from tests.harness import service as harness
from tests.harness.api import assert_error
from tests.harness.broadcasts import left_sending
from tests.harness.dns_server import DnsServer
from tests.harness.mailbox import mail_to, text_of
from tests.harness.sending import SENDER, SENDING_DOMAIN, message, only_domain_id, route_mail
from tests.harness.service import Account, Service
from tests.harness.sessions import signed_in_client
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority
from tests.harness.transfers import DAY, initiate, setup, wait_for_transfer

ACCEPT_LINK = re.compile(r"/v1/domain-transfers/([A-Za-z0-9_-]{20,})/accept")
STOP_LINK = re.compile(r"/v1/domain-transfers/stop/([A-Za-z0-9_-]{20,})")


async def accept_token(sink: SmtpSink, target: Account) -> str:
    found = ACCEPT_LINK.search(text_of(await mail_to(sink, target.email, "please accept")))
    assert found is not None
    return found.group(1)


async def stop_token(sink: SmtpSink, source: Account) -> str:
    found = STOP_LINK.search(text_of(await mail_to(sink, source.email, "accepted")))
    assert found is not None
    return found.group(1)


async def actions(account: Account) -> list[str]:
    page = (await account.client.get("/v1/audit-log?range=7d&category=domain")).json()
    return [item["action"] for item in page["items"]]


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_accept_then_stop_within_the_window_reverses(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    source, target, domain = await setup(service, dns_server)
    started = await initiate(source, target, domain, note="Moving to the new company")
    assert started["status"] == "pending"
    assert started["domain_name"] == SENDING_DOMAIN
    assert started["source_label"] == source.email
    assert started["target_user_id"] is None and started["cooloff_until"] is None
    assert ts(started["expires_at"]) - ts(started["initiated_at"]) == timedelta(days=7)

    token = await accept_token(smtp_sink, target)
    accepted = await service.client().post(f"/v1/domain-transfers/{token}/accept")
    assert accepted.status_code == 200, accepted.text
    body = accepted.json()
    assert body["status"] == "accepted"
    assert body["target_user_id"] == target.user_id
    assert body["target_org_id"] == target.workspace_id
    assert ts(body["cooloff_until"]) - ts(body["accepted_at"]) == timedelta(hours=24)

    stop = await stop_token(smtp_sink, source)
    clock.jump(23 * 3600)
    stopped = await service.client().post(f"/v1/domain-transfers/stop/{stop}")
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["status"] == "reversed"

    # Used tokens are gone; the window passing changes nothing.
    assert_error(await service.client().post(f"/v1/domain-transfers/stop/{stop}"), 404, "not_found")
    again = await service.client().post(f"/v1/domain-transfers/{token}/accept")
    assert_error(again, 404, "not_found")
    clock.jump(2 * DAY)
    await service.settled()
    assert (await source.client.get(f"/v1/domains/{domain}")).status_code == 200
    assert (await target.client.get(f"/v1/domains/{domain}")).status_code == 404
    [outgoing] = (await source.client.get("/v1/domain-transfers/outgoing")).json()
    assert outgoing["status"] == "reversed"
    assert {"transfer.initiated", "transfer.accepted", "transfer.reversed"} <= set(
        await actions(source)
    )


def relay_login(service: Service, tls_ca: TlsAuthority, credential: dict[str, Any]) -> int:
    """Log in to the SMTP relay with a credential (blocking); the reply code."""
    host, port = service.submission_address
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.starttls(context=tls_ca.client_context())
        try:
            code, _ = smtp.login(credential["username"], credential["password"])
        except smtplib.SMTPAuthenticationError as exc:
            return exc.smtp_code
        return code


async def test_the_window_ending_moves_the_domain_and_revokes_smtp_credentials(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    clock: MockClock,
    tls_ca: TlsAuthority,
) -> None:
    source, target, domain = await setup(service, dns_server)
    credential = await source.client.post("/v1/smtp-credentials/", json={"domain_id": domain})
    assert credential.status_code == 201, credential.text
    assert await trio.to_thread.run_sync(relay_login, service, tls_ca, credential.json()) == 235
    started = await initiate(source, target, domain)
    token = await accept_token(smtp_sink, target)
    response = await target.client.post(f"/v1/domain-transfers/{token}/accept", json={})
    assert response.status_code == 200, response.text
    [incoming] = (await target.client.get("/v1/domain-transfers/incoming")).json()
    assert incoming["status"] == "accepted"

    stop = await stop_token(smtp_sink, source)
    clock.jump(DAY + 1)
    done = await wait_for_transfer(source, started["id"], "completed")
    assert done["completed_at"] is not None
    late = await service.client().post(f"/v1/domain-transfers/stop/{stop}")
    assert_error(late, 409, "not_stoppable")

    moved = await target.client.get(f"/v1/domains/{domain}")
    assert moved.status_code == 200
    assert moved.json()["status"] == "verified"  # the same key: no new record to publish
    assert (await source.client.get(f"/v1/domains/{domain}")).status_code == 404
    senders = (await target.client.get("/v1/senders/")).json()
    assert [s["email"] for s in senders] == [SENDER]
    assert (await source.client.get("/v1/senders/")).json() == []
    [old] = (await source.client.get("/v1/smtp-credentials/")).json()
    assert old["is_active"] is False
    refused = await trio.to_thread.run_sync(relay_login, service, tls_ca, credential.json())
    assert refused == 535
    assert (await target.client.get("/v1/domain-transfers/incoming")).json() == []
    assert "transfer.completed" in await actions(source)
    assert {"transfer.accepted", "transfer.completed"} <= set(await actions(target))
    # The new owner sends from it at once.
    route_mail(dns_server, "customer.example")
    sent = await target.client.post("/v1/emails/", json=message("ann@customer.example"))
    assert sent.status_code == 202, sent.text


async def test_rotate_dkim_on_accept_gives_the_domain_a_new_key_to_publish(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    source, target, domain = await setup(service, dns_server)
    # It signs with Ed25519 beside RSA: that key is replaced too.
    signing = await source.client.patch(f"/v1/domains/{domain}", json={"ed25519_signing": True})
    assert signing.status_code == 200, signing.text
    before = (await source.client.get(f"/v1/domains/{domain}")).json()
    started = await initiate(source, target, domain)
    response = await target.client.post(
        f"/v1/domain-transfers/by-id/{started['id']}/accept", json={"rotate_dkim": True}
    )
    assert response.status_code == 200, response.text
    clock.jump(DAY + 1)
    await wait_for_transfer(source, started["id"], "completed")
    after = (await target.client.get(f"/v1/domains/{domain}")).json()
    assert after["status"] == "pending"
    dkim_before, ed25519_before = [r for r in before["dns_records"] if r["purpose"] == "dkim"]
    dkim_after, ed25519_after = [r for r in after["dns_records"] if r["purpose"] == "dkim"]
    assert dkim_after["host"] != dkim_before["host"]
    assert dkim_after["value"] != dkim_before["value"]
    assert "k=ed25519" in ed25519_after["value"] and after["ed25519_signing"]
    assert ed25519_after["host"] != ed25519_before["host"]
    assert ed25519_after["value"] != ed25519_before["value"]
    assert "domain.dkim_rotated" in await actions(target)
    # The new owner publishes the new record and the background checker verifies it by
    # itself: its three days count from the re-keying, not from the domain's registration.
    clock.jump(GIVE_UP_AFTER.total_seconds() - DAY)
    dns_server.set(dkim_after["host"], "TXT", [dkim_after["value"]])
    clock.jump(INTERVAL.total_seconds() + 1)
    with trio.fail_after(30):  # a busy machine: the checker runs among every actor the jumps woke
        while True:
            if (await target.client.get(f"/v1/domains/{domain}")).json()["status"] == "verified":
                break
            await trio.sleep(0.1)


async def test_an_offer_expires_after_seven_days(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    source, target, domain = await setup(service, dns_server)
    started = await initiate(source, target, domain)
    token = await accept_token(smtp_sink, target)
    clock.jump(7 * DAY + 1)
    await wait_for_transfer(source, started["id"], "expired")
    assert_error(
        await service.client().post(f"/v1/domain-transfers/{token}/accept"), 410, "expired"
    )
    assert (await target.client.get("/v1/domain-transfers/incoming")).json() == []
    assert "transfer.expired" in await actions(source)
    # The domain is free to be offered again.
    await initiate(source, target, domain)


async def test_decline_notifies_the_sender(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    source, target, domain = await setup(service, dns_server)
    stranger = await service.account()
    started = await initiate(source, target, domain)
    path = f"/v1/domain-transfers/{started['id']}/decline"
    assert_error(await stranger.client.post(path), 403, "wrong_recipient")
    assert_error(await source.client.post(path), 403, "wrong_recipient")

    declined = await target.client.post(path)
    assert declined.status_code == 200, declined.text
    assert declined.json()["status"] == "declined"
    notice = text_of(await mail_to(smtp_sink, source.email, "declined"))
    assert target.email in notice
    assert_error(await target.client.post(path), 409, "not_pending")
    accept = await target.client.post(f"/v1/domain-transfers/by-id/{started['id']}/accept")
    assert_error(accept, 409, "not_pending")
    assert "transfer.declined" in await actions(source)


async def test_cancel_by_the_initiator_only_and_only_while_pending(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    source, target, domain = await setup(service, dns_server)
    started = await initiate(source, target, domain)
    path = f"/v1/domain-transfers/{started['id']}"
    assert_error(await target.client.delete(path), 404, "not_found")
    cancelled = await source.client.delete(path)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    token = await accept_token(smtp_sink, target)
    assert_error(
        await service.client().post(f"/v1/domain-transfers/{token}/accept"), 409, "not_pending"
    )

    second = await initiate(source, target, domain)
    accepted = await target.client.post(f"/v1/domain-transfers/by-id/{second['id']}/accept")
    assert accepted.status_code == 200, accepted.text
    refused = await source.client.delete(f"/v1/domain-transfers/{second['id']}")
    assert_error(refused, 409, "not_pending")


async def test_initiate_preconditions(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    source, target, domain = await setup(service, dns_server)
    path = f"/v1/domains/{domain}/transfer"
    post = source.client.post

    assert_error(
        await post(path, json={"target_email": "nobody@example.org"}), 404, "target_not_found"
    )
    assert_error(await post(path, json={"target_email": source.email}), 409, "self_transfer")
    too_long = {"target_email": target.email, "note": "x" * 1001}
    assert_error(await post(path, json=too_long), 422, "validation_error")
    other = await service.account()
    assert_error(
        await other.client.post(path, json={"target_email": target.email}), 404, "not_found"
    )

    send_at = (service.running.runtime.clock.now() + timedelta(hours=2)).isoformat()
    scheduled = await post("/v1/emails/", json=message("kim@later.example", send_at=send_at))
    assert scheduled.status_code == 202, scheduled.text
    assert_error(await post(path, json={"target_email": target.email}), 409, "scheduled_emails")
    await post(f"/v1/emails/{scheduled.json()['id']}/cancel")

    clock.jump(61)  # a fresh rate-limit window
    broadcast_id = await in_flight_broadcast(service.running.runtime, source, domain)
    body = assert_error(
        await post(path, json={"target_email": target.email}), 409, "broadcasts_in_flight"
    )
    assert [b["id"] for b in body["blockers"]] == [broadcast_id]


async def in_flight_broadcast(rt: Runtime, account: Account, domain: str) -> str:
    """A broadcast in `sending` on the domain (a bulk send is too quick to catch in flight)."""
    now = rt.clock.now()
    broadcast = replace(left_sending(account, rt.node, now), domain_id=domain, name="Spring sale")
    await rt.db.write(broadcasts.insert, broadcast)
    return broadcast.id


async def test_a_second_transfer_of_the_domain_is_refused_while_one_is_active(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    source, target, domain = await setup(service, dns_server)
    await initiate(source, target, domain)
    again = await source.client.post(
        f"/v1/domains/{domain}/transfer", json={"target_email": target.email}
    )
    assert_error(again, 409, "transfer_active")


async def test_five_initiations_per_minute(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    source, target, domain = await setup(service, dns_server)
    path = f"/v1/domains/{domain}/transfer"
    for _ in range(5):
        probe = await source.client.post(path, json={"target_email": "who@example.org"})
        assert_error(probe, 404, "target_not_found")
    limited = await source.client.post(path, json={"target_email": target.email})
    assert_error(limited, 429, "rate_limited")
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    clock.jump(61)
    await initiate(source, target, domain)


async def test_accept_refusals(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    source, target, domain = await setup(service, dns_server, target_plan="free")
    stranger = await service.account()
    started = await initiate(source, target, domain)
    token = await accept_token(smtp_sink, target)

    assert_error(
        await service.client().post("/v1/domain-transfers/nonsense/accept"), 404, "not_found"
    )
    by_id = f"/v1/domain-transfers/by-id/{started['id']}/accept"
    assert_error(await stranger.client.post(by_id), 403, "wrong_recipient")
    as_stranger = await stranger.client.post(f"/v1/domain-transfers/{token}/accept")
    assert_error(as_stranger, 403, "wrong_recipient")
    elsewhere = {"target_org_id": stranger.workspace_id}
    assert_error(await target.client.post(by_id, json=elsewhere), 403, "org_access_lost")

    # The free plan allows one domain: with one already, accepting is refused.
    await target.client.post("/v1/domains/", json={"name": "own.example"})
    eligibility = (await target.client.get("/v1/domain-transfers/accept-eligibility")).json()
    assert eligibility == {
        "can_accept": False,
        "code": "domain_limit",
        "message": eligibility["message"],
        "current_domains": 1,
        "domain_limit": 1,
    }
    assert_error(await target.client.post(by_id), 403, "domain_limit")
    await target.client.delete(f"/v1/domains/{await only_domain_id(target)}")
    eligibility = (await target.client.get("/v1/domain-transfers/accept-eligibility")).json()
    assert eligibility["can_accept"] is True and eligibility["code"] is None

    accepted = await target.client.post(f"/v1/domain-transfers/{token}/accept")
    assert accepted.status_code == 200, accepted.text


async def test_force_transfer_needs_an_admin_who_reauthenticated(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    source, target, domain = await setup(service, dns_server)
    pending = await initiate(source, target, domain)
    admin = await service.account(admin=True)
    path = f"/v1/admin/domain-transfers/{domain}"
    body = {"target_email": target.email}

    assert_error(await source.client.post(path, json=body), 403, "admin_required")
    assert_error(await admin.client.post(path, json=body), 403, "reauth_required")
    session = await signed_in_client(service, admin)
    assert_error(await session.post(path, json=body), 403, "reauth_required")
    reauth = await session.post("/v1/auth/reauth", json={"password": admin.password})
    assert reauth.status_code == 200, reauth.text

    forced = await session.post(path, json=body)
    assert forced.status_code == 200, forced.text
    assert forced.json()["status"] == "completed"
    assert forced.json()["target_org_id"] == target.workspace_id
    moved = (await target.client.get(f"/v1/domains/{domain}")).json()
    assert moved["status"] == "pending"  # rotate_dkim defaults to true
    assert (await source.client.get(f"/v1/domains/{domain}")).status_code == 404
    assert "transfer.forced" in await actions(source)
    assert "transfer.forced" in await actions(target)
    [superseded] = (await source.client.get("/v1/domain-transfers/outgoing")).json()
    assert superseded["id"] == pending["id"] and superseded["status"] == "cancelled"
    missing = await session.post(f"/v1/admin/domain-transfers/{new_id()}", json=body)
    assert_error(missing, 404, "not_found")


async def test_transfers_switched_off_are_not_found(
    nursery: trio.Nursery, database_url: str, dns_server: DnsServer
) -> None:
    settings = harness.test_settings(database_url, dns_server, domain_transfers="off")
    running = await nursery.start(serve, settings)
    try:
        async with httpx.AsyncClient(base_url=running.api_url) as client:
            for method, path in (
                ("POST", f"/v1/domains/{new_id()}/transfer"),
                ("GET", "/v1/domain-transfers/incoming"),
                ("GET", "/v1/domain-transfers/outgoing"),
                ("GET", "/v1/domain-transfers/accept-eligibility"),
                ("POST", "/v1/domain-transfers/sometoken/accept"),
                ("POST", f"/v1/domain-transfers/by-id/{new_id()}/accept"),
                ("POST", f"/v1/domain-transfers/{new_id()}/decline"),
                ("DELETE", f"/v1/domain-transfers/{new_id()}"),
                ("POST", "/v1/domain-transfers/stop/sometoken"),
                ("POST", f"/v1/admin/domain-transfers/{new_id()}"),
            ):
                response = await client.request(method, path)
                assert_error(response, 404, "not_found")
    finally:
        running.stop()


async def test_a_restarted_service_completes_a_transfer_accepted_before(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    clock: MockClock,
    nursery: trio.Nursery,
    database_url: str,
) -> None:
    source, target, domain = await setup(service, dns_server)
    started = await initiate(source, target, domain)
    token = await accept_token(smtp_sink, target)
    assert (await service.client().post(f"/v1/domain-transfers/{token}/accept")).status_code == 200
    service.running.stop()
    await trio.sleep(1)  # the first service finishes shutting down

    settings = harness.test_settings(database_url, dns_server, delivery_port=str(smtp_sink.port))
    restarted = harness.Service(await nursery.start(serve, settings), clock)
    try:
        again = restarted.client(headers={"Authorization": f"Bearer {source.api_key}"})
        clock.jump(DAY + 1)  # the new timer knows the deadline only from the database
        with trio.fail_after(15):
            while True:
                [t] = (await again.get("/v1/domain-transfers/outgoing")).json()
                if t["id"] == started["id"] and t["status"] == "completed":
                    break
                await trio.sleep(0.05)
    finally:
        await restarted.aclose()
        restarted.running.stop()
