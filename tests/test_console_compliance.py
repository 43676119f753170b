"""The console's views of the compliance report and the complaint-rate guard, in a real
browser (Chromium, tests/harness/browser.py): the domain page's badge per provider with its
items, a broadcast the guard paused and the domain whose marketing mail it stopped (after a
real delivery to the sink and an ARF complaint through the MX), each with its Resume button
under the API's rules; at 390 px wide, with no sideways scroll and no serious axe-core
finding."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import pytest
import trio
from playwright.sync_api import Page, ViewportSize, expect

from postroom.service import RunningService, serve
from tests.harness import service as harness
from tests.harness.bounce_domain import feedback_report
from tests.harness.broadcasts import sender_id
from tests.harness.browser import Browsing
from tests.harness.console import sign_in
from tests.harness.contacts import add_contact, create_list
from tests.harness.dns_server import DnsServer
from tests.harness.inbound import poll, send_inbound
from tests.harness.sending import SENDING_DOMAIN, ready_account, route_mail, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

CUSTOMERS = "customers.example"
SLOW = "slow.example"  # the sink defers the first attempt: the broadcast still waits
PHONE: ViewportSize = {"width": 390, "height": 844}


@pytest.fixture
async def guarded_console(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    clock: trio.testing.MockClock,
) -> AsyncIterator[Service]:
    """The service delivering to the sink, its console at its public URL, and a guard that
    counts from the first delivery on."""
    port = harness.free_port()
    settings = harness.test_settings(
        database_url,
        dns_server,
        api_listen=f"127.0.0.1:{port}",
        public_url=f"http://127.0.0.1:{port}",
        delivery_port=str(smtp_sink.port),
        extra_ca_file=str(tls_ca.ca_file),
        complaint_min_deliveries="1",
    )
    running: RunningService = await nursery.start(serve, settings)
    service = harness.Service(running, clock)
    try:
        yield service
    finally:
        await service.aclose()
        running.stop()


async def _broadcast(account: Account, address: str, subject: str) -> list[dict[str, Any]]:
    """A broadcast to one contact; its emails."""
    contact_list = await create_list(account, name=subject)
    await add_contact(account, contact_list["id"], address)
    sent = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/send",
        json={
            "contact_list_id": contact_list["id"],
            "sender_address_id": await sender_id(account),
            "subject": subject,
            "text": "News for {{email}}.",
        },
    )
    assert sent.status_code == 200, sent.text
    found = await poll(account, "/v1/emails/search", lambda e: len(e) == 1, q=f"to:{address}")
    return [(await account.client.get(f"/v1/emails/{e['id']}")).json() for e in found]


# axe-core, as the axe-playwright-python package ships it (a dev dependency).
AXE = (resources.files("axe_playwright_python") / "axe.min.js").read_text()


def _checked(page: Page) -> None:
    """No sideways scroll at the phone's width, and no serious or critical axe finding."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{page.url} is {width}px wide at {PHONE['width']}px"
    page.evaluate(AXE)
    found = page.evaluate("axe.run(document).then(r => r.violations)")
    serious = [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']]}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]
    assert serious == [], f"{page.url}: {serious}"


# The pages read what the API answers; the API's tests run on both engines
# (tests/test_compliance_report.py), so one browser run is enough.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_badges_per_provider_and_resuming_what_the_guard_stopped(
    guarded_console: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    browsing: Browsing,
) -> None:
    service = guarded_console
    account = await ready_account(service, dns_server, "business")
    [domain] = (await account.client.get("/v1/domains/")).json()
    route_mail(dns_server, CUSTOMERS)
    route_mail(dns_server, SLOW)
    [delivered] = await _broadcast(account, f"ann@{CUSTOMERS}", "Spring news")
    await wait_for_status(account, delivered["id"], ("delivered",))
    smtp_sink.fail_first(f"cat@{SLOW}", 1)
    [waiting] = await _broadcast(account, f"cat@{SLOW}", "Summer news")
    await wait_for_status(account, waiting["id"], ("deferred",))
    # One complaint about one delivered: the broadcast pauses and marketing mail stops.
    abuse = f"abuse@{SENDING_DOMAIN}"
    complaint = feedback_report(abuse, delivered["message_id"])
    assert await send_inbound(service, [abuse], complaint, sender="") == set()
    await poll(account, "/v1/domains/", lambda d: d[0]["marketing_stopped_at"] is not None)

    tab = await browsing.open(service.url)

    def domain_page(page: Page) -> None:
        sign_in(page, account.email)
        page.set_viewport_size(PHONE)
        page.goto(f"/domains/{domain['id']}")
        for name in ("Gmail", "Yahoo", "Microsoft (Outlook.com)"):
            # The status is a word beside the name, not a colour alone.
            expect(page.get_by_role("heading", name=f"{name} fail")).to_be_visible()
        gmail = page.get_by_role("list", name="Gmail fail")
        expect(gmail.get_by_role("listitem").filter(has_text="Complaints under")).to_contain_text(
            "Found: 1 complaints about 1 recipients"
        )
        expect(gmail.get_by_role("listitem").filter(has_text="SPF authorises")).to_contain_text(
            "To do:"
        )
        expect(page.get_by_role("region", name="Marketing stopped")).to_be_visible()
        _checked(page)

        page.get_by_role("button", name="Menu").click()  # the phone's navigation is folded
        page.get_by_role("link", name="Broadcasts", exact=True).click()
        row = page.get_by_role("row").filter(has_text="Summer news")
        expect(row).to_contain_text("paused")
        expect(row).to_contain_text("complaint rate passed the limit")
        _checked(page)
        # The domain is still stopped: the API's refusal, said on the page.
        page.once("dialog", lambda dialog: dialog.accept())
        row.get_by_role("button", name="Resume Summer news").click()
        expect(page.get_by_role("alert")).to_contain_text("is stopped since")
        _checked(page)

        page.goto(f"/domains/{domain['id']}")
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("button", name="Resume marketing mail").click()
        expect(page.get_by_role("status")).to_contain_text("Marketing mail resumed")
        expect(page.get_by_role("region", name="Marketing stopped")).to_have_count(0)

        page.get_by_role("button", name="Menu").click()
        page.get_by_role("link", name="Broadcasts", exact=True).click()
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("button", name="Resume Summer news").click()
        expect(page.get_by_role("status")).to_contain_text("Broadcast resumed")
        expect(page.get_by_role("button", name="Resume Summer news")).to_have_count(0)

    await tab.do(domain_page)
    await tab.close()
    await wait_for_status(account, waiting["id"], ("delivered",))
