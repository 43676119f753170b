"""SpamAssassin (Debian's, local rules only: `spamassassin -L -t`) scores one message of
every shape the service sends, as the loopback sink received it: API text-only, HTML-only,
with an attachment, UTF-8 subject and body, a broadcast (bulk send), a relay submission and
a forwarded message. No rule that Postroom's own output causes may fire; the rules that
fire only because of the loopback test setup are listed with their reason, and nothing else
is allowed. One spamassassin process reads all seven messages as an mbox (it takes seconds
to start)."""

from __future__ import annotations

import base64
import email
import email.policy
import mailbox
import re
import shutil
import smtplib
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.harness.broadcasts import sender_id
from tests.harness.contacts import add_contact, create_list
from tests.harness.dns_server import DnsServer
from tests.harness.inbound import SOURCE, forwarding_account, letter, rule, send_inbound
from tests.harness.relay import relay_account
from tests.harness.sending import SENDER, route_mail
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

SPAMASSASSIN = "/usr/bin/spamassassin"
# The storage engine does not shape a message: SQLite only keeps the SpamAssassin run single.
pytestmark = [
    pytest.mark.skipif(
        shutil.which(SPAMASSASSIN) is None,
        reason="Debian's spamassassin is not installed (scripts/test installs it)",
    ),
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]

# Rules that fire only because of where the test runs, each with why; anything else that
# fires fails the test.
SETUP_ARTEFACTS = {
    # Informational (score 0): the sink adds no Received field of its own, and API mail
    # has none before it (a real receiver's MX adds one).
    "NO_RELAYS": "the sink is the last hop and adds no Received field",
    "NO_RECEIVED": "the sink adds no Received field; API mail has none of ours before it",
    "ALL_TRUSTED": "every relay in the trace is loopback, which SpamAssassin trusts (-1.0)",
}
# Rules the message's content as the sender wrote it causes, whoever sends it.
SENDERS_CONTENT = {
    "HTML_MESSAGE": "informational (0.001): the sender gave an HTML body",
    # A forward keeps the author's From (ARC exists to vouch for it), while the envelope is
    # the forwarding domain's bounce address: every forwarder does this unless it rewrites
    # From, which would lose the author. Only the forward may have it (asserted below).
    "HEADER_FROM_DIFFERENT_DOMAINS": "forwarded mail: author's From, forwarder's envelope",
}

SUBJECTS = {
    "text": "Your receipt for order 1042",
    "html": "Your order has shipped",
    "attachment": "Your invoice for November",
    "utf8": "Reçu de votre commande n° 1042 — merci",
    "broadcast": "News for our customers this month",
    "relay": "Your password was changed",
    "forward": "Meeting notes from Tuesday",
}


def _api_message(subject: str, **content: Any) -> dict[str, Any]:
    return {
        "from_": {"email": SENDER, "name": "Shop Team"},
        "to": [{"email": "ann@customer.example", "name": "Ann Example"}],
        "subject": subject,
        **content,
    }


_TEXT = (
    "Hello Ann,\n\nthank you for your order 1042. We will let you know when it ships.\n\n"
    "Kind regards,\nThe Shop Team\n"
)
_HTML = (
    "<html><body><p>Hello Ann,</p><p>your order 1042 is on its way. You can follow it on "
    '<a href="https://shop.example/orders/1042">your order page</a>.</p>'
    "<p>Kind regards,<br>The Shop Team</p></body></html>"
)


def _relay_submit(
    service: Service, tls_ca: TlsAuthority, credential: dict[str, Any], subject: str
) -> None:
    text = (
        f"From: Shop Team <{SENDER}>\r\nTo: Ann Example <ann@customer.example>\r\n"
        f"Subject: {subject}\r\nMIME-Version: 1.0\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n\r\n"
        "Hello Ann,\r\n\r\nthe password of your account was changed a minute ago. If that\r\n"
        "was not you, please reply to this message.\r\n\r\nThe Shop Team\r\n"
    )
    host, port = service.submission_address
    with smtplib.SMTP(host, port, local_hostname="laptop.shop.example", timeout=15) as smtp:
        smtp.starttls(context=tls_ca.client_context())
        smtp.login(credential["username"], credential["password"])
        smtp.sendmail(SENDER, ["ann@customer.example"], text)


async def _send_every_shape(service: Service, dns_server: DnsServer, tls_ca: TlsAuthority) -> None:
    account, credential = await relay_account(service, dns_server)
    post = account.client.post
    sent = [
        await post("/v1/emails/", json=_api_message(SUBJECTS["text"], text=_TEXT)),
        await post("/v1/emails/", json=_api_message(SUBJECTS["html"], html=_HTML)),
        await post(
            "/v1/emails/",
            json=_api_message(
                SUBJECTS["attachment"],
                text=_TEXT,
                html=_HTML,
                attachments=[
                    {
                        "filename": "invoice-1042.pdf",
                        "content_base64": base64.b64encode(b"%PDF-1.4\n% invoice\n").decode(),
                    }
                ],
            ),
        ),
        await post(
            "/v1/emails/",
            json=_api_message(
                SUBJECTS["utf8"],
                text="Bonjour Anne,\n\nmerci pour votre commande. À bientôt !\n\nL'équipe\n",
                html="<p>Bonjour Anne,</p><p>merci pour votre commande. À bientôt !</p>",
            ),
        ),
    ]
    assert [r.status_code for r in sent] == [202] * 4, [r.text for r in sent]

    contacts = await create_list(account)
    await add_contact(account, contacts["id"], "bob@customer.example", name="Bob")
    bulk = await post(
        f"/v1/contacts/{contacts['id']}/send",
        json={
            "contact_list_id": contacts["id"],
            "sender_address_id": await sender_id(account),
            "subject": SUBJECTS["broadcast"],
            "html": "<p>Hello {{name}},</p><p>our autumn collection is in the shop now.</p>",
            "text": "Hello {{name}},\n\nour autumn collection is in the shop now.\n",
        },
    )
    assert bulk.status_code == 200, bulk.text

    await trio.to_thread.run_sync(
        partial(_relay_submit, service, tls_ca, credential, SUBJECTS["relay"])
    )

    forwarder, domain = await forwarding_account(service, dns_server)
    forward = rule(domain, destination_emails=["ann@customer.example"])
    assert (await forwarder.client.post("/v1/forwards/", json=forward)).status_code == 201
    assert await send_inbound(service, [SOURCE], letter(subject=SUBJECTS["forward"])) == set()


def _fired(report: str) -> dict[str, set[str]]:
    """The rules that fired on each message of spamassassin's mbox output, by subject."""
    fired = {}
    for chunk in re.split(r"(?m)^From \S+ .*\d{4}$", report)[1:]:
        message = email.message_from_string(chunk.lstrip("\r\n"), policy=email.policy.default)
        status = " ".join(str(message["X-Spam-Status"]).split())
        tests = status.partition("tests=")[2].split(" autolearn=")[0].replace(" ", "")
        fired[str(message["Subject"])] = set() if tests == "none" else set(tests.split(","))
    return fired


async def test_no_rule_postroom_causes_fires_on_any_message_it_sends(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    tmp_path: Path,
) -> None:
    route_mail(dns_server, "customer.example")
    await _send_every_shape(service, dns_server, tls_ca)
    received = await smtp_sink.wait_for_messages(len(SUBJECTS))

    box = mailbox.mbox(tmp_path / "received.mbox")
    for message in received:
        # As the receiving MTA hands it on: the envelope sender in Return-Path first.
        box.add(f"Return-Path: <{message.mail_from}>\r\n".encode() + message.data)
    box.close()

    run = await trio.to_thread.run_sync(
        partial(
            subprocess.run,
            [SPAMASSASSIN, "-L", "-t", "--mbox", str(tmp_path / "received.mbox")],
            capture_output=True,
            text=True,
            timeout=240,
        )
    )
    fired = _fired(run.stdout)
    assert sorted(fired) == sorted(SUBJECTS.values()), run.stderr
    allowed = set(SETUP_ARTEFACTS) | set(SENDERS_CONTENT)
    ours = {shape: sorted(fired[subject] - allowed) for shape, subject in SUBJECTS.items()}
    assert ours == {shape: [] for shape in SUBJECTS}
    # Forwarding keeps the author's From over our envelope, and only forwards may.
    for shape, subject in SUBJECTS.items():
        assert ("HEADER_FROM_DIFFERENT_DOMAINS" in fired[subject]) == (shape == "forward")
