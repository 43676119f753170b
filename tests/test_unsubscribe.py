"""Unsubscribe that is right for the recipient and the sender (issue 30, section 1), end to
end: per-recipient copies and tokens, the one-click and mailto: ways in, the scope of an
unsubscribe, the override that never lifts an unsubscribe or a complaint, and the footer."""

from __future__ import annotations

import re
import smtplib
from email.message import EmailMessage
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from engine.mail.link_security import http_warning, unsubscribe_is_https
from tests.harness.broadcasts import body, parsed, part, sender_id
from tests.harness.contacts import add_contact, create_list
from tests.harness.dns_server import DnsServer
from tests.harness.inbound import send_inbound
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import PUBLIC_URL, Account, Service
from tests.harness.smtp_sink import ReceivedMessage, SmtpSink

DOMAIN = "reader.example"
ANN, BOB, CY = f"ann@{DOMAIN}", f"bob@{DOMAIN}", f"cy@{DOMAIN}"


def _links(received: ReceivedMessage) -> tuple[str, str]:
    """The one-click URL and the mailto: address of a delivered copy's List-Unsubscribe."""
    parsed_message = parsed(received.data)
    assert parsed_message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    one_click, mailto = re.findall(r"<([^>]+)>", str(parsed_message["List-Unsubscribe"]))
    assert one_click.startswith(f"{PUBLIC_URL}/t/u/") and mailto.startswith("mailto:")
    return one_click, mailto


async def _account(service: Service, dns_server: DnsServer) -> Account:
    """A sending account whose mail to DOMAIN reaches the sink."""
    account = await ready_account(service, dns_server)
    route_mail(dns_server, DOMAIN)
    return account


async def _send(account: Account, to: str, **extra: Any) -> dict[str, Any]:
    response = await account.client.post("/v1/emails/", json=message(to, **extra))
    assert response.status_code == 202, response.text
    sent: dict[str, Any] = response.json()
    return sent


async def _delivered(
    account: Account, smtp_sink: SmtpSink, to: str, count: int = 1, **extra: Any
) -> tuple[str, list[ReceivedMessage]]:
    """Send, wait for delivery; the email id and the copies the sink received for it."""
    before = len(smtp_sink.messages)
    sent = await _send(account, to, **extra)
    assert sent["status"] == "queued"
    received = await smtp_sink.wait_for_messages(before + count)
    await wait_for_status(account, sent["id"])
    return sent["id"], received[before:]


async def _suppressions(account: Account) -> list[tuple[str, str, str | None]]:
    listed = (await account.client.get("/v1/suppressions/")).json()["items"]
    return sorted((s["email"], s["reason"], s["source_email_id"]) for s in listed)


async def _unsubscribed(account: Account, email_id: str) -> list[tuple[str, str]]:
    """Who unsubscribed from an email, and how, by its `unsubscribed` events."""
    events = (await account.client.get(f"/v1/emails/{email_id}/events")).json()
    return [
        (e["recipient"], e["metadata"]["method"])
        for e in events
        if e["event_type"] == "unsubscribed"
    ]


async def _one_click(service: Service, url: str) -> None:
    done = await service.client().post(
        url.removeprefix(PUBLIC_URL), data={"List-Unsubscribe": "One-Click"}
    )
    assert done.status_code == 200


async def test_each_recipient_gets_a_copy_whose_link_names_only_them(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await _account(service, dns_server)
    email_id, copies = await _delivered(
        account, smtp_sink, ANN, count=3, cc=[{"email": BOB}], bcc=[{"email": CY}], unsubscribe=True
    )
    detail = (await account.client.get(f"/v1/emails/{email_id}")).json()
    assert detail["unsubscribe"] is True
    by_reader = {copy.rcpt_to: copy for copy in copies}
    assert set(by_reader) == {(ANN,), (BOB,), (CY,)}  # one transaction per recipient
    links = {reader: _links(copy) for (reader,), copy in by_reader.items()}
    assert len({one_click for one_click, _ in links.values()}) == 3
    reader = service.client()
    for address, (one_click, _) in links.items():
        page = await reader.get(one_click.removeprefix(PUBLIC_URL))
        assert page.status_code == 200 and address in page.text
        assert not [other for other in (ANN, BOB, CY) if other != address and other in page.text]
    # Every copy still shows the same To and Cc, and none shows the Bcc recipient.
    for copy in copies:
        seen = parsed(copy.data)
        assert (seen["To"], seen["Cc"], seen["Bcc"]) == (ANN, BOB, None)

    await _one_click(service, links[BOB][0])
    assert await _suppressions(account) == [(BOB, "unsubscribe", email_id)]
    assert await _unsubscribed(account, email_id) == [(BOB, "one-click")]


async def test_transactional_mail_carries_no_unsubscribe_unless_asked(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await _account(service, dns_server)
    _, [copy] = await _delivered(account, smtp_sink, ANN, cc=[{"email": BOB}])
    assert sorted(copy.rcpt_to) == [ANN, BOB]  # one message, one transaction, as before
    seen = parsed(copy.data)
    assert seen["List-Unsubscribe"] is None and seen["List-Unsubscribe-Post"] is None
    assert "unsubscribe" not in part(seen, "plain").lower()


async def test_an_unsubscribe_blocks_subscribed_mail_only_and_is_never_overridden(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await _account(service, dns_server)
    _, [newsletter] = await _delivered(account, smtp_sink, ANN, unsubscribe=True)
    await _one_click(service, _links(newsletter)[0])

    # A password reset still reaches the reader who left the newsletter.
    _, [reset] = await _delivered(account, smtp_sink, ANN, subject="Reset your password")
    assert parsed(reset.data)["Subject"] == "Reset your password"

    # Mail that offers unsubscribe is refused, and a retry within 24 hours is refused too.
    first = await _send(account, ANN, unsubscribe=True)
    assert first["status"] == "rejected"
    assert "no retry overrides" in first["rejection_reason"]
    again = await _send(account, ANN, unsubscribe=True)
    retried = await account.client.post(f"/v1/emails/{first['id']}/retry")
    assert again["status"] == retried.json()["status"] == "rejected"

    # Then a bounce: a stronger reason replaces the unsubscribe and blocks all mail.
    manual = await account.client.post(
        "/v1/suppressions/", json={"email": ANN, "reason": "hard_bounce"}
    )
    assert manual.status_code == 201 and manual.json()["reason"] == "hard_bounce"
    blocked = await _send(account, ANN)
    assert blocked["status"] == "rejected"


@pytest.mark.parametrize("reason", ["complaint", "unsubscribe"])
async def test_the_override_never_lifts_the_recipients_own_word(
    service: Service, dns_server: DnsServer, reason: str
) -> None:
    account = await ready_account(service, dns_server)
    added = await account.client.post("/v1/suppressions/", json={"email": ANN, "reason": reason})
    assert added.status_code == 201
    extra = {"unsubscribe": True}
    attempts = [await _send(account, ANN, **extra) for _ in range(2)]
    retried = await account.client.post(f"/v1/emails/{attempts[0]['id']}/retry")
    assert [a["status"] for a in attempts] + [retried.json()["status"]] == ["rejected"] * 3
    validation = await account.client.post("/v1/emails/validate", json=message(ANN, **extra))
    assert validation.json()["can_send"] is False


async def test_a_bounce_is_still_overridden_once(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await _account(service, dns_server)
    await account.client.post("/v1/suppressions/", json={"email": ANN, "reason": "hard_bounce"})
    assert (await _send(account, ANN))["status"] == "rejected"
    assert (await _send(account, ANN))["status"] == "queued"  # the one retry in 24 hours


async def test_the_footer_is_added_when_the_body_places_no_link_and_never_twice(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await _account(service, dns_server)
    _, [plain] = await _delivered(account, smtp_sink, ANN, unsubscribe=True)
    one_click, _ = _links(plain)
    seen = parsed(plain.data)
    assert part(seen, "plain").rstrip().endswith(f"Unsubscribe from these emails: {one_click}")
    html = part(seen, "html")
    assert html.count(f'href="{one_click}"') == 1 and "Unsubscribe</a>" in html

    placed: dict[str, Any] = {
        "text": "Bye? {{ unsubscribe_url }}",
        "html": '<html><body><a href="{{unsubscribe_url}}">Leave</a></body></html>',
    }
    # Placed in mail that offers no unsubscribe, it would go out as the braces: refused.
    refused = await account.client.post("/v1/emails/", json=message(ANN, **placed))
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["loc"] == ["body", "unsubscribe"]
    # Only the parts are filled: a subject placing it is refused by every door that takes one.
    titled = {"subject": "Leave: {{ unsubscribe_url }}", "unsubscribe": True}
    contact_list = await create_list(account)
    broadcast = body(contact_list["id"], await sender_id(account), subject=titled["subject"])
    for path, sent in (
        ("/v1/emails/", message(ANN, **titled)),
        ("/v1/templates/", {"name": "Leave", "subject": titled["subject"], "text_body": "Hi"}),
        (f"/v1/contacts/{contact_list['id']}/send", broadcast),
    ):
        answer = await account.client.post(path, json=sent)
        assert answer.status_code == 422, (path, answer.text)
        assert answer.json()["errors"][0]["loc"] == ["body", "subject"], (path, answer.text)
    [entry] = (await account.client.post("/v1/emails/batch", json=[message(ANN, **titled)])).json()
    assert entry["status"] == "error" and "would show the braces" in entry["rejection_reason"]
    _, [own] = await _delivered(account, smtp_sink, ANN, unsubscribe=True, **placed)
    one_click, _ = _links(own)
    seen = parsed(own.data)
    assert part(seen, "plain").strip() == f"Bye? {one_click}"
    html = part(seen, "html")
    assert html.count(one_click) == 1 and "Don't want these emails?" not in html


async def test_a_workspace_words_its_footer_or_turns_it_off(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await _account(service, dns_server)
    path = "/v1/workspace/unsubscribe-footer"
    default = (await account.client.get(path)).json()
    assert default["enabled"] is True and default["updated_at"] is None
    assert "{{unsubscribe_url}}" in default["text"] and "{{unsubscribe_url}}" in default["html"]
    for refused in ({"text": "Leave here"}, {"colour": "red"}, {"enabled": "maybe"}):
        answer = await account.client.patch(path, json=refused)
        assert answer.status_code == 422 and answer.json()["code"] == "validation_error"
    worded = {
        "text": "Leave: {{unsubscribe_url}}",
        "html": '<a href="{{unsubscribe_url}}">Leave</a>',
    }
    changed = await account.client.patch(path, json=worded)
    assert changed.status_code == 200 and changed.json()["text"] == worded["text"]
    assert changed.json()["updated_at"] is not None

    # A broadcast: the contact's template is rendered, the footer added per contact.
    contact_list = await create_list(account)
    await add_contact(account, contact_list["id"], ANN, name="Ann")
    sent = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/send",
        json=body(contact_list["id"], await sender_id(account), text="Hi {{name}}", html=None),
    )
    assert sent.json()["queued"] == 1
    [broadcast] = await smtp_sink.wait_for_messages(1)
    one_click, _ = _links(broadcast)
    text = part(parsed(broadcast.data), "plain").replace("\r\n", "\n")
    assert text.strip() == f"Hi Ann\n\nLeave: {one_click}"

    off = await account.client.patch(path, json={"enabled": False})
    assert off.json()["enabled"] is False and off.json()["text"] == worded["text"]
    _, [bare] = await _delivered(account, smtp_sink, ANN, unsubscribe=False, cc=[{"email": BOB}])
    _, [quiet] = await _delivered(account, smtp_sink, BOB, unsubscribe=True)
    _links(quiet)  # the header stays: only the visible footer is off
    assert part(parsed(quiet.data), "plain").strip() == "Thanks for your order."
    assert "Leave" not in part(parsed(bare.data), "plain")
    log = (await account.client.get("/v1/audit-log", params={"category": "Send"})).json()
    assert [e["action"] for e in log["items"]].count("unsubscribe_footer.updated") == 2


def _unsubscribe_letter(to: str, subject: str | None) -> bytes:
    letter = EmailMessage()
    letter["From"] = "someone@reader.example"
    letter["To"] = to
    if subject is not None:
        letter["Subject"] = subject
    letter.set_content("unsubscribe\n")
    return letter.as_bytes(policy=letter.policy.clone(linesep="\r\n"))


async def test_mailto_unsubscribe_through_the_inbound_mx(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await _account(service, dns_server)
    email_id, copies = await _delivered(
        account, smtp_sink, ANN, count=2, cc=[{"email": BOB}], unsubscribe=True
    )
    [bob_copy] = [c for c in copies if c.rcpt_to == (BOB,)]
    _, mailto = _links(bob_copy)
    parts = urlsplit(mailto)
    address, [subject] = parts.path, parse_qs(parts.query)["subject"]
    assert address == f"unsubscribe+{email_id}@mail.example.org"

    # An address of no email, and a request that does not say who, are refused.
    unknown = "unsubscribe+00000000-0000-4000-8000-000000000000@mail.example.org"
    assert await send_inbound(service, [unknown], _unsubscribe_letter(unknown, subject)) == {
        unknown
    }
    with pytest.raises(smtplib.SMTPDataError, match="does not say who"):
        await send_inbound(service, [address], _unsubscribe_letter(address, "unsubscribe"))

    assert await send_inbound(service, [address], _unsubscribe_letter(address, subject)) == set()
    assert await _suppressions(account) == [(BOB, "unsubscribe", email_id)]
    assert await _unsubscribed(account, email_id) == [(BOB, "mailto")]

    # An email to one reader (as every broadcast email is) needs no subject.
    single_id, [single] = await _delivered(account, smtp_sink, CY, unsubscribe=True)
    _, mailto = _links(single)
    address = urlsplit(mailto).path
    assert await send_inbound(service, [address], _unsubscribe_letter(address, None)) == set()
    assert (CY, "unsubscribe", single_id) in await _suppressions(account)


def test_unsubscribe_links_must_be_https_outside_loopback_and_the_sandbox() -> None:
    assert unsubscribe_is_https("https://mail.example.com")
    assert not unsubscribe_is_https("http://mail.example.com")
    warning = http_warning("http://mail.example.com", sandbox=False)
    assert warning is not None and "not https" in warning and "\n" not in warning
    for quiet, sandbox in (
        ("https://mail.example.com", False),
        ("http://mail.example.com", True),
        ("http://127.0.0.1:8080", False),
        ("http://localhost:8080", False),
        ("http://[::1]:8080", False),
    ):
        assert http_warning(quiet, sandbox=sandbox) is None
