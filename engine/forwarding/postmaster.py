"""Mail to postmaster@ and abuse@ of every domain the service serves (RFC 5321 4.5.1,
RFC 2142): accepted, read as a complaint when it is one, else kept for the domain's owner.

A served domain is a verified sending domain, or the bounce domain of one
(engine/domains/bounce_domain.py); its owner is the workspace that verified it. An active
forward for such an address wins: the message is forwarded, not kept. Otherwise:
- a feedback report (RFC 5965, `multipart/report; report-type=feedback-report`) that names
  an email of the owner, by the bounce address in the Return-Path it quotes or else by the
  Message-ID, is recorded against that email through the same path as a report sent to its
  bounce address (engine/forwarding/feedback.py): a `complained` event and a `complaint`
  suppression;
- anything else (a report naming no email of the owner included) is kept for the owner to
  read (`GET /v1/domains/{id}/postmaster-mail`).
Memory and storage are bounded: only the first `REPORT_OCTETS` of a report are parsed (RFC
5965 puts the report and the original's header before its body), only the first
`KEPT_OCTETS` of a message are kept, and a workspace keeps its `KEPT_PER_WORKSPACE` newest.
"""

from __future__ import annotations

import email.parser
import email.policy
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from engine.forwarding import feedback
from engine.mail import reports
from engine.mail.addresses import email_id_from_bounce_address
from engine.platform.errors import NotFound
from engine.platform.runtime import Principal, Runtime
from engine.platform.settings import ComplaintLimits
from storage import domains, emails, postmaster_mail
from storage.codec import new_id
from storage.domains import Domain
from storage.emails import Email
from storage.postmaster_mail import PostmasterMail
from storage.tx import Tx

ROLES = frozenset({"postmaster", "abuse"})
KEPT_OCTETS = 256 * 1024  # of one message
KEPT_PER_WORKSPACE = 500  # messages; the oldest go first
REPORT_OCTETS = 1024 * 1024  # of a feedback report, read to find the email it names
_SHORT = 998  # octets of a header field kept for the listing (a line's limit, RFC 5322)


def role_domain(address: str) -> str | None:
    """The domain of a postmaster@ or abuse@ address (lower case), else None."""
    local, at, domain = address.strip().removeprefix("<").removesuffix(">").rpartition("@")
    if not at or local.lower() not in ROLES or not domain:
        return None
    return domain.lower().rstrip(".")


async def accepts(rt: Runtime, address: str) -> bool:
    """Whether the address is postmaster@ or abuse@ of a domain the service serves."""
    domain = role_domain(address)
    if domain is None:
        return False
    return bool(await rt.db.read(domains.verified_serving, [domain]))


@dataclass(frozen=True, slots=True)
class Arrival:
    """What a message to role addresses is, read before its transaction."""

    recipients: tuple[str, ...]  # its role addresses
    report: reports.Report | None  # the complaint it carries
    from_header: str
    subject: str
    message_id: str
    kept: bytes  # what is kept of it
    size: int


def _is_feedback_report(head: bytes) -> bool:
    header = head.split(b"\r\n\r\n", 1)[0].lower()
    return b"multipart/report" in header and b"feedback-report" in header


def _short(value: object) -> str:
    return " ".join(str(value or "").split())[:_SHORT]


def read(recipients: Sequence[str], data: bytes) -> Arrival | None:
    """The message's role recipients and what it is, or None when it has none."""
    addressed = tuple(r for r in recipients if role_domain(r) is not None)
    if not addressed:
        return None
    kept = data[:KEPT_OCTETS]
    report = None
    if _is_feedback_report(kept):
        found = reports.parse(data[:REPORT_OCTETS])
        report = found if found is not None and found.kind == "arf" else None
    try:
        header = email.parser.BytesHeaderParser(policy=email.policy.default).parsebytes(kept)
        fields = (header.get("From"), header.get("Subject"), header.get("Message-ID"))
    except Exception:  # a stranger's header no parser reads: kept, listed blank
        fields = (None, None, None)
    from_header, subject, message_id = (_short(f) for f in fields)
    return Arrival(addressed, report, from_header, subject, message_id, kept, len(data))


def owners(tx: Tx, domain: str) -> list[Domain]:
    """The served domain named `domain`: the verified sending domain of that name, else
    the verified domain whose bounce domain it is (at most one of each: names are
    verified in one workspace at a time)."""
    found = domains.verified_serving(tx, [domain])
    exact = [d for d in found if d.name == domain]
    return exact or [d for d in found if d.bounce_domain == domain][:1]


def _named(tx: Tx, workspace_id: str, report: reports.Report) -> list[Email]:
    """The owner's emails a complaint names: by the bounce address it quotes, else by the
    Message-ID."""
    email_id = email_id_from_bounce_address(report.original_return_path or "")
    if email_id is not None:
        found = emails.by_ids(tx, [email_id]).get(email_id)
        if found is not None and found.workspace_id == workspace_id:
            return [found]
    if report.original_message_id:
        return emails.by_message_id(tx, workspace_id, report.original_message_id)
    return []


def store(
    tx: Tx,
    envelope_from: str,
    arrival: Arrival,
    forwarded: Collection[str],
    now: datetime,
    limits: ComplaintLimits,
) -> None:
    """Record a complaint against the email it names, or keep the message, for the owner of
    each role address not forwarded; in the caller's transaction."""
    complained: set[str] = set()  # workspaces whose email the report was recorded against
    for recipient in arrival.recipients:
        if recipient in forwarded:
            continue
        domain = role_domain(recipient)
        for owner in owners(tx, domain or ""):
            if arrival.report is not None:
                if owner.workspace_id in complained:
                    continue
                named = _named(tx, owner.workspace_id, arrival.report)
                for found in named:
                    feedback.record(tx, found, arrival.report, now, limits)
                if named:
                    complained.add(owner.workspace_id)
                    continue
            mail = PostmasterMail(
                id=new_id(),
                workspace_id=owner.workspace_id,
                domain_id=owner.id,
                recipient=recipient,
                envelope_from=_short(envelope_from),
                from_header=arrival.from_header,
                subject=arrival.subject,
                message_id=arrival.message_id,
                size_bytes=arrival.size,
                truncated=arrival.size > len(arrival.kept),
                received_at=now,
                content=arrival.kept,
            )
            postmaster_mail.keep(tx, mail, KEPT_PER_WORKSPACE)


async def _domain(rt: Runtime, who: Principal, domain_id: str) -> None:
    if await rt.db.read(domains.get, who.workspace_id, domain_id) is None:
        raise NotFound("domain not found")


async def page(
    rt: Runtime, who: Principal, domain_id: str, number: int, limit: int
) -> tuple[list[PostmasterMail], int]:
    """One page (zero-based `number`) of the mail kept for one of the workspace's domains,
    newest first, and how many messages are kept in all; NotFound for another's domain."""
    await _domain(rt, who, domain_id)
    return await rt.db.read(
        postmaster_mail.page, who.workspace_id, domain_id, number * limit, limit
    )


async def get(rt: Runtime, who: Principal, domain_id: str, mail_id: str) -> PostmasterMail:
    """One kept message with what was kept of its content; NotFound unless the workspace's."""
    found = await rt.db.read(postmaster_mail.get, who.workspace_id, domain_id, mail_id)
    if found is None:
        raise NotFound("message not found")
    return found
