"""What the sandbox makes stays in the sandbox: a domain it marked verified without DNS is
verified only inside the sandboxed workspace that marked it (a transfer by any path, leaving
the sandbox or a DNS proof elsewhere sends it back to pending), and a test key cannot make
anything that would outlive the sandbox (403 `test_key_forbidden`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
from trio.testing import MockClock

from api import test_keys
from api.app import create_app
from engine.domains import registry
from engine.domains.checker import GIVE_UP_AFTER, INTERVAL, SYSTEM_ACTOR
from storage import domains, migrations
from storage.tx import Tx
from tests.harness.dns_server import DnsServer
from tests.harness.sandbox import sandbox_account
from tests.harness.sending import SENDING_DOMAIN, message, ready_account, route_mail
from tests.harness.service import Account, Service
from tests.harness.sessions import signed_in_client
from tests.harness.smtp_sink import SmtpSink
from tests.harness.transfers import DAY, initiate, wait_for_transfer

VICTIM = "bank-victim.example"
SPOOFED = f"security@{VICTIM}"


async def marked_victim(service: Service) -> tuple[Account, str]:
    """A sandboxed workspace that marked the victim's name verified (no DNS record exists)
    and added a sender on it: the id of that domain."""
    account = await sandbox_account(service)
    domain = (await account.client.post("/v1/domains/", json={"name": VICTIM})).json()
    marked = await account.client.post(f"/v1/sandbox/domains/{domain['id']}/verify")
    assert marked.status_code == 200 and marked.json()["status"] == "verified"
    added = await account.client.post("/v1/senders/", json={"email": SPOOFED})
    assert added.status_code == 201, added.text
    return account, str(domain["id"])


async def domain_log(account: Account) -> list[dict[str, Any]]:
    page = (await account.client.get("/v1/audit-log?range=30d&category=domain")).json()
    items: list[dict[str, Any]] = page["items"]
    return items


async def assert_cannot_send_as_the_victim(
    receiver: Account, domain_id: str, dns_server: DnsServer, sink: SmtpSink
) -> None:
    """The receiving workspace holds the name pending: it must prove it in DNS to send."""
    moved = (await receiver.client.get(f"/v1/domains/{domain_id}")).json()
    assert moved["status"] == "pending" and moved["verified_at"] is None
    route_mail(dns_server, "customer.example")
    sent = await receiver.client.post(
        "/v1/emails/", json={**message("ann@customer.example"), "from_": {"email": SPOOFED}}
    )
    assert sent.status_code == 422, sent.text
    assert not [m for m in sink.messages if m.mail_from.endswith(VICTIM)]
    [dropped] = [e for e in await domain_log(receiver) if e["action"] == "domain.pending"]
    assert dropped["target_id"] == domain_id and "sandbox" in dropped["meta"]["reason"]


async def test_a_transfer_completed_by_its_window_arrives_pending(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    source, domain_id = await marked_victim(service)
    target = await service.account("starter")
    route_mail(dns_server, "example.org")  # the transfer's own mail reaches the target
    started = await initiate(source, target, domain_id)
    by_id = f"/v1/domain-transfers/by-id/{started['id']}/accept"
    accepted = await target.client.post(by_id, json={"rotate_dkim": False})
    assert accepted.status_code == 200, accepted.text
    clock.jump(DAY + 1)
    await wait_for_transfer(source, started["id"], "completed")
    await assert_cannot_send_as_the_victim(target, domain_id, dns_server, smtp_sink)


async def test_an_admin_force_transfer_arrives_pending(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    source, domain_id = await marked_victim(service)  # its owner is a platform admin
    target = await service.account("starter")
    session = await signed_in_client(service, source)
    reauth = await session.post("/v1/auth/reauth", json={"password": source.password})
    assert reauth.status_code == 200, reauth.text
    forced = await session.post(
        f"/v1/admin/domain-transfers/{domain_id}",
        json={"target_email": target.email, "rotate_dkim": False},
    )
    assert forced.status_code == 200 and forced.json()["status"] == "completed", forced.text
    await assert_cannot_send_as_the_victim(target, domain_id, dns_server, smtp_sink)


async def test_the_owners_dns_proof_wins_over_a_sandbox_mark(
    service: Service, dns_server: DnsServer
) -> None:
    squatter = await sandbox_account(service)
    domain = (await squatter.client.post("/v1/domains/", json={"name": SENDING_DOMAIN})).json()
    marked = await squatter.client.post(f"/v1/sandbox/domains/{domain['id']}/verify")
    assert marked.json()["status"] == "verified"

    await ready_account(service, dns_server)  # the owner publishes the record: verified
    held = (await squatter.client.get(f"/v1/domains/{domain['id']}")).json()
    assert held["status"] == "pending"
    assert (
        SENDING_DOMAIN
        not in (await squatter.client.get("/v1/sandbox")).json()["sandbox_verified_domains"]
    )
    [told] = [e for e in await domain_log(squatter) if e["action"] == "domain.pending"]
    assert told["actor"] == "postroom" and "DNS" in told["meta"]["reason"]
    again = await squatter.client.post(f"/v1/sandbox/domains/{domain['id']}/verify")
    assert again.status_code == 409 and again.json()["code"] == "domain_taken"


async def test_verify_in_the_sandbox_marks_and_dns_takes_over_after_leaving(
    service: Service, dns_server: DnsServer, clock: MockClock
) -> None:
    account = await sandbox_account(service)
    created = (await account.client.post("/v1/domains/", json={"name": VICTIM})).json()
    dkim = next(r for r in created["dns_records"] if r["purpose"] == "dkim")
    # Another key is published: a DNS check would call the domain failed.
    dns_server.set(dkim["host"], "TXT", ["v=DKIM1; k=rsa; p=QUJDRA=="])
    verified = await account.client.post(f"/v1/domains/{created['id']}/verify")
    assert verified.status_code == 200 and verified.json()["status"] == "verified"
    state = (await account.client.get("/v1/sandbox")).json()
    assert VICTIM in state["sandbox_verified_domains"]

    # Long after its registration, the workspace leaves the sandbox: the mark goes, and the
    # checker looks for the DNS record again from then on.
    clock.jump(GIVE_UP_AFTER.total_seconds() + 3600)
    left = await account.client.put("/v1/sandbox", json={"enabled": False})
    assert left.status_code == 200, left.text
    assert (await account.client.get(f"/v1/domains/{created['id']}")).json()["status"] == (
        "pending"
    )
    dns_server.set(dkim["host"], "TXT", [dkim["value"]])
    status = "pending"
    for _ in range(40):  # ~10 s of real time, counted in tries: the clock jumps in between
        # Each time: a checker round under way at a jump sets its next one an interval after
        # the jump (a load-dependent failure in CI when it was jumped only once).
        clock.jump(INTERVAL.total_seconds() + 1)
        status = (await account.client.get(f"/v1/domains/{created['id']}")).json()["status"]
        if status == "verified":
            break
        await trio.sleep(0.25)
    assert status == "verified"


async def test_a_dns_check_that_proves_nothing_leaves_a_mark_standing(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain_id = await marked_victim(service)
    rt = service.running.runtime
    domain = await rt.db.read(domains.get, account.workspace_id, domain_id)
    assert domain is not None
    host = f"{domain.dkim_selector}._domainkey.{VICTIM}"
    dns_server.set(host, "TXT", ["v=DKIM1; k=rsa; p=QUJDRA=="])  # someone else's key
    # What the checker does with a domain it read as pending just before it was marked.
    checked = await registry.check(rt, SYSTEM_ACTOR, domain, log_every_check=False)
    assert checked.status == "verified" and checked.sandbox_verified
    state = (await account.client.get("/v1/sandbox")).json()
    assert VICTIM in state["sandbox_verified_domains"]


def _escape(tx: Tx, domain_id: str, to_workspace_id: str) -> None:
    """Move a marked domain as a transfer did before 0025, and forget 0025 was applied."""
    params = {"id": domain_id, "ws": to_workspace_id}
    tx.execute("UPDATE domains SET workspace_id = :ws WHERE id = :id", params)
    tx.execute("UPDATE senders SET workspace_id = :ws WHERE domain_id = :id", params)
    tx.execute("DELETE FROM schema_migrations WHERE version = 25")


async def test_migration_0025_sends_marks_that_escaped_back_to_pending(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    source, domain_id = await marked_victim(service)
    target = await service.account("starter")
    db = service.running.runtime.db
    await db.write(_escape, domain_id, target.workspace_id)
    escaped = (await target.client.get(f"/v1/domains/{domain_id}")).json()
    assert escaped["status"] == "verified"
    assert await db.transaction(migrations.apply_pending) == [25]
    held = (await target.client.get(f"/v1/domains/{domain_id}")).json()
    assert held["status"] == "pending" and held["verified_at"] is None
    # A mark still inside its sandboxed workspace is left alone.
    other = (await source.client.post("/v1/domains/", json={"name": "shop2.example"})).json()
    await source.client.post(f"/v1/sandbox/domains/{other['id']}/verify")
    await db.write(lambda tx: tx.execute("DELETE FROM schema_migrations WHERE version = 25"))
    assert await db.transaction(migrations.apply_pending) == [25]
    kept = (await source.client.get(f"/v1/domains/{other['id']}")).json()
    assert kept["status"] == "verified"


async def test_a_test_key_cannot_make_what_outlives_the_sandbox(service: Service) -> None:
    account = await sandbox_account(service)
    made = await account.client.post("/v1/sandbox/test-keys", json={"name": "ci"})
    tester = service.client(headers={"Authorization": f"Bearer {made.json()['key']}"})
    [domain] = (await account.client.get("/v1/domains/")).json()
    path = f"/v1/domains/{domain['id']}"
    hook = {"url": "https://hooks.example/in", "events": ["email.delivered"]}
    refused: list[tuple[str, str, Any]] = [
        ("POST", "/v1/api-keys/", {"name": "escape"}),
        ("POST", "/v1/sandbox/test-keys", {"name": "more"}),
        ("POST", "/v1/smtp-credentials/", {"domain_id": domain["id"]}),
        ("POST", "/v1/webhooks/", hook),
        ("GET", "/v1/webhooks/", None),  # their signing secrets
        ("PUT", "/v1/privacy/retention", {"days": 1}),
        ("POST", "/v1/privacy/erase", {"email": "ann@customer.example"}),
        ("POST", f"{path}/transfer", {"target_email": "taker@example.org"}),
        ("PUT", "/v1/sandbox", {"enabled": False}),
        ("DELETE", path, None),
        ("POST", "/v1/forwards/", {"source_email": "in@shop.example"}),
        ("PATCH", "/v1/mcp/policy", {}),
    ]
    for method, url, body in refused:
        answer = await tester.request(method, url, json=body)
        assert answer.status_code == 403, (method, url, answer.text)
        assert answer.json()["code"] == "test_key_forbidden", (method, url)

    # Nothing of it happened; what belongs in the sandbox still works.
    assert len((await account.client.get("/v1/api-keys/")).json()) == 2  # first + test key
    assert (await account.client.get("/v1/smtp-credentials/")).json() == []
    assert (await account.client.get("/v1/webhooks/")).json() == []
    assert (await account.client.get(path)).status_code == 200
    assert (await account.client.get("/v1/sandbox")).json()["enabled"] is True
    letter = {**message("deliver@customer.example"), "from_": {"email": "hello@shop.example"}}
    assert (await tester.post("/v1/emails/", json=letter)).status_code == 202
    template = {"name": "receipt", "subject": "Hi", "html_body": "<p>Hi</p>"}
    assert (await tester.post("/v1/templates/", json=template)).status_code == 201
    assert (await tester.get("/v1/api-keys/")).status_code == 200


def test_the_test_key_table_names_real_routes() -> None:
    app = create_app(SimpleNamespace(domain_transfers=True), None, None, None)  # type: ignore[arg-type]
    unsafe: set[str] = set()
    safe: set[str] = set()
    for rule in app.url_map.iter_rules():
        methods = set(rule.methods or ()) - {"HEAD", "OPTIONS"}
        (unsafe if methods - {"GET"} else safe).add(rule.endpoint)
    assert unsafe >= test_keys.SANDBOX_CHANGES, test_keys.SANDBOX_CHANGES - unsafe
    assert safe >= test_keys.SECRET_READS
    assert {e.partition(".")[0] for e in unsafe | safe} >= test_keys.PLATFORM_BLUEPRINTS
    assert not test_keys.may("api_keys.create", changes=True)
    assert not test_keys.may("nodes.list_nodes", changes=False)
    assert test_keys.may("emails.list_emails", changes=False)
