"""The console's two-factor sign-in in Chromium: a person enrols from the account page (the key
shown as text and as an otpauth:// link), confirms with a first code, sees the ten recovery
codes once, and from then on signs in with the password and then a code."""

from __future__ import annotations

import re

import pyotp
from playwright.sync_api import Page, expect

from postroom.service import RunningService
from tests.harness.browser import PASSWORD, Browsing
from tests.harness.console import admin, sign_in, sign_out


async def test_a_person_enrols_and_signs_in_with_a_code(
    console: RunningService, browsing: Browsing
) -> None:
    email = await admin(console)
    tab = await browsing.open(console.api_url)

    def enrol(page: Page) -> str:
        sign_in(page, email)
        page.goto("/account")
        page.get_by_role("link", name="Manage two-factor sign-in").click()
        page.get_by_role("button", name="Set up two-factor sign-in").click()
        secret = page.locator("#totp-secret").inner_text()
        link = page.get_by_role("link", name="otpauth://totp/")
        expect(link).to_have_attribute(
            "href", re.compile(f"^otpauth://totp/Postroom:.*secret={secret}")
        )
        return secret

    secret = await tab.do(enrol)
    # As the phone's app would show it, by the service's clock; the login's code is the next
    # step's (accepted within the drift), as the first one is spent.
    otp, now = pyotp.TOTP(secret), console.runtime.clock.now()
    wrong, first, second = (otp.at(now, counter_offset=step) for step in (-5, 0, 1))

    def confirm(page: Page) -> None:
        page.get_by_label("First code").fill(wrong)
        page.get_by_role("button", name="Turn two-factor sign-in on").click()
        expect(page.get_by_text("wrong code")).to_be_visible()
        page.get_by_label("First code").fill(first)
        page.get_by_role("button", name="Turn two-factor sign-in on").click()
        expect(
            page.get_by_role("list", name="Recovery codes").get_by_role("listitem")
        ).to_have_count(10)
        page.goto("/account/two-factor")  # shown once: the page now says it is on
        expect(page.get_by_text("Two-factor sign-in is on")).to_be_visible()
        sign_out(page)

    def sign_in_with_code(page: Page) -> None:
        page.goto("/login")
        page.get_by_label("Email").fill(email)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_label("Code")).to_be_visible()
        page.get_by_label("Code").fill(second)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()

    await tab.do(confirm)
    await tab.do(sign_in_with_code)
    await tab.close()
