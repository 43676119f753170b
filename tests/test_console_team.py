"""The console's Team page in Chromium: an owner invites, the invitee (signed in) joins from
the page and, as a viewer, only reads; the owner changes the role and removes the member."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from engine.accounts import users
from postroom.service import RunningService
from tests.harness.browser import PASSWORD, Browsing, new_email
from tests.harness.console import admin, sign_in, sign_out


async def test_an_owner_invites_a_member_who_joins_reads_and_is_removed(
    console: RunningService, browsing: Browsing
) -> None:
    owner = await admin(console)
    member = new_email()
    await users.create_account(console.runtime, member, PASSWORD, "free")
    tab = await browsing.open(console.api_url)

    def invite(page: Page) -> None:
        sign_in(page, owner)
        page.get_by_role("link", name="Team", exact=True).click()
        expect(page.get_by_role("heading", name="Team", exact=True)).to_be_visible()
        page.get_by_label("Email").fill(owner)
        page.get_by_role("button", name="Send the invitation").click()
        expect(page.get_by_role("alert")).to_contain_text("is a member already")
        page.get_by_label("Email").fill(member)
        page.get_by_label("Role", exact=True).select_option("viewer")
        page.get_by_role("button", name="Send the invitation").click()
        expect(page.get_by_role("status")).to_contain_text("Invitation sent")
        expect(page.get_by_role("row", name=re.compile(member))).to_contain_text("viewer")
        sign_out(page)

    def join(page: Page) -> None:
        sign_in(page, member)
        page.get_by_role("link", name="Team", exact=True).click()
        page.get_by_role("button", name=f"Join {owner}").click()
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        page.get_by_role("link", name="Team", exact=True).click()
        expect(page.get_by_text("You are viewer")).to_be_visible()
        expect(page.get_by_role("row", name=re.compile(owner))).to_contain_text("owner")
        expect(page.get_by_role("button", name="Send the invitation")).to_have_count(0)
        page.get_by_role("link", name="Domains", exact=True).click()
        page.get_by_label("Domain name").fill("viewer.example")
        page.get_by_role("button", name="Add the domain").click()
        expect(page.get_by_text("your role (viewer) may not change this")).to_be_visible()
        sign_out(page)

    def manage(page: Page) -> None:
        sign_in(page, owner)
        page.get_by_role("link", name="Team", exact=True).click()
        page.get_by_label(f"Role of {member}").select_option("developer")
        page.get_by_role("row", name=re.compile(member)).get_by_role(
            "button", name="Change"
        ).click()
        expect(page.get_by_role("status")).to_contain_text("Role changed")
        expect(page.get_by_label(f"Role of {member}")).to_have_value("developer")
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("row", name=re.compile(member)).get_by_role(
            "button", name="Remove"
        ).click()
        expect(page.get_by_role("status")).to_contain_text("Member removed")
        expect(page.get_by_role("row", name=re.compile(member))).to_have_count(0)
        page.get_by_role("link", name="Activity", exact=True).click()
        expect(page.get_by_text("member.removed").first).to_be_visible()

    await tab.do(invite)
    await tab.do(join)
    await tab.do(manage)
    await tab.close()
