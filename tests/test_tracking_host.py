"""A sending domain's own tracking host: set through the domain API, its CNAME in the
DNS guidance and checked, and once verified the open pixel and click links of the domain's
mail point at it, and the service answers them there."""

from __future__ import annotations

import email
import email.policy
import re
from typing import Any

from tests.harness.dns_server import DnsServer
from tests.harness.sending import (
    SENDING_DOMAIN,
    message,
    ready_account,
    route_mail,
    wait_for_status,
)
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink

PUBLIC_HOST = "postroom.test"  # the tests' POSTROOM_PUBLIC_URL is http://postroom.test
LINKS = f"links.{SENDING_DOMAIN}"
ARTICLE = "https://example.com/article?id=7"


async def _links_of_next_mail(account: Any, smtp_sink: SmtpSink, seen: int) -> tuple[str, str, str]:
    """Send one tracked email; its id, open pixel URL and click URL as received."""
    html = f'<html><body><p>Read <a href="{ARTICLE}">the article</a>.</p></body></html>'
    sent = (
        await account.client.post("/v1/emails/", json=message("ron@reader.example", html=html))
    ).json()
    received = await smtp_sink.wait_for_messages(seen + 1)
    await wait_for_status(account, sent["id"])
    parsed = email.message_from_bytes(received[seen].data, policy=email.policy.default)
    part = parsed.get_body(("html",))
    assert part is not None
    body = part.get_content()
    pixel = re.search(r'<img src="([^"]+)"', body)
    link = re.search(r'<a href="([^"]+)"', body)
    assert pixel and link
    return sent["id"], pixel.group(1), link.group(1)


async def test_verified_tracking_host_carries_the_domains_links(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "reader.example")
    [domain] = (await account.client.get("/v1/domains/")).json()
    path = f"/v1/domains/{domain['id']}"
    patched = await account.client.patch(
        path, json={"open_tracking": True, "click_tracking": True, "tracking_host": LINKS.upper()}
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["tracking_host"] == LINKS
    [record] = [r for r in patched.json()["dns_records"] if r["purpose"] == "tracking"]
    assert record == {
        "type": "CNAME",
        "host": LINKS,
        "value": PUBLIC_HOST,
        "purpose": "tracking",
        "required": False,
        "status": "pending",
        "detail": None,
        "suggested_value": None,
    }

    # Not published yet: the links stay on the service's public URL.
    _, pixel, link = await _links_of_next_mail(account, smtp_sink, 0)
    assert pixel.startswith(f"http://{PUBLIC_HOST}/t/o/")
    assert link.startswith(f"http://{PUBLIC_HOST}/t/c/")

    dns_server.set(LINKS, "CNAME", [f"{PUBLIC_HOST}."])
    checked = (await account.client.post(f"{path}/verify")).json()
    [record] = [r for r in checked["dns_records"] if r["purpose"] == "tracking"]
    assert record["status"] == "verified"
    assert checked["status"] == "verified"

    email_id, pixel, link = await _links_of_next_mail(account, smtp_sink, 1)
    assert pixel.startswith(f"http://{LINKS}/t/o/")
    assert link.startswith(f"http://{LINKS}/t/c/")
    # The service answers them on that host (the name is not routable here: the request
    # goes to the service's address with the host's name in Host).
    reader = service.client(headers={"Host": LINKS, "User-Agent": "MailReader/1.0"})
    image = await reader.get(pixel.removeprefix(f"http://{LINKS}"))
    assert image.status_code == 200 and image.headers["content-type"] == "image/gif"
    jump = await reader.get(link.removeprefix(f"http://{LINKS}"))
    assert jump.status_code == 302 and jump.headers["location"] == ARTICLE
    events = (await account.client.get(f"/v1/emails/{email_id}/events")).json()
    assert {"opened", "clicked"} <= {e["event_type"] for e in events}

    # A CNAME pointing elsewhere is found at the next check: back to the public URL.
    dns_server.set(LINKS, "CNAME", ["elsewhere.example."])
    checked = (await account.client.post(f"{path}/verify")).json()
    [record] = [r for r in checked["dns_records"] if r["purpose"] == "tracking"]
    assert record["status"] == "missing"
    _, pixel, _ = await _links_of_next_mail(account, smtp_sink, 2)
    assert pixel.startswith(f"http://{PUBLIC_HOST}/t/o/")


async def test_tracking_host_must_be_a_name_under_the_domain_and_can_be_cleared(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    [domain] = (await account.client.get("/v1/domains/")).json()
    path = f"/v1/domains/{domain['id']}"
    for wrong in ("links.other.example", SENDING_DOMAIN, "not a name", "", 7):
        refused = await account.client.patch(path, json={"tracking_host": wrong})
        assert refused.status_code == 422, (wrong, refused.text)
        assert refused.json()["code"] == "validation_error"
        assert refused.json()["errors"][0]["loc"][-1] == "tracking_host"
    unknown = await account.client.patch(path, json={"tracking_domain": LINKS})
    assert unknown.status_code == 422
    assert (await account.client.patch(path, json={"tracking_host": LINKS})).status_code == 200
    cleared = (await account.client.patch(path, json={"tracking_host": None})).json()
    assert cleared["tracking_host"] is None
    assert [r for r in cleared["dns_records"] if r["purpose"] == "tracking"] == []
    log = (await account.client.get("/v1/audit-log")).json()["items"]
    changes = [e["meta"].get("tracking_host") for e in log if e["action"] == "domain.updated"]
    assert changes[:2] == [None, LINKS]  # newest first
