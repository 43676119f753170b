"""The web console in a real browser (Chromium, tests/harness/browser.py), on both engines.

Each test is a user's path through the console against the running service, with the
console's Content-Security-Policy enforced by the browser: any violation, or any script
error, fails the test when its tab closes.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

import httpx
import trio
from playwright.sync_api import Page, expect
from trio.testing import MockClock

from engine.accounts import users
from postroom.service import RunningService
from storage import activity, agents
from tests.harness.browser import PASSWORD, Browsing, new_email
from tests.harness.console import add_sandbox_domain, admin, console_routes, resources, sign_in
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.service import REPO

# `POSTROOM_CONSOLE_SCREENSHOT=docs/console.png pytest tests/test_console.py -k first_run`
# writes the README's screenshots of the overview: that file, and beside it `-phone.png`
# (390 px wide, dark colour scheme).
SCREENSHOT = os.environ.get("POSTROOM_CONSOLE_SCREENSHOT")
PAGES = (
    "Overview",
    "Domains",
    "Email log",
    "Webhooks",
    "Suppressions",
    "Contacts",
    "Broadcasts",
    "Templates",
    "API keys",
    "Forwards",
    "Delivery",
    "Team",
    "Activity",
    "Sandbox",
    "Account",
)


async def test_first_run_to_a_delivered_email_in_the_sandbox(
    console: RunningService, browsing: Browsing
) -> None:
    tab = await browsing.open(console.api_url)
    email = new_email()

    def set_up(page: Page) -> str:
        page.goto("/")  # no user yet: the first-run form
        expect(page.get_by_role("heading", name="Welcome to Postroom")).to_be_visible()
        page.get_by_label("Your email").fill(email)
        page.get_by_label("Password").fill("short")
        page.get_by_role("button", name="Create the account").click()
        expect(page.locator("#f-password-error")).to_contain_text("at least 8 characters")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Create the account").click()
        key = page.locator("#new-api-key").inner_text()
        page.get_by_role("link", name="Continue to the console").click()
        expect(page.get_by_text("This workspace is in sandbox mode")).to_be_visible()
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("heading", name="Sign in to Postroom")).to_be_visible()
        page.get_by_label("Email").fill(email)
        page.get_by_label("Password").fill("wrong password")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("wrong email or password")
        sign_in(page, email)
        add_sandbox_domain(page, "shop.example")
        expect(page.get_by_text("hello@shop.example")).to_be_visible()
        return key

    key = await tab.do(set_up)
    assert key.startswith("svc_k_")

    async with httpx.AsyncClient(
        base_url=console.api_url, headers={"Authorization": f"Bearer {key}"}
    ) as client:
        sent = await client.post(
            "/v1/emails/",
            json={
                "from_": {"email": "hello@shop.example"},
                "to": [{"email": "deliver@customer.example"}],
                "subject": "Your receipt",
                "html": "<h1>Thanks!</h1><p>Order 7 is on its way.</p>",
                "text": "Thanks! Order 7 is on its way.",
            },
        )
        assert sent.status_code == 202
        with trio.fail_after(10):
            while True:
                found = (await client.get(f"/v1/emails/{sent.json()['id']}")).json()
                if found["status"] == "delivered":
                    break
                await trio.sleep(0.05)

    def see_it(page: Page) -> None:
        page.get_by_role("link", name="Email log").click()
        page.get_by_role("link", name="Your receipt").click()
        timeline = page.locator("ol.timeline")
        expect(timeline).to_contain_text("delivered")
        expect(timeline).to_contain_text("accepted by the Postroom sandbox")
        frame = page.frame_locator("iframe.preview")
        expect(frame.get_by_role("heading", name="Thanks!")).to_be_visible()
        page.get_by_role("link", name=re.compile("to deliver@customer.example")).click()
        expect(page.get_by_role("heading", name="Your receipt")).to_be_visible()
        expect(page.locator("dd").filter(has_text="pass")).to_be_visible()
        expect(page.get_by_role("row", name=re.compile("DKIM-Signature"))).to_be_visible()
        for name in PAGES:  # every page of the console, under its CSP
            page.get_by_role("link", name=name, exact=True).click()
            expect(page.locator("h1")).to_be_visible()
        page.get_by_role("link", name="Overview", exact=True).click()
        expect(page.locator(".card").first).to_contain_text("1")
        if SCREENSHOT:
            page.screenshot(path=str(REPO / SCREENSHOT), full_page=True)
            page.set_viewport_size({"width": 390, "height": 844})
            page.emulate_media(color_scheme="dark")
            phone = (REPO / SCREENSHOT).with_name(Path(SCREENSHOT).stem + "-phone.png")
            page.screenshot(path=str(phone), full_page=False)

    await tab.do(see_it)
    await tab.close()


async def test_a_dead_webhook_delivery_is_replayed_from_its_page(
    console: RunningService, browsing: Browsing, https_receiver: HttpsReceiver, clock: MockClock
) -> None:
    email = await admin(console, sandboxed=False)  # a sandbox captures webhooks instead
    tab = await browsing.open(console.api_url)

    def create_hook(page: Page) -> None:
        sign_in(page, email)
        page.get_by_role("link", name="Webhooks", exact=True).click()
        page.get_by_label("HTTPS URL").fill(https_receiver.url)
        page.get_by_role("button", name="Add the webhook").click()
        for _ in range(2):
            page.get_by_role("button", name="Send a test event").click()
            expect(page.get_by_role("status")).to_contain_text("sample email.delivered")

    https_receiver.respond(500)
    await tab.do(create_hook)
    # The 8th failure is final: 1 m, 5 m, 30 m, 2 h, 6 h, 24 h and 48 h after each failure.
    for attempt, delay in enumerate((60, 300, 1800, 7200, 21600, 86400, 172800), start=1):
        await https_receiver.wait_for_requests(2 * attempt)
        # Both failures are recorded (with their next retry) before time moves on.
        with trio.fail_after(10):
            while True:
                behind = await console.runtime.db.read(
                    lambda tx, n=attempt: tx.value(
                        "SELECT COUNT(*) FROM webhook_deliveries WHERE attempt < :n", {"n": n}
                    )
                )
                if not behind:
                    break
                await trio.sleep(0.05)
        clock.jump(delay + 1)
    await https_receiver.wait_for_requests(16)
    with trio.fail_after(10):  # both final failures recorded before the page is read
        while True:
            alive = await console.runtime.db.read(
                lambda tx: tx.value(
                    "SELECT COUNT(*) FROM webhook_deliveries WHERE status <> 'dead'"
                )
            )
            if not alive:
                break
            await trio.sleep(0.05)
    https_receiver.respond(200)

    def replay(page: Page) -> None:
        page.reload()
        dead = page.get_by_role("link", name="dead (2)")
        dead.click()
        row = page.get_by_role("row", name=re.compile("email.delivered")).first
        expect(row).to_contain_text("dead")
        row.get_by_role("button", name="Replay").click()
        expect(page.get_by_role("status")).to_contain_text("queued again")

    await tab.do(replay)
    await https_receiver.wait_for_requests(17)

    def replay_the_rest(page: Page) -> None:
        page.once("dialog", lambda dialog: dialog.accept())  # "Queue every dead delivery…?"
        page.get_by_role("button", name="Replay all 1 dead deliveries").click()

    await tab.do(replay_the_rest)
    await https_receiver.wait_for_requests(18)

    def delivered(page: Page) -> None:
        page.get_by_role("link", name="delivered", exact=True).click()
        expect(page.get_by_role("row", name=re.compile("email.delivered"))).to_have_count(2)

    with trio.fail_after(10):
        while True:
            try:
                await tab.do(delivered)
                break
            except AssertionError:
                await trio.sleep(0.1)
    await tab.close()


async def test_a_csv_upload_and_a_bulk_send_with_its_preview(
    console: RunningService, browsing: Browsing, tmp_path: Path
) -> None:
    email = await admin(console, "starter")
    csv = tmp_path / "customers.csv"
    csv.write_text(
        "email,name,city\nann@customer.example,Ann,Lyon\nbob@customer.example,Bob,Oslo\n"
        "bounce@customer.example,Bounce,Rome\nnot an address,X,Y\n"
    )
    tab = await browsing.open(console.api_url)

    def bulk_send(page: Page) -> None:
        sign_in(page, email)
        add_sandbox_domain(page, "news.example")
        page.get_by_role("link", name="Contacts", exact=True).click()
        page.get_by_label("Name").fill("Customers")
        page.get_by_role("button", name="Create").click()
        page.get_by_label("CSV file").set_input_files(str(csv))
        page.get_by_role("button", name="Upload").click()
        expect(page.locator("#import-result")).to_contain_text("Imported 3, skipped 0")
        expect(page.locator("#import-result")).to_contain_text("row 5")
        page.get_by_role("link", name="See the list").click()
        page.get_by_label("Subject").fill("News for {{name}}")
        page.get_by_label("Text body").fill("Hello {{name}} in {{city}}")
        page.get_by_role("button", name="Preview one message").click()
        preview = page.locator("#send-preview")
        expect(preview).to_contain_text("ann@customer.example")
        expect(preview).to_contain_text("News for Ann")
        expect(preview).to_contain_text("Hello Ann in Lyon")
        page.get_by_role("button", name="Send to 3 contacts").click()
        expect(page.get_by_role("heading", name="Broadcast: News for {{name}}")).to_be_visible()
        expect(page.locator("#broadcast-progress")).to_contain_text("Queued 3 and skipped 0 of 3")
        expect(page.locator("#broadcast-progress")).to_contain_text("sent")
        page.get_by_role("link", name="Its emails in the log").click()
        expect(page.get_by_role("link", name="News for Bob")).to_be_visible()

    await tab.do(bulk_send)
    await tab.close()


async def test_a_csp_violation_fails_the_browser_check(
    console: RunningService, browsing: Browsing
) -> None:
    tab = await browsing.open(console.api_url)

    def inline_script(page: Page) -> None:
        page.goto("/setup")
        page.evaluate(
            "() => { const s = document.createElement('script');"
            " s.textContent = 'window.ran = true'; document.body.appendChild(s); }"
        )
        page.wait_for_timeout(100)
        assert page.evaluate("() => window.ran === undefined")

    await tab.do(inline_script)
    try:
        await tab.close()
    except AssertionError as refused:
        assert "CSP violation" in str(refused)
    else:
        raise AssertionError("the inline script ran or went unreported")


async def test_changing_the_password_signs_in_with_the_new_one(
    console: RunningService, browsing: Browsing
) -> None:
    email = await admin(console)
    tab = await browsing.open(console.api_url)
    new_password = "a different long passphrase"

    def change(page: Page) -> None:
        sign_in(page, email)
        page.get_by_role("link", name="Account", exact=True).click()
        page.get_by_label("Current password").fill("not my password")
        page.get_by_label("New password").fill(new_password)
        page.get_by_role("button", name="Change the password").click()
        expect(page.locator("#f-current_password-error")).to_contain_text("wrong password")
        page.get_by_label("Current password").fill(PASSWORD)
        page.get_by_label("New password").fill(new_password)
        page.get_by_role("button", name="Change the password").click()
        expect(page.get_by_role("status")).to_contain_text("Password changed")
        page.get_by_role("button", name="Sign out").click()
        page.get_by_label("Email").fill(email)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("wrong email or password")
        page.get_by_label("Password").fill(new_password)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()

    await tab.do(change)
    await tab.close()


async def test_the_mcp_policy_is_set_from_the_account_page_and_logged(
    console: RunningService, browsing: Browsing
) -> None:
    email = new_email()
    created = await users.create_account(console.runtime, email, PASSWORD, "business", True)
    tab = await browsing.open(console.api_url)

    def set_policy(page: Page) -> None:
        sign_in(page, email)
        page.get_by_role("link", name="Account", exact=True).click()
        expect(page.get_by_label("Policy")).to_have_value("read")  # the default
        page.get_by_label("Most recipients of one agent action").fill("0")
        page.get_by_role("button", name="Save the MCP policy").click()
        expect(page.locator("#f-max_recipients-error")).to_contain_text("between 1 and")
        page.get_by_label("Policy").select_option("send")
        page.get_by_label("Most recipients of one agent action").fill("25")
        page.get_by_role("button", name="Save the MCP policy").click()
        expect(page.get_by_role("status")).to_contain_text("MCP policy saved")
        expect(page.get_by_label("Policy")).to_have_value("send")

    await tab.do(set_policy)
    await tab.close()
    saved = await console.runtime.db.read(agents.get_policy, created.workspace_id)
    assert saved is not None and (saved.policy, saved.max_recipients) == ("send", 25)
    log, _ = await console.runtime.db.read(
        activity.newest, created.workspace_id, datetime(2000, 1, 1, tzinfo=UTC), None, 100
    )
    assert [e.action for e in log].count("mcp_policy.updated") == 1  # the refused one is not


# Field names the console's forms use, each given a value no form accepts.
_ODD_FORM = {
    name: "\x00" + "x" * 3000
    for name in [
        "name",
        "email",
        "password",
        "plan",
        "url",
        "events",
        "query",
        "range",
        "category",
        "page",
        "limit",
        "status",
        "domain",
        "subject",
        "html",
        "text",
        "to",
        "from_",
        "enabled",
        "open_tracking",
        "click_tracking",
        "target_email",
        "note",
        "workspace_id",
        "current_password",
        "new_password",
        "variables",
        "csv",
        "list_id",
        "template_id",
    ]
}


async def test_every_console_page_answers_bad_input_without_a_server_error(
    console: RunningService,
) -> None:
    email = new_email()
    created = await users.create_account(console.runtime, email, PASSWORD, "business", admin=True)
    origin = {"Origin": console.api_url}
    key = {"Authorization": f"Bearer {created.api_key}"}
    async with httpx.AsyncClient(base_url=console.api_url, headers=key) as api:
        ids = await resources(api)
    routes = console_routes(ids)
    assert len(routes) > 40
    async with httpx.AsyncClient(base_url=console.api_url) as client:
        login = await client.post("/v1/auth/login", json={"email": email, "password": PASSWORD})
        assert login.status_code == 200
        for method, path in routes:
            if path in ("/logout", "/account/password"):
                continue  # signs this client out, or counts against the login limits
            for data in ({}, _ODD_FORM):
                if method == "GET":
                    query = {name: "-1\x00" + value[-200:] for name, value in data.items()}
                    answer = await client.get(path, params=query)
                else:
                    answer = await client.post(path, data=data, headers=origin)
                assert answer.status_code < 500, (method, path, answer.text[:300])
        # An unsafe request from another origin is refused before any page runs.
        refused = await client.post("/domains", data={"name": "a.example"})
        assert refused.status_code == 403


async def test_the_overview_shows_the_delivery_forecast(
    console: RunningService, browsing: Browsing
) -> None:
    email = new_email()
    created = await users.create_account(console.runtime, email, PASSWORD, "business", admin=True)
    tab = await browsing.open(console.api_url)

    def set_up(page: Page) -> None:
        sign_in(page, email)
        add_sandbox_domain(page, "shop.example")

    await tab.do(set_up)
    headers = {"Authorization": f"Bearer {created.api_key}"}
    async with httpx.AsyncClient(base_url=console.api_url, headers=headers) as client:
        policy = {"match": "customer.example", "per_hour": 1}
        assert (await client.post("/v1/delivery/policies", json=policy)).status_code == 201
        batch = [
            {
                "from_": {"email": "hello@shop.example"},
                "to": [{"email": f"deliver+{i}@customer.example"}],
                "subject": f"Order {i}",
                "text": "On its way.",
            }
            for i in range(3)
        ]
        sent = await client.post("/v1/emails/batch", json=batch)
        assert sent.status_code == 202, sent.text
        with trio.fail_after(10):  # one goes this hour, two wait for the next ones
            while True:
                if (await client.get("/v1/delivery/forecast")).json()["waiting"] == 2:
                    break
                await trio.sleep(0.05)

    def see_it(page: Page) -> None:
        page.get_by_role("link", name="Overview", exact=True).click()
        expect(page.get_by_role("heading", name="Forecast")).to_be_visible()
        row = page.get_by_role("row", name=re.compile("customer.example"))
        expect(row.last).to_contain_text("1 per hour (1 used)")
        expect(page.get_by_text("the last waiting message should leave")).to_be_visible()

    await tab.do(see_it)
    await tab.close()
