"""What the inbound MX server accepts, and what happens to a message it accepted.

The server is never an open relay: a recipient is accepted only when it is an active
forward's source address, the bounce address (on any domain: the sending domain or its
bounce domain) or mailto: unsubscribe address (engine/forwarding/unsubscribe_mail.py) of an
email this service sent, or postmaster@ / abuse@ (engine/forwarding/postmaster.py), dmarc@
(engine/forwarding/dmarc_reports.py) or tls-rpt@ (engine/forwarding/tls_reports.py) of a
domain the service serves. `receive` returns only once the message's work is committed (the
listener answers 250 after it): forwarded mail is stored, under our `Received:` and
`Authentication-Results:` fields (engine/forwarding/authentication.py), with one job per
destination and the forwarder is woken; a delivery report or complaint sent to a bounce
address is recorded against its email, and mail to postmaster@ / abuse@ is recorded or kept
(`postmaster.store`), and a DMARC aggregate report sent to dmarc@ or a TLS report sent to
tls-rpt@ is stored, in the same transaction. Rules are read from the database on every call,
so a forward created, changed or deleted takes effect at once on every node.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from engine.forwarding import (
    authentication,
    dmarc_reports,
    feedback,
    postmaster,
    tls_reports,
    unsubscribe_mail,
)
from engine.mail import forwarding, reports, trace
from engine.mail.addresses import email_id_from_bounce_address
from engine.platform.runtime import Runtime
from engine.platform.settings import ComplaintLimits
from storage import emails, forwards, inbound
from storage.tx import Tx


def _clean(address: str) -> str:
    return address.strip().removeprefix("<").removesuffix(">").lower()


async def accepts(rt: Runtime, address: str) -> bool:
    """Whether mail to this address is ours to take (else the server answers 550)."""
    address = _clean(address)
    unsubscribe = await unsubscribe_mail.accepts(rt, address)
    if unsubscribe is not None:
        return unsubscribe
    email_id = email_id_from_bounce_address(address)
    if email_id is not None:
        return bool(await rt.db.read(emails.by_ids, [email_id]))
    if await rt.db.read(forwards.active_by_sources, [address]):
        return True
    to_dmarc = await dmarc_reports.ADDRESS.accepts(rt, address)
    if to_dmarc is not None:
        return to_dmarc
    to_tls_rpt = await tls_reports.ADDRESS.accepts(rt, address)
    if to_tls_rpt is not None:
        return to_tls_rpt
    return await postmaster.accepts(rt, address)


def _jobs(rules: Sequence[forwards.Forward], data: bytes) -> list[inbound.NewJob]:
    jobs: list[inbound.NewJob] = []
    for rule in rules:
        if forwarding.already_forwarded_by(data, rule.source_email):
            continue  # a loop: this rule sent the message on once already
        for kind, targets in (("email", rule.destination_emails), ("url", rule.destination_urls)):
            jobs.extend(
                inbound.NewJob(rule.id, rule.workspace_id, rule.source_email, kind, target)
                for target in targets
            )
    return jobs


def _store(
    tx: Tx,
    envelope_from: str,
    recipients: list[str],
    data: bytes,
    report: reports.Report | None,
    unsubscribes: list[unsubscribe_mail.Request],
    to_postmaster: postmaster.Arrival | None,
    dmarc: dmarc_reports.Arrival | None,
    tls_rpt: tls_reports.Arrival | None,
    now: datetime,
    limits: ComplaintLimits,
) -> bool:
    """Commit the message's work; whether forwarding jobs were stored."""
    unsubscribe_mail.record(tx, unsubscribes, now)
    bounce_ids = {i for i in map(email_id_from_bounce_address, recipients) if i is not None}
    if report is not None:
        for email in emails.by_ids(tx, sorted(bounce_ids)).values():
            feedback.record(tx, email, report, now, limits)
    rules = forwards.active_by_sources(tx, recipients)
    if to_postmaster is not None:
        postmaster.store(
            tx, envelope_from, to_postmaster, {r.source_email for r in rules}, now, limits
        )
    if dmarc is not None:
        dmarc_reports.store(tx, dmarc, {r.source_email for r in rules}, now)
    if tls_rpt is not None:
        tls_reports.store(tx, tls_rpt, {r.source_email for r in rules}, now)
    jobs = _jobs(rules, data)
    if jobs:
        inbound.insert_message(tx, envelope_from, recipients, data, jobs, now)
    return bool(jobs)


def stamps(recipients: list[str]) -> bool:
    """Whether a message to these recipients is kept under our trace and results: when it
    is mail for a forward (a report to a bounce address, dmarc@ or tls-rpt@ is read, not sent on)."""
    return not all(
        email_id_from_bounce_address(c)
        or dmarc_reports.ADDRESS.domain(c)
        or tls_reports.ADDRESS.domain(c)
        for c in map(_clean, recipients)
    )


async def receive(
    rt: Runtime, envelope_from: str, recipients: list[str], data: bytes, arrival: trace.Arrival
) -> None:
    """Commit an accepted message's work, then wake the forwarder; returns once durable.
    Mail for forwards is kept as it arrived under our trace and authentication results
    (engine/forwarding/authentication.py), which forwarded copies carry on in their ARC."""
    recipients = sorted({_clean(r) for r in recipients})
    to_bounce_address = any(email_id_from_bounce_address(r) for r in recipients)
    report = reports.parse(data) if to_bounce_address else None
    if stamps(recipients):
        data = await authentication.stamped(
            rt.resolver, rt.smtp_host, arrival, recipients, data, rt.clock.now()
        )
    unsubscribes = unsubscribe_mail.requests(rt.secret_key, recipients, data)
    to_postmaster = postmaster.read(recipients, data)
    dmarc = dmarc_reports.read(recipients, data)
    tls_rpt = tls_reports.read(recipients, data)
    await rt.db.write(
        _store,
        envelope_from,
        recipients,
        data,
        report,
        unsubscribes,
        to_postmaster,
        dmarc,
        tls_rpt,
        rt.clock.now(),
        rt.complaint_limits,
    )
