"""Aggregate reports (DMARC, TLS-RPT) as receivers mail them to the bounce domain: the
sample reports in tests/dmarc_reports/, a report mail with one attached, and handing it to
the inbound MX over SMTP."""

from __future__ import annotations

import email.policy
import smtplib
from email.message import EmailMessage
from pathlib import Path

import trio

from tests.harness.bounce_domain import BOUNCE_DOMAIN
from tests.harness.sending import SENDING_DOMAIN
from tests.harness.service import Service

FIXTURES = Path(__file__).parent.parent / "dmarc_reports"
RUA = f"dmarc@{BOUNCE_DOMAIN}"


def report_mail(
    submitter: str, sender: str, attachment: bytes, kind: str, filename: str, to: str = RUA
) -> bytes:
    """A report as a receiver mails it: a short text part and the report attached."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    message["Subject"] = f"Report Domain: {SENDING_DOMAIN} Submitter: {submitter} Report-ID: 1"
    message["Message-ID"] = f"<{filename}@{submitter}>"
    message.set_content(f"This is an aggregate report from {submitter}.")
    maintype, subtype = kind.split("/")
    message.add_attachment(attachment, maintype=maintype, subtype=subtype, filename=filename)
    return message.as_bytes(policy=email.policy.SMTP)


def _send(address: tuple[str, int], rcpts: list[str], data: bytes) -> tuple[int, str]:
    """One message over SMTP: the reply to RCPT when one is refused, else to DATA."""
    with smtplib.SMTP(*address, timeout=30) as client:
        client.ehlo("reports.example")
        client.mail("")
        for rcpt in rcpts:
            code, reply = client.rcpt(rcpt)
            if code != 250:
                return code, reply.decode()
        code, reply = client.data(data)
        return code, reply.decode()


async def send(service: Service, data: bytes, rcpts: list[str] | None = None) -> tuple[int, str]:
    return await trio.to_thread.run_sync(_send, service.inbound_address, rcpts or [RUA], data)
