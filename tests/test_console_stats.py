"""The console's numbers in Chromium: a broadcast's page shows its delivered, bounced, opened
and clicked figures with their rates, and the overview its rates per broadcast and domain."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Page, expect

from postroom.service import RunningService
from tests.harness.browser import Browsing
from tests.harness.console import add_sandbox_domain, admin, sign_in


async def test_a_broadcasts_figures_and_the_overviews_rates(
    console: RunningService, browsing: Browsing, tmp_path: Path
) -> None:
    email = await admin(console, "starter")
    csv = tmp_path / "readers.csv"
    # In the sandbox the address scripts the outcome: `bounce@` bounces, the others arrive.
    csv.write_text(
        "email,name\nann@customer.example,Ann\nbob@customer.example,Bob\n"
        "carl@customer.example,Carl\nbounce@customer.example,Bounce\n"
    )
    tab = await browsing.open(console.api_url)

    def figures(page: Page) -> None:
        sign_in(page, email)
        add_sandbox_domain(page, "news.example")
        page.get_by_role("link", name="Contacts", exact=True).click()
        page.get_by_label("Name").fill("Readers")
        page.get_by_role("button", name="Create").click()
        page.get_by_label("CSV file").set_input_files(str(csv))
        page.get_by_role("button", name="Upload").click()
        expect(page.locator("#import-result")).to_contain_text("Imported 4, skipped 0")
        page.get_by_role("link", name="See the list").click()
        page.get_by_label("Subject").fill("Spring news")
        page.get_by_label("Text body").fill("Hello {{name}}")
        page.get_by_role("button", name="Send to 4 contacts").click()
        expect(page.get_by_role("heading", name="Broadcast: Spring news")).to_be_visible()
        shown = page.locator("#broadcast-figures")
        # The figures come as the sandbox settles each recipient: reload until all four have.
        for _ in range(50):
            if "1 (25.0%) bounced" in re.sub(r"\s+", " ", shown.inner_text()):
                break
            page.wait_for_timeout(200)
            page.reload()
        expect(shown.locator(".card", has_text="delivered")).to_contain_text("3 (75.0%)")
        expect(shown.locator(".card", has_text="bounced")).to_contain_text("1 (25.0%)")
        expect(shown.locator(".card", has_text="opened")).to_contain_text("0 (0.0%)")
        expect(shown.locator(".card", has_text="clicked")).to_contain_text("0 (0.0%)")
        expect(page.locator("#broadcast-progress")).to_contain_text("of 4 sent")

        page.get_by_role("link", name="Overview", exact=True).click()
        expect(page.locator("#rates")).to_contain_text("news.example")
        page.get_by_role("link", name="By broadcast").click()
        row = page.get_by_role("row", name=re.compile("Spring news"))
        expect(row).to_contain_text("3 (75.0%)")
        expect(row).to_contain_text("1 (25.0%)")
        row.get_by_role("link", name="Spring news").click()
        expect(page.get_by_role("heading", name="Broadcast: Spring news")).to_be_visible()

    await tab.do(figures)
    await tab.close()
