"""The console's email log and its neighbours in a real browser (Debian's Chromium): the
source and date filters, the total and the CSV export; a bounced email's bounce type, its
suppression and the warning before a retry; times read alike on every page; the sandbox's
pending outcomes fast-forwarded and a message sent into a forward; template and broadcast
previews rendered in sandboxed frames at desktop and phone width."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import httpx
import trio
from playwright.sync_api import Page, expect

from engine.accounts import users
from postroom.service import RunningService
from tests.harness.browser import PASSWORD, Browsing, new_email
from tests.harness.console import sign_in

SENDER = "hello@shop.example"
# What the console shows a time as, to the second: never ISO text with microseconds.
SHOWN_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


async def _workspace(console: RunningService, plan: str = "starter") -> tuple[str, str]:
    """A sandboxed administrator with a sandbox-verified domain and a sender: their email
    and API key."""
    email = new_email()
    created = await users.create_account(console.runtime, email, PASSWORD, plan, admin=True)
    async with _api(console, created.api_key) as api:
        domain = (await api.post("/v1/domains/", json={"name": "shop.example"})).json()
        await api.post(f"/v1/sandbox/domains/{domain['id']}/verify")
        assert (await api.post("/v1/senders/", json={"email": SENDER})).status_code == 201
    return email, created.api_key


def _api(console: RunningService, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=console.api_url, headers={"Authorization": f"Bearer {key}"})


def _letter(to: str, **extra: Any) -> dict[str, Any]:
    return {
        "from_": {"email": SENDER},
        "to": [{"email": to}],
        "subject": "Hi",
        "text": "hi",
        **extra,
    }


async def _settled(api: httpx.AsyncClient, email_id: str, done: tuple[str, ...]) -> None:
    with trio.fail_after(15):
        while True:
            if (await api.get(f"/v1/emails/{email_id}")).json()["status"] in done:
                return
            await trio.sleep(0.05)


async def test_the_log_filters_counts_and_exports_and_a_bounce_warns_before_its_retry(
    console: RunningService, browsing: Browsing
) -> None:
    email, key = await _workspace(console)
    async with _api(console, key) as api:
        bounced = (await api.post("/v1/emails/", json=_letter("bounce@customer.example"))).json()
        batch = [_letter(f"b{i}@customer.example", subject="=SUM(A1:A9)") for i in range(3)]
        assert (await api.post("/v1/emails/batch", json=batch)).status_code == 202
        deferred = await api.post("/v1/emails/", json=_letter("defer3-then-deliver@x.example"))
        await _settled(api, bounced["id"], ("bounced",))
        await _settled(api, deferred.json()["id"], ("deferred",))

    tab = await browsing.open(console.api_url)

    def the_log(page: Page) -> str:
        sign_in(page, email)
        page.get_by_role("link", name="Email log", exact=True).click()
        expect(page.locator("#email-total")).to_have_text("5 emails")
        header = page.locator("table thead")
        expect(header).to_contain_text("Source")
        page.get_by_label("Source").select_option("batch")
        page.get_by_role("button", name="Search").click()
        expect(page.locator("#email-total")).to_have_text("3 emails")
        rows = page.locator("table tbody tr")
        expect(rows).to_have_count(3)
        for i in range(3):
            expect(rows.nth(i)).to_contain_text("batch")
        page.get_by_label("Created before").fill("2000-01-01")
        page.get_by_role("button", name="Search").click()
        expect(page.locator("#email-total")).to_have_text("0 emails")
        page.get_by_label("Created before").fill("")
        page.get_by_label("Created from").fill("2000-01-02")
        page.get_by_label("Created before").fill("2000-01-01")
        page.get_by_role("button", name="Search").click()
        expect(page.get_by_text("must be later than created_from", exact=True)).to_be_visible()
        page.get_by_label("Created from").fill("2000-01-01")
        page.get_by_label("Created before").fill("")
        page.get_by_role("button", name="Search").click()
        expect(page.locator("#email-total")).to_have_text("3 emails")
        # Saved, the search keeps its source and its date range.
        page.get_by_text("Saved searches (0)").click()
        page.get_by_label("Save this search as").fill("Batches since 2000")
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.get_by_text("Search saved.")).to_be_visible()
        page.goto("/emails")
        expect(page.locator("#email-total")).to_have_text("5 emails")
        page.get_by_text("Saved searches (1)").click()
        page.get_by_role("link", name="Batches since 2000").click()
        expect(page.locator("#email-total")).to_have_text("3 emails")
        expect(page.get_by_label("Created from")).to_have_value("2000-01-01")
        link = page.get_by_role("link", name="Export CSV")
        href = link.get_attribute("href") or ""
        expect(page.get_by_text("at most 50,000 rows")).to_be_visible()

        # A bounce: its type, its suppression linked, and a warning before a retry.
        page.get_by_label("Source").select_option("")
        page.locator("#f-q").fill("to:bounce@customer.example")
        page.get_by_role("button", name="Search").click()
        page.get_by_role("link", name="Hi").click()
        expect(page.locator("ul.bounces")).to_contain_text("hard bounce (5.1.1)")
        expect(page.locator("#retry-warning")).to_contain_text("bounce@customer.example")
        dialogs: list[str] = []

        def dismiss(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", dismiss)
        page.get_by_role("button", name="Retry").click()
        assert dialogs and "suppressed" in dialogs[0]
        expect(page.get_by_role("heading", level=1)).to_contain_text("bounced")  # not retried
        page.locator("ul.bounces").get_by_role("link", name=re.compile("suppressed")).click()
        expect(page.get_by_text("bounce@customer.example")).to_be_visible()
        expect(page).to_have_url(re.compile(r"/suppressions\?q=bounce"))
        return href

    export_url = await tab.do(the_log)
    assert "source=batch" in export_url and "created_from=2000-01-01" in export_url

    def times_alike(page: Page) -> None:
        page.goto("/emails?q=to:defer3-then-deliver@x.example")
        page.get_by_role("link", name="Hi").click()
        timeline = page.locator("ol.timeline")
        expect(timeline).to_contain_text("next attempt at:")
        text = timeline.inner_text()
        assert re.search(r"next attempt at:\s*" + SHOWN_TIME, text), text
        assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}", page.locator("main").inner_text())

    await tab.do(times_alike)
    async with httpx.AsyncClient(base_url=console.api_url) as client:
        signed_in = await client.post("/v1/auth/login", json={"email": email, "password": PASSWORD})
        assert signed_in.status_code == 200
        exported = await client.get(export_url)
    assert exported.status_code == 200 and exported.headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert [r["source"] for r in rows] == ["batch"] * 3
    assert {r["subject"] for r in rows} == {"'=SUM(A1:A9)"}
    await tab.close()


async def test_a_saved_search_with_a_time_of_day_keeps_it_when_searched_again(
    console: RunningService, browsing: Browsing
) -> None:
    """A saved search made through the API may hold a time of day, which a date input cannot
    show: the console shows it in UTC to the second, and searching again keeps it."""
    email, key = await _workspace(console)
    async with _api(console, key) as api:
        assert (await api.post("/v1/emails/", json=_letter("one@customer.example"))).is_success
        later = {"name": "Later", "created_from": "2999-01-01T10:30:15+02:00"}
        saved = await api.put("/v1/emails/saved-searches", json={"searches": [later]})
        assert saved.status_code == 200, saved.text
    tab = await browsing.open(console.api_url)

    def search_again(page: Page) -> None:
        sign_in(page, email)
        page.goto("/emails")
        expect(page.locator("#email-total")).to_have_text("1 email")
        page.get_by_text("Saved searches (1)").click()
        page.get_by_role("link", name="Later").click()
        expect(page.locator("#email-total")).to_have_text("0 emails")
        expect(page.get_by_label("Created from")).to_have_value("2999-01-01T08:30:15")
        page.get_by_role("button", name="Search").click()
        expect(page).to_have_url(re.compile(r"created_from=2999-01-01T08%3A30%3A15"))
        expect(page.locator("#email-total")).to_have_text("0 emails")
        # A time that is none in UTC (past the calendar's end there) is refused, shown as given.
        beyond = "9999-12-31T23:59:59-23:00"
        answer = page.goto(f"/emails?created_from={beyond.replace('+', '%2B')}")
        assert answer is not None and answer.status == 200
        expect(page.get_by_label("Created from")).to_have_value(beyond)

    await tab.do(search_again)
    await tab.close()


async def test_the_sandbox_fast_forwards_pending_outcomes_and_sends_mail_into_a_forward(
    console: RunningService, browsing: Browsing
) -> None:
    email, key = await _workspace(console)
    async with _api(console, key) as api:
        sent = await api.post("/v1/emails/", json=_letter("complain-after-1h@customer.example"))
        email_id = sent.json()["id"]
        await _settled(api, email_id, ("delivered",))
        domain = (await api.get("/v1/domains/")).json()[0]
        forward = await api.post(
            "/v1/forwards/",
            json={
                "source_email": "support@shop.example",
                "domain_id": domain["id"],
                "destination_emails": ["team@customer.example"],
            },
        )
        assert forward.status_code == 201, forward.text
    tab = await browsing.open(console.api_url)

    def fast_forward(page: Page) -> None:
        sign_in(page, email)
        page.goto(f"/emails/{email_id}")
        pending = page.locator("#pending-outcomes")
        expect(pending).to_contain_text("complaint from complain-after-1h@customer.example")
        assert re.search(SHOWN_TIME, pending.inner_text())
        page.get_by_role("link", name="Sandbox", exact=True).click()
        expect(page.get_by_role("heading", name="Still to come (1)")).to_be_visible()
        page.get_by_role("button", name="Fast-forward: make them all happen now").click()
        expect(page.get_by_text("The scripted outcomes are due now")).to_be_visible()

        page.locator("#f-inbound-to").select_option("support@shop.example")
        page.locator("#inbound-f-subject").fill("Help, please")
        page.get_by_role("button", name="Send it in").click()
        expect(page.get_by_text("The message was handed to the forward")).to_be_visible()

    await tab.do(fast_forward)
    async with _api(console, key) as api:
        with trio.fail_after(30):  # the outcome worker's next pass (15 s at most)
            while True:
                found = (await api.get(f"/v1/emails/{email_id}")).json()
                if "complained" in [e["event_type"] for e in found["events"]]:
                    break
                await trio.sleep(0.2)
        with trio.fail_after(15):
            while True:
                if (await api.get("/v1/emails/", params={"source": "forward"})).json():
                    break
                await trio.sleep(0.05)

    def the_forwarded_copy(page: Page) -> None:
        page.goto("/emails?source=forward")
        expect(page.locator("#email-total")).to_have_text("1 email")
        expect(page.locator("table tbody")).to_contain_text("team@customer.example")

    await tab.do(the_forwarded_copy)
    await tab.close()


async def test_template_and_broadcast_previews_render_html_at_desktop_and_phone_width(
    console: RunningService, browsing: Browsing
) -> None:
    email, key = await _workspace(console)
    html = "<h1>Hello {{name}}</h1><p>Your order ships today.</p>"
    async with _api(console, key) as api:
        template = await api.post(
            "/v1/templates/", json={"name": "Order", "subject": "For {{name}}", "html_body": html}
        )
        assert template.status_code == 201, template.text
        template_id = template.json()["id"]
        listed = (await api.post("/v1/contacts/", json={"name": "Customers"})).json()
        added = await api.post(
            f"/v1/contacts/{listed['id']}/contacts", json={"email": "ann@x.example", "name": "Ann"}
        )
        assert added.status_code == 201
    tab = await browsing.open(console.api_url)

    def previews(page: Page) -> None:
        sign_in(page, email)
        page.goto(f"/templates/{template_id}")
        page.get_by_label("name", exact=True).fill("Zoe")
        frames = page.locator("#template-preview iframe[sandbox]")
        expect(frames).to_have_count(2)
        assert [frames.nth(i).get_attribute("width") for i in range(2)] == ["640", "390"]
        for title in ("desktop", "phone"):
            frame = page.frame_locator(f"#template-preview iframe[title$='{title} width']")
            expect(frame.get_by_role("heading", name="Hello Zoe")).to_be_visible()
        expect(page.locator("#template-preview")).not_to_contain_text("<h1>")

        page.goto(f"/contacts/{listed['id']}")
        page.get_by_label("Subject").fill("News for {{name}}")
        page.get_by_label("HTML body").fill(html)
        for width in ("desktop", "phone"):
            page.get_by_role("button", name=f"Show the HTML at {width} width").click()
            frame = page.frame_locator(f"iframe[name='send-html-{width}']")
            expect(frame.get_by_role("heading", name="Hello Ann")).to_be_visible()
        page.get_by_role("button", name="Preview one message").click()
        expect(page.locator("#send-preview")).to_contain_text("News for Ann")
        expect(page.locator("#send-preview")).not_to_contain_text("<h1>")

    await tab.do(previews)
    await tab.close()
