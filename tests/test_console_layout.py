"""Every console page at a desktop's and a phone's width, in light and dark colour schemes, in
a real browser (Chromium, tests/harness/browser.py): no page scrolls sideways at 390 px, axe-core
finds nothing serious or critical, and the phone's navigation folds behind a menu button. Also
`/docs` under axe-core, the favicon, and the console's own 404 page for unknown URLs.

One browser and one tab visit the pages in turn; each page is loaded once and checked in the
four combinations (a viewport and `prefers-color-scheme` change without a reload).
"""

from __future__ import annotations

from importlib import resources as package_files
from typing import Any, Literal

import httpx
import pytest
import trio
from playwright.sync_api import Page, ViewportSize, expect

from engine.accounts import users
from engine.delivery.incidents import pause_for
from postroom.service import RunningService
from storage import incidents
from storage.incidents import Hit
from tests.harness.browser import PASSWORD, Browsing, new_email
from tests.harness.console import console_routes, resources, sign_in

DESKTOP: ViewportSize = {"width": 1366, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}
SCHEMES: tuple[Literal["light", "dark"], ...] = ("light", "dark")
# axe-core, as the axe-playwright-python package ships it (a dev dependency).
AXE = (package_files.files("axe_playwright_python") / "axe.min.js").read_text()
# The innermost elements that reach past the window's right edge, to say what is too wide.
TOO_WIDE = """[...document.querySelectorAll("body *")]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
  .filter(e => ![...e.children].some(c => c.getBoundingClientRect().right > window.innerWidth + 1))
  .slice(0, 3).map(e => e.outerHTML.slice(0, 120))"""
# Buttons of the page past the window's right edge (scrolled out of sight or cut off).
CLIPPED = """[...document.querySelectorAll("main button")]
  .filter(b => b.offsetParent !== null && b.getBoundingClientRect().right > window.innerWidth)
  .map(b => b.textContent.trim())"""
# Not pages: the framed email and preview HTML, a message's raw source, the CSV export.
NOT_PAGES = ("/html", "/source", "/preview.html", "/export")

# Layout is the browser's and the stylesheet's, the same on either engine.
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def serious_findings(page: Page) -> list[str]:
    """axe-core's serious and critical findings on the page as it is now."""
    if not page.evaluate("typeof axe !== 'undefined'"):
        page.evaluate(AXE)
    found: list[dict[str, Any]] = page.evaluate("axe.run(document).then(r => r.violations)")
    return [
        f"{v['id']} ({v['impact']}, {len(v['nodes'])}): {[n['target'] for n in v['nodes']][:8]}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


def check_everywhere(page: Page) -> list[str]:
    """The page at both widths in both schemes: what is wrong with it, if anything."""
    wrong: list[str] = []
    for viewport in (DESKTOP, PHONE):
        page.set_viewport_size(viewport)
        for scheme in SCHEMES:
            page.emulate_media(color_scheme=scheme)
            where = f"{page.url} at {viewport['width']} px, {scheme}"
            width = page.evaluate("document.scrollingElement.scrollWidth")
            inner = page.evaluate("window.innerWidth")
            if width > inner:
                wrong.append(f"{where}: {width} px wide: {page.evaluate(TOO_WIDE)}")
            if clipped := page.evaluate(CLIPPED):
                wrong.append(f"{where}: buttons out of sight: {clipped}")
            wrong.extend(f"{where}: {finding}" for finding in serious_findings(page))
    return wrong


async def _more_resources(api: httpx.AsyncClient) -> dict[str, str]:
    """Besides `resources`: a suppression (a table of its own), a destination policy and a
    warm-up ramp (the Delivery page's tables, and their own pages), a broadcast and the
    sandbox's captured message."""
    added = await api.post("/v1/suppressions/", json={"email": "someone-long@customer.example"})
    assert added.status_code == 201, added.text
    [listed] = (await api.get("/v1/contacts/")).json()
    await api.post(f"/v1/contacts/{listed['id']}/contacts", json={"email": "ann@customer.example"})
    [sender] = (await api.get("/v1/senders/")).json()
    policy = {"match": "*.outlook.com", "per_minute": 300, "per_day": 50000}
    made_policy = await api.post("/v1/delivery/policies", json=policy)
    assert made_policy.status_code == 201, made_policy.text
    ramp = {"domain_id": sender["domain_id"], "first_day": 200, "target_per_day": 20000}
    made_ramp = await api.post("/v1/delivery/ramps", json=ramp)
    assert made_ramp.status_code == 201, made_ramp.text
    sent = await api.post(
        f"/v1/contacts/{listed['id']}/send",
        json={
            "contact_list_id": listed["id"],
            "sender_address_id": sender["id"],
            "subject": "News",
            "text": "News for {{email}}.",
        },
    )
    assert sent.status_code == 200, sent.text
    found = {"policy_id": made_policy.json()["id"], "ramp_id": made_ramp.json()["id"]}
    with trio.fail_after(20):
        while "message_id" not in found:
            broadcasts = (await api.get("/v1/broadcasts/")).json()
            captured = (await api.get("/v1/sandbox/messages")).json()["items"]
            if broadcasts and captured:
                found |= {"broadcast_id": broadcasts[0]["id"], "message_id": captured[0]["id"]}
            await trio.sleep(0.1)
    return found


@sqlite_only
async def test_every_page_fits_a_phone_and_passes_axe_in_both_schemes(
    console: RunningService, browsing: Browsing
) -> None:
    email = new_email()
    created = await users.create_account(console.runtime, email, PASSWORD, "business", admin=True)
    key = {"Authorization": f"Bearer {created.api_key}"}
    async with httpx.AsyncClient(base_url=console.api_url, headers=key) as api:
        ids = await resources(api)
        ids |= await _more_resources(api)
    # A destination incident (the Delivery page's table of them), as a delivery round records it.
    hit = Hit("blocked", "odd.example", "550 5.7.1 Service unavailable; client host blocked")
    await console.runtime.db.write(
        incidents.record_round,
        "blocked.example",
        {(created.workspace_id, ids["domain_id"]): hit},
        set(),
        console.runtime.clock.now(),
        pause_for,
    )
    paths = [
        path
        for method, path in console_routes(ids)
        if method == "GET" and not path.endswith(NOT_PAGES) and path not in ("/login", "/setup")
    ]
    assert len(paths) > 20
    tab = await browsing.open(console.api_url)

    def signed_out(page: Page) -> list[str]:
        page.goto("/login")
        return check_everywhere(page)

    wrong = await tab.do(signed_out)
    await tab.do(lambda page: sign_in(page, email))
    for path in paths:

        def visit(page: Page, path: str = path) -> list[str]:
            page.goto(path)
            return check_everywhere(page)

        wrong.extend(await tab.do(visit))

    def dkim_value(page: Page) -> float:
        page.goto(f"/domains/{ids['domain_id']}")
        page.set_viewport_size(PHONE)
        row = page.get_by_role("row").filter(has_text="dkim")
        box = row.locator("code").nth(1).bounding_box()  # the host, then the value
        assert box is not None
        return box["width"]

    # The DKIM key gets the phone's width, not a column of a few characters.
    assert await tab.do(dkim_value) > PHONE["width"] * 0.7
    await tab.close()
    assert wrong == [], "\n".join(wrong)


@sqlite_only
async def test_the_phone_navigation_folds_behind_a_menu_button(
    console: RunningService, browsing: Browsing
) -> None:
    email = new_email()
    await users.create_account(console.runtime, email, PASSWORD, "business", admin=True)
    tab = await browsing.open(console.api_url)

    def fold(page: Page) -> None:
        sign_in(page, email)
        page.set_viewport_size(PHONE)
        page.reload()
        menu = page.get_by_role("button", name="Menu")
        nav = page.get_by_role("navigation", name="Console")
        expect(menu).to_have_attribute("aria-expanded", "false")
        expect(nav.get_by_role("link", name="Domains")).to_be_hidden()
        # The header and the folded menu leave the phone's screen to the page.
        heading = page.get_by_role("heading", name="Overview").bounding_box()
        assert heading is not None and heading["y"] < 180, heading
        menu.click()
        expect(menu).to_have_attribute("aria-expanded", "true")
        nav.get_by_role("link", name="Domains").click()
        expect(page.get_by_role("heading", name="Domains", exact=True)).to_be_visible()
        expect(page.get_by_role("button", name="Menu")).to_have_attribute("aria-expanded", "false")
        # At a desktop's width there is no menu button: every link shows.
        page.set_viewport_size(DESKTOP)
        expect(page.get_by_role("button", name="Menu")).to_be_hidden()
        expect(nav.get_by_role("link", name="Templates")).to_be_visible()

    await tab.do(fold)
    await tab.close()


@sqlite_only
async def test_without_scripts_the_phone_shows_the_navigation_unfolded(
    console: RunningService, browsing: Browsing
) -> None:
    """The Menu button needs JavaScript: where none runs, a phone gets every link instead of
    a button that opens nothing."""
    email = new_email()
    await users.create_account(console.runtime, email, PASSWORD, "business", admin=True)
    tab = await browsing.open(console.api_url, scripts=False)

    def unfolded(page: Page) -> None:
        page.set_viewport_size(PHONE)
        sign_in(page, email)
        expect(page.get_by_role("button", name="Menu")).to_be_hidden()
        nav = page.get_by_role("navigation", name="Console")
        nav.get_by_role("link", name="Domains").click()
        expect(page.get_by_role("heading", name="Domains", exact=True)).to_be_visible()
        expect(page.get_by_role("button", name="Sign out")).to_be_visible()

    await tab.do(unfolded)
    await tab.close()


@sqlite_only
async def test_the_api_docs_pass_axe(console: RunningService, browsing: Browsing) -> None:
    tab = await browsing.open(console.api_url)

    def docs(page: Page) -> list[str]:
        page.goto("/docs")
        # Swagger UI is a megabyte of script: on a busy 2-core machine it renders in seconds.
        expect(page.locator(".opblock-tag").first).to_be_visible(timeout=30_000)
        assert page.evaluate("document.documentElement.lang") == "en"
        assert page.locator("meta[name=viewport]").count() == 1
        # Operations grouped by resource, not one "default" group.
        expect(page.locator(".opblock-tag", has_text="emails")).to_be_visible()
        expect(page.locator(".opblock-tag", has_text="default")).to_have_count(0)
        return serious_findings(page)

    found = await tab.do(docs)
    await tab.close()
    assert found == [], "\n".join(found)


@sqlite_only
async def test_unknown_console_urls_get_the_console_404_and_the_favicon_is_served(
    console: RunningService, browsing: Browsing
) -> None:
    await users.create_account(console.runtime, new_email(), PASSWORD, "business", admin=True)
    async with httpx.AsyncClient(base_url=console.api_url) as client:
        icon = await client.get("/favicon.ico")
        assert icon.status_code == 200
        assert icon.headers["Content-Type"].startswith("image/svg+xml")
        assert "max-age=31536000" in icon.headers["Cache-Control"]
        assert icon.content.startswith(b"<svg")
        # An API client still gets the API's JSON error.
        api = await client.get("/v1/nothing-here")
        assert api.status_code == 404 and api.json()["code"] == "not_found"
        html = await client.get("/nothing-here", headers={"Accept": "text/html"})
        assert html.status_code == 404
        assert "text/html" in html.headers["Content-Type"]
        assert "Content-Security-Policy" in html.headers
    tab = await browsing.open(console.api_url)

    def lost(page: Page) -> None:
        answer = page.goto("/no/such/page")
        assert answer is not None and answer.status == 404
        expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
        page.get_by_role("link", name="Overview").click()
        expect(page.get_by_role("heading", name="Sign in to Postroom")).to_be_visible()

    await tab.do(lost)
    await tab.close()
