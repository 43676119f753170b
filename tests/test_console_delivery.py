"""The console's Delivery page in Chromium (tests/harness/browser.py): creating, changing
(on its own page) and deleting a destination policy and a warm-up ramp, resolving a destination
incident, and a queue action's dry run then the real one, each first refused with the API's own
error for bad input; and the domain page's tracking host and bounce domain with their state."""

from __future__ import annotations

import re

import httpx
import trio
from playwright.sync_api import Page, expect

from engine.accounts import users
from engine.delivery.incidents import pause_for
from postroom.service import RunningService
from storage import incidents
from storage.incidents import Hit
from tests.harness.browser import PASSWORD, Browsing, new_email
from tests.harness.console import sign_in

DOMAIN = "ramped.example"


async def _deferred_email(api: httpx.AsyncClient) -> str:
    """A verified sandbox domain, and an email the sandbox defers (its recipient waits)."""
    domain = (await api.post("/v1/domains/", json={"name": DOMAIN})).json()
    await api.post(f"/v1/sandbox/domains/{domain['id']}/verify")
    await api.post("/v1/senders/", json={"email": f"hello@{DOMAIN}"})
    sent = await api.post(
        "/v1/emails/",
        json={
            "from_": {"email": f"hello@{DOMAIN}"},
            "to": [{"email": "defer3-then-deliver@customer.example"}],
            "subject": "Later",
            "text": "later",
        },
    )
    assert sent.status_code in (200, 201, 202), sent.text
    status = ""
    with trio.fail_after(20):
        while status != "deferred":
            status = (await api.get(f"/v1/emails/{sent.json()['id']}")).json()["status"]
            await trio.sleep(0.1)
    domain_id: str = domain["id"]
    return domain_id


async def test_delivery_controls_on_a_page_with_the_apis_rules(
    console: RunningService, browsing: Browsing
) -> None:
    email = new_email()
    created = await users.create_account(console.runtime, email, PASSWORD, "business", admin=True)
    key = {"Authorization": f"Bearer {created.api_key}"}
    async with httpx.AsyncClient(base_url=console.api_url, headers=key) as api:
        domain_id = await _deferred_email(api)
    # A destination blocking the domain, as a delivery round records one.
    hit = Hit("blocked", DOMAIN, "550 5.7.1 blocked due to low reputation")
    hits = {(created.workspace_id, domain_id): hit}
    now = console.runtime.clock.now()
    await console.runtime.db.write(
        incidents.record_round, "blocked.example", hits, set(), now, pause_for
    )
    tab = await browsing.open(console.api_url)

    def policies(page: Page) -> None:
        sign_in(page, email)
        page.get_by_role("link", name="Delivery", exact=True).click()
        expect(page.get_by_role("heading", name="Delivery", exact=True)).to_be_visible()
        page.get_by_label("Match").fill("not a domain")
        page.get_by_label("Connections", exact=True).fill("2")
        page.get_by_role("button", name="Add the policy").click()
        expect(page.get_by_text("match must be a recipient domain").first).to_be_visible()
        page.get_by_label("Match").fill("gmail.com")
        page.get_by_label("Connections", exact=True).fill("0")
        page.get_by_role("button", name="Add the policy").click()
        expect(page.locator("#policy-f-max_connections-error")).to_contain_text(
            "greater than or equal to 1"
        )
        page.get_by_label("Connections", exact=True).fill("2")
        page.get_by_label("Per day", exact=True).fill("5000")
        page.get_by_role("button", name="Add the policy").click()
        expect(page.get_by_role("status")).to_contain_text("Destination policy created")
        row = page.get_by_role("row", name=re.compile(r"^gmail\.com"))
        expect(row).to_contain_text("5000")
        # Changed on its own page: a bad value is the API's refusal, an emptied limit is cleared.
        row.get_by_role("link", name="Edit").click()
        expect(page.get_by_label("Per day", exact=True)).to_have_value("5000")
        page.get_by_label("Per minute", exact=True).fill("0")
        page.get_by_role("button", name="Save the policy").click()
        expect(page.locator("#policy-f-per_minute-error")).to_contain_text(
            "greater than or equal to 1"
        )
        page.get_by_label("Per minute", exact=True).fill("120")
        page.get_by_label("Per day", exact=True).fill("")
        page.get_by_role("button", name="Save the policy").click()
        expect(page.get_by_role("status")).to_contain_text("Destination policy changed")
        expect(row).to_contain_text("120")
        expect(row).not_to_contain_text("5000")
        page.once("dialog", lambda dialog: dialog.accept())
        row.get_by_role("button", name="Delete").click()
        expect(page.get_by_role("status")).to_contain_text("Destination policy deleted")
        expect(page.get_by_role("row", name=re.compile(r"^gmail\.com"))).to_have_count(0)
        # Built-in policies are listed, and offer no Delete.
        builtin = page.get_by_role("row", name=re.compile(r"^\*\.google\.com"))
        expect(builtin).to_contain_text("built-in")

    def ramps(page: Page) -> None:
        form = page.locator("form", has=page.get_by_role("button", name="Add the ramp"))
        form.get_by_label("Sending domain").select_option(label=DOMAIN)
        form.get_by_label("First day").fill("500")
        form.get_by_label("Target per day").fill("100")
        form.get_by_role("button", name="Add the ramp").click()
        expect(page.locator("#ramp-f-target_per_day-error")).to_contain_text(
            "target_per_day must be more than first_day"
        )
        form.get_by_label("Target per day").fill("20000")
        form.get_by_role("button", name="Add the ramp").click()
        expect(page.get_by_role("status")).to_contain_text("Warm-up ramp created")
        row = page.get_by_role("row", name=re.compile("^" + re.escape(DOMAIN)))
        expect(row).to_contain_text("day 1: 500 per destination")
        row.get_by_role("link", name="Edit").click()
        page.get_by_label("Target per day").fill("400")
        page.get_by_role("button", name="Save the ramp").click()
        expect(page.locator("#ramp-f-target_per_day-error")).to_contain_text(
            "target_per_day must be more than first_day"
        )
        page.get_by_label("First day").fill("300")
        page.get_by_role("button", name="Save the ramp").click()
        expect(page.get_by_role("status")).to_contain_text("Warm-up ramp changed")
        expect(row).to_contain_text("day 1: 300 per destination")
        expect(row).to_contain_text("400")
        page.once("dialog", lambda dialog: dialog.accept())
        row.get_by_role("button", name="Delete").click()
        expect(page.get_by_role("status")).to_contain_text("Warm-up ramp deleted")
        expect(page.get_by_text("No warm-up ramp.")).to_be_visible()

    def incident(page: Page) -> None:
        row = page.get_by_role("row", name=re.compile(r"^blocked\.example"))
        expect(row).to_contain_text("low reputation")
        action = row.locator("form").get_attribute("action")
        row.get_by_role("button", name="Resolve").click()
        expect(page.get_by_role("status")).to_contain_text("Incident resolved")
        expect(row).to_contain_text("resolved")
        expect(row.get_by_role("button", name="Resolve")).to_have_count(0)
        # Resolving it again (a second tab, a stale page) is the API's 409.
        again = page.request.post(str(action), headers={"Origin": console.api_url}, max_redirects=0)
        assert again.status == 409
        assert "resolved already" in again.text()

    def queue(page: Page) -> None:
        form = page.locator("form", has=page.get_by_role("button", name="Dry run"))
        form.get_by_label("Search").fill("colour:blue")
        form.get_by_role("button", name="Dry run").click()
        expect(page.get_by_role("alert")).to_contain_text("colour")
        form.get_by_label("Search").fill("status:deferred")
        form.get_by_label("Action").select_option("hold")
        form.get_by_role("button", name="Dry run").click()
        result = page.get_by_role("status")
        expect(result).to_contain_text("hold would take 1 recipient(s) of 1 email(s) (dry run")
        expect(form.get_by_label("Search")).to_have_value("status:deferred")
        form.get_by_role("button", name="Apply to the queue").click()
        expect(result).to_contain_text("hold took 1 recipient(s) of 1 email(s).")
        form.get_by_role("button", name="Dry run").click()
        expect(result).to_contain_text("hold would take 0 recipient(s)")
        page.get_by_role("link", name="Activity", exact=True).click()
        for action in ("queue.held", "delivery_incident.resolved", "delivery_ramp.deleted"):
            expect(page.get_by_text(action).first).to_be_visible()

    await tab.do(policies)
    await tab.do(ramps)
    await tab.do(incident)
    await tab.do(queue)

    def domain_page(page: Page) -> None:
        page.goto(f"/domains/{domain_id}")
        expect(page.get_by_role("heading", name="Bulk-sender rules")).to_be_visible()
        expect(page.locator("#bounce-state")).to_contain_text("No bounce domain")
        page.get_by_label("Tracking host").fill("links.elsewhere.example")
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.locator("#f-tracking_host-error")).to_contain_text(
            f"tracking_host must be a host name under {DOMAIN}"
        )
        page.get_by_label("Tracking host").fill(f"links.{DOMAIN}")
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.get_by_role("status")).to_contain_text("Tracking settings saved")
        expect(page.locator("#tracking-state")).to_contain_text(
            f"Links stay on the service's host until links.{DOMAIN} resolves to it"
        )
        expect(page.get_by_role("row", name=re.compile(r"^tracking"))).to_contain_text("pending")

    await tab.do(domain_page)
    await tab.close()
