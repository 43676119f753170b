"""Header fields of a send request: a line break or control character in any text that
becomes a header line is refused before anything is queued (422 at send, invalid at
validate, an error entry in a batch), and a tracked link holding one never reaches a
Location header."""

from __future__ import annotations

import email
import email.policy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.sending.tracking import Links
from tests.harness.broadcasts import body as bulk_body
from tests.harness.broadcasts import sender_id
from tests.harness.contacts import add_contact, create_list
from tests.harness.dns_server import DnsServer
from tests.harness.sending import SENDER, message, ready_account, route_mail, wait_for_status
from tests.harness.service import PUBLIC_URL, Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.templates import create_template

BAD = {
    "CR": "\r",
    "LF": "\n",
    "CRLF": "\r\nBcc: eve@evil.example",
    "SOH": "\x01",
    "DEL": "\x7f",
    "VT": "\x0b",
    "NEL": "\x85",  # a C1 control, and a line end to some readers
    "LS": "\u2028",
}
GOOD_RECIPIENT = "ann@customer.example"


def _address(address: str, name: str) -> dict[str, str]:
    return {"email": address, "name": name}


def _attachment(filename: str = "a.txt", content_type: str = "text/plain") -> dict[str, str]:
    return {"filename": filename, "content_base64": "aGk=", "content_type": content_type}


@dataclass(frozen=True)
class Case:
    """A send body's fields holding some text, where errors point, and validate's field."""

    changes: dict[str, Any]
    loc: list[str | int]
    issue_field: str


CASES: dict[str, Callable[[str], Case]] = {
    "subject": lambda t: Case({"subject": f"Hi{t}there"}, ["subject"], "content"),
    "from name": lambda t: Case(
        {"from_": _address(SENDER, f"Hello{t}")}, ["from_", "name"], "from"
    ),
    "to name": lambda t: Case(
        {"to": [_address(GOOD_RECIPIENT, f"Ann{t}")]}, ["to", 0, "name"], "to"
    ),
    "cc name": lambda t: Case(
        {"cc": [_address("cy@customer.example", f"Cy{t}")]}, ["cc", 0, "name"], "to"
    ),
    "bcc name": lambda t: Case(
        {"bcc": [_address("bo@customer.example", f"Bo{t}")]}, ["bcc", 0, "name"], "to"
    ),
    "reply_to name": lambda t: Case(
        {"reply_to": _address("help@customer.example", f"Help{t}")},
        ["reply_to", "name"],
        "from",
    ),
    "tag": lambda t: Case({"tags": ["ok", f"spring{t}"]}, ["tags", 1], "content"),
    "header value": lambda t: Case(
        {"headers": {"X-Campaign": f"spring{t}"}}, ["headers", "X-Campaign"], "content"
    ),
    "header name": lambda t: Case(
        {"headers": {f"X-Cam{t}paign": "spring"}}, ["headers", f"X-Cam{t}paign"], "content"
    ),
    "attachment filename": lambda t: Case(
        {"attachments": [_attachment(filename=f"a{t}.txt")]},
        ["attachments", 0, "filename"],
        "content",
    ),
    "attachment content type": lambda t: Case(
        {"attachments": [_attachment(content_type=f"text/plain{t}")]},
        ["attachments", 0, "content_type"],
        "content",
    ),
}


async def test_control_characters_in_any_header_field_are_refused_before_queuing(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    post = account.client.post
    for field, case in CASES.items():
        # The field itself is fine: only the character is refused.
        fine = {**message(GOOD_RECIPIENT), **case("!").changes}
        assert (await post("/v1/emails/validate", json=fine)).json()["valid"], field
        refused_bodies = []
        for name, bad in BAD.items():
            where = f"{field}, {name}"
            body = {**message(GOOD_RECIPIENT), **case(bad).changes}
            sent = await post("/v1/emails/", json=body)
            assert sent.status_code == 422, (where, sent.text)
            error = sent.json()
            assert error["code"] == "validation_error", where
            assert error["errors"][0]["loc"] == ["body", *case(bad).loc], where

            checked = (await post("/v1/emails/validate", json=body)).json()
            assert checked["valid"] is False and checked["can_send"] is False, where
            assert case(bad).issue_field in [i["field"] for i in checked["issues"]], where
            refused_bodies.append((body, error["detail"]))

        batch = await post("/v1/emails/batch", json=[fine, *(body for body, _ in refused_bodies)])
        assert batch.status_code == 202, field
        accepted, *refused = batch.json()
        assert accepted["status"] == "queued", field
        for entry, (_, detail) in zip(refused, refused_bodies, strict=True):
            assert entry["status"] == "error" and entry["id"] is None, field
            assert entry["rejection_reason"] == detail, field

    # Only the one good entry of each batch was stored.
    listed = (await account.client.get("/v1/emails/", params={"limit": 100})).json()
    assert len(listed) == len(CASES)


async def test_tab_is_allowed_in_header_text(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    body = message(GOOD_RECIPIENT, subject="Order\t1042", tags=["a\tb"], headers={"X-Note": "x\ty"})
    sent = await account.client.post("/v1/emails/", json=body)
    assert sent.status_code == 202, sent.text
    [received] = await smtp_sink.wait_for_messages(1)
    parsed = email.message_from_bytes(received.data, policy=email.policy.default)
    assert parsed["Subject"] == "Order\t1042"
    assert (await wait_for_status(account, sent.json()["id"]))["status"] == "delivered"


async def test_a_template_variable_cannot_inject_a_header_through_the_subject(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    template = await create_template(
        account, subject="Order {{order}} shipped", text_body="Your order {{order}}."
    )
    body = {
        "from_": {"email": SENDER},
        "to": [{"email": GOOD_RECIPIENT}],
        "template_id": template["id"],
        "variables": {"order": "1042\r\nBcc: eve@evil.example\r\nX-Injected: yes"},
    }
    assert (await account.client.post("/v1/emails/validate", json=body)).json()["valid"]
    sent = await account.client.post("/v1/emails/", json=body)
    assert sent.status_code == 202, sent.text
    [received] = await smtp_sink.wait_for_messages(1)
    assert received.rcpt_to == (GOOD_RECIPIENT,)
    parsed = email.message_from_bytes(received.data, policy=email.policy.default)
    assert parsed["Bcc"] is None and parsed["X-Injected"] is None
    assert parsed["Subject"] == "Order 1042 Bcc: eve@evil.example X-Injected: yes shipped"
    assert (await wait_for_status(account, sent.json()["id"]))["status"] == "delivered"


async def _enable_click_tracking(account: Account) -> None:
    domain = (await account.client.get("/v1/domains/")).json()[0]
    patched = await account.client.patch(
        f"/v1/domains/{domain['id']}", json={"click_tracking": True}
    )
    assert patched.json()["click_tracking"]


async def test_a_link_with_a_control_character_is_not_tracked(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    await _enable_click_tracking(account)
    route_mail(dns_server, "customer.example")
    html = (
        '<p><a href="https://example.com/ok">fine</a>'
        '<a href="https://example.com/x\r\nSet-Cookie: a=b">split</a>'
        '<a href="https://example.com/\x01y">odd</a></p>'
    )
    sent = await account.client.post("/v1/emails/", json=message(GOOD_RECIPIENT, html=html))
    assert sent.status_code == 202
    [received] = await smtp_sink.wait_for_messages(1)
    parsed = email.message_from_bytes(received.data, policy=email.policy.default)
    part = parsed.get_body(("html",))
    assert part is not None
    delivered = part.get_content()
    hrefs = re.findall(r'href="([^"]*)"', delivered)
    assert len(hrefs) == 3
    assert hrefs[0].startswith(f"{PUBLIC_URL}/t/c/")  # tracking is on
    assert hrefs[1].startswith("https://example.com/x") and "Set-Cookie" in hrefs[1]
    assert hrefs[2] == "https://example.com/\x01y"
    # The tracked link still works.
    jump = await service.client().get(hrefs[0].removeprefix(PUBLIC_URL))
    assert jump.status_code == 302 and jump.headers["location"] == "https://example.com/ok"


async def test_a_click_on_a_url_with_a_control_character_is_400_not_500(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    # A message sent before such links were left untracked can still carry one: its token
    # is signed with the service's key like any other.
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    sent = (await account.client.post("/v1/emails/", json=message(GOOD_RECIPIENT))).json()
    links = Links(PUBLIC_URL, service.running.runtime.secret_key, sent["id"], GOOD_RECIPIENT)
    public = service.client()
    for bad in ("\r\nSet-Cookie: a=b", "\n", "\r", "\x01", "\x7f"):
        click = links.click(f"https://example.com/a{bad}b")
        response = await public.get(click.removeprefix(PUBLIC_URL))
        assert response.status_code == 400, repr(bad)
        assert response.json()["code"] == "invalid_link"
        assert "set-cookie" not in response.headers
    events = (await account.client.get(f"/v1/emails/{sent['id']}/events")).json()
    assert all(e["event_type"] != "clicked" for e in events)


async def test_a_sender_name_with_a_line_break_is_refused(service: Service) -> None:
    account = await service.account("starter")
    await account.client.post("/v1/domains/", json={"name": "names.example"})
    for name in ("Ann\r\nBcc: all@example.com", "Ann\x01", "Ann\u2028"):
        created = await account.client.post(
            "/v1/senders/", json={"email": "ann@names.example", "name": name}
        )
        assert created.status_code == 422, name
        assert created.json()["errors"][0]["loc"] == ["body", "name"]
    assert (await account.client.get("/v1/senders/")).json() == []


async def test_a_tag_too_long_for_its_header_line_is_refused_before_queuing(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    # Found by the header fuzz (tests/test_fuzz.py): a tag of 998 characters was accepted,
    # then its email failed, as no X-Postroom-Tags line of 998 characters could hold it.
    # (Tags go out only in a header the domain maps them to: here the old one.)
    account = await ready_account(service, dns_server)
    [domain] = (await account.client.get("/v1/domains/")).json()
    mapped = {"tags_header": "X-Postroom-Tags"}
    assert (await account.client.patch(f"/v1/domains/{domain['id']}", json=mapped)).is_success
    route_mail(dns_server, "customer.example")
    post = account.client.post
    too_long = message(GOOD_RECIPIENT, tags=["ok", "x" * 201])
    for path in ("/v1/emails/", "/v1/emails/validate"):
        refused = await post(path, json=too_long)
        assert refused.status_code == 422, (path, refused.text)
        assert refused.json()["errors"][0]["loc"] == ["body", "tags", 1], path
    [entry] = (await post("/v1/emails/batch", json=[too_long])).json()
    assert entry["status"] == "error" and entry["id"] is None
    contacts = await create_list(account)
    await add_contact(account, contacts["id"], GOOD_RECIPIENT)
    bulk = bulk_body(contacts["id"], await sender_id(account), tags=["x" * 201])
    assert (await post(f"/v1/contacts/{contacts['id']}/send", json=bulk)).status_code == 422

    longest = ["x" * 200, "y" * 200]
    sent = await post("/v1/emails/", json=message(GOOD_RECIPIENT, tags=longest))
    assert (await wait_for_status(account, sent.json()["id"]))["status"] == "delivered"
    [received] = await smtp_sink.wait_for_messages(1)
    parsed = email.message_from_bytes(received.data, policy=email.policy.default)
    assert parsed["X-Postroom-Tags"] == ", ".join(longest)
