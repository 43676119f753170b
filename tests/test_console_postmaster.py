"""The console's bounce domain form and postmaster mail pages, in a real browser (Chromium,
tests/harness/browser.py), on both engines: mail sent by SMTP to the running MX is listed
and shown as it arrived."""

from __future__ import annotations

import smtplib

import trio
from playwright.sync_api import Page, expect

from postroom.service import RunningService
from tests.harness.bounce_domain import letter
from tests.harness.browser import Browsing
from tests.harness.console import add_sandbox_domain, admin, sign_in

DOMAIN = "shop.example"


def _send(address: tuple[str, int], to: str, data: bytes) -> None:
    with smtplib.SMTP(*address, timeout=10) as client:
        client.sendmail("someone@elsewhere.example", [to], data)


async def test_the_bounce_domain_is_set_and_postmaster_mail_read_in_the_console(
    console: RunningService, browsing: Browsing
) -> None:
    email = await admin(console)
    tab = await browsing.open(console.api_url)

    def add_domain(page: Page) -> None:
        sign_in(page, email)
        add_sandbox_domain(page, DOMAIN)

    await tab.do(add_domain)
    to = f"postmaster@{DOMAIN}"
    await trio.to_thread.run_sync(
        _send, console.inbound_address, to, letter(to, "Your servers", "Please look.\r\n")
    )

    def read(page: Page) -> None:
        page.get_by_label("Bounce domain").fill("bounces.elsewhere.example")
        page.get_by_role("button", name="Save the bounce domain").click()
        expect(page.locator("#f-bounce_domain-error")).to_contain_text("subdomain of")
        page.get_by_label("Bounce domain").fill(f"bounces.{DOMAIN}")
        page.get_by_role("button", name="Save the bounce domain").click()
        expect(page.get_by_role("status")).to_contain_text("Bounce domain saved")
        expect(page.get_by_role("cell", name=f"bounces.{DOMAIN}").first).to_be_visible()
        page.get_by_role("link", name="Mail to postmaster@ and abuse@").click()
        expect(page.get_by_text("1 messages.")).to_be_visible()
        page.get_by_role("link", name="Your servers").click()
        expect(page.get_by_role("heading", name="Your servers")).to_be_visible()
        expect(page.locator("pre.raw")).to_contain_text("Please look.")

    await tab.do(read)
    await tab.close()
