"""Open and click tracking and unsubscribe, followed from the links in a delivered message."""

from __future__ import annotations

import email
import email.policy
import re
from typing import Any

import httpx

from tests.harness.dns_server import DnsServer
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

PUBLIC = "http://postroom.test"


async def _deliver(
    account: Account, dns_server: DnsServer, smtp_sink: SmtpSink, **extra: Any
) -> tuple[str, Any]:
    route_mail(dns_server, "reader.example")
    html = '<html><body><p>Read <a href="https://example.com/article?id=7">the article</a>.</p></body></html>'
    sent = (
        await account.client.post(
            "/v1/emails/", json=message("ron@reader.example", html=html, **extra)
        )
    ).json()
    [received] = await smtp_sink.wait_for_messages(1)
    await wait_for_status(account, sent["id"])
    return sent["id"], email.message_from_bytes(received.data, policy=email.policy.default)


def _local(url: str) -> str:
    """A public link, as the service's own address (the tests' public URL is not routable)."""
    assert url.startswith(PUBLIC)
    return url.removeprefix(PUBLIC)


async def _enable_tracking(account: Account) -> None:
    domain = (await account.client.get("/v1/domains/")).json()[0]
    patched = await account.client.patch(
        f"/v1/domains/{domain['id']}", json={"open_tracking": True, "click_tracking": True}
    )
    assert patched.json()["open_tracking"] and patched.json()["click_tracking"]


async def test_opens_and_clicks_are_recorded(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    await _enable_tracking(account)
    email_id, parsed = await _deliver(account, dns_server, smtp_sink)
    html = parsed.get_body(("html",)).get_content()
    pixel = re.search(r'<img src="([^"]+)"', html)
    link = re.search(r'<a href="([^"]+)"', html)
    assert pixel and link and "example.com/article" not in link.group(1)

    public = service.client(headers={"User-Agent": "MailReader/1.0"})
    image = await public.get(_local(pixel.group(1)))
    assert image.status_code == 200 and image.headers["content-type"] == "image/gif"
    jump = await public.get(_local(link.group(1)))
    assert jump.status_code == 302
    assert jump.headers["location"] == "https://example.com/article?id=7"

    events = (await account.client.get(f"/v1/emails/{email_id}/events")).json()
    by_type = {e["event_type"]: e for e in events}
    # Moments after delivery: taken for a privacy proxy's prefetch (tests/test_mail_stats.py).
    assert by_type["opened"]["metadata"]["audience"] == "machine"
    assert "user_agent" not in by_type["opened"]["metadata"]
    assert by_type["clicked"]["metadata"]["url"] == "https://example.com/article?id=7"


async def test_without_tracking_links_are_untouched(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    _, parsed = await _deliver(account, dns_server, smtp_sink)
    html = parsed.get_body(("html",)).get_content()
    assert 'href="https://example.com/article?id=7"' in html
    assert "<img" not in html


async def test_one_click_unsubscribe_suppresses_the_reader(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    email_id, parsed = await _deliver(account, dns_server, smtp_sink, unsubscribe=True)
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    url = parsed["List-Unsubscribe"].split(",")[0].strip("<>")
    public = service.client()
    page = await public.get(_local(url))
    assert page.status_code == 200 and "ron@reader.example" in page.text
    assert (await account.client.get("/v1/suppressions/")).json()[
        "total"
    ] == 0  # GET changes nothing

    done = await public.post(_local(url), data={"List-Unsubscribe": "One-Click"})
    assert done.status_code == 200
    listed = (await account.client.get("/v1/suppressions/")).json()["items"]
    assert [(s["email"], s["reason"], s["source_email_id"]) for s in listed] == [
        ("ron@reader.example", "unsubscribe", email_id)
    ]
    events = (await account.client.get(f"/v1/emails/{email_id}/events")).json()
    unsubscribed = [e for e in events if e["event_type"] == "unsubscribed"]
    assert unsubscribed[0]["metadata"]["method"] == "one-click"


async def test_forged_or_altered_links_are_404(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    await _enable_tracking(account)
    _, parsed = await _deliver(account, dns_server, smtp_sink)
    link = re.search(r'<a href="([^"]+)"', parsed.get_body(("html",)).get_content())
    assert link
    path = _local(link.group(1))
    public: httpx.AsyncClient = service.client()
    body, _, mac = path.rpartition(".")
    assert (await public.get(f"{body}.{'A' * len(mac)}")).status_code == 404
    assert (await public.get(path.replace("/t/c/", "/t/o/"))).status_code == 404  # wrong kind
    assert (await public.get("/t/u/nonsense")).status_code == 404
    assert (await public.post("/t/u/nonsense")).status_code == 404
