"""The web console as browser tests use it: an administrator made as the CLI makes one, signing
in and out, adding a domain in the sandbox, and every console route with one of each resource
its pages name by id."""

from __future__ import annotations

import re
import uuid

import httpx
from playwright.sync_api import Page, expect
from quart_trio import QuartTrio

import console as console_package
from api.converters import IdConverter
from engine.accounts import users
from postroom.service import RunningService
from storage import sandbox as sandbox_store
from tests.harness.browser import PASSWORD, new_email

# The methods `console_routes` lists for each route.
_TRIED = {"GET", "POST"}


async def admin(console: RunningService, plan: str = "business", *, sandboxed: bool = True) -> str:
    """An administrator created as `postroom accounts create` does; their email. The console
    runs with POSTROOM_SANDBOX=on: with `sandboxed=False` their workspace leaves the sandbox,
    so that what it sends (webhooks) really leaves the machine."""
    email = new_email()
    created = await users.create_account(console.runtime, email, PASSWORD, plan, admin=True)
    if not sandboxed:
        await console.runtime.db.write(sandbox_store.set_sandboxed, created.workspace_id, False)
    return email


def sign_in(page: Page, email: str) -> None:
    page.goto("/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def add_sandbox_domain(page: Page, name: str) -> None:
    page.get_by_role("link", name="Domains", exact=True).click()
    page.get_by_label("Domain name").fill(name)
    page.get_by_role("button", name="Add the domain").click()
    expect(page.get_by_role("heading", name=re.compile(name))).to_contain_text("verified")


def console_routes(ids: dict[str, str]) -> list[tuple[str, str]]:
    """(method, path) of every console page, path ids filled from `ids` by name, else with a
    UUID that names nothing."""
    app = QuartTrio(__name__)
    app.url_map.converters["id"] = IdConverter
    console_package.install(app)
    found: list[tuple[str, str]] = []
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("console.") or rule.endpoint == "console.static":
            continue
        path = re.sub(r"<id:(\w+)>", lambda m: ids.get(m.group(1), str(uuid.uuid4())), rule.rule)
        path = re.sub(r"<(?:\w+:)?\w+>", "nothing-here", path)
        found.extend((method, path) for method in sorted(rule.methods or ()) if method in _TRIED)
    return found


async def resources(client: httpx.AsyncClient) -> dict[str, str]:
    """One of each resource the console's pages name by id, made through the API."""
    domain = (await client.post("/v1/domains/", json={"name": "odd.example"})).json()
    await client.post(f"/v1/sandbox/domains/{domain['id']}/verify")
    await client.post("/v1/senders/", json={"email": "hello@odd.example"})
    sent = await client.post(
        "/v1/emails/",
        json={
            "from_": {"email": "hello@odd.example"},
            "to": [{"email": "deliver@customer.example"}],
            "subject": "Odd",
            "text": "odd",
        },
    )
    hook = await client.post(
        "/v1/webhooks/", json={"url": "https://127.0.0.1:9/hook", "events": ["email.delivered"]}
    )
    listed = await client.post("/v1/contacts/", json={"name": "Odd"})
    template = await client.post("/v1/templates/", json={"name": "Odd", "subject": "Hi"})
    made = {
        "domain_id": domain,
        "email_id": sent.json(),
        "webhook_id": hook.json(),
        "list_id": listed.json(),
        "template_id": template.json(),
    }
    assert all("id" in found for found in made.values()), {
        k: v for k, v in made.items() if "id" not in v
    }
    return {name: str(found["id"]) for name, found in made.items()}


def sign_out(page: Page) -> None:
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in to Postroom")).to_be_visible()
