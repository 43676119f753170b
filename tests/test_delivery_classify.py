"""Every way a delivery attempt can end, and the one verdict `classify` gives it; and real
replies of the large mailbox providers, sender-side blocks apart from recipient failures."""

from __future__ import annotations

import pytest

from engine.delivery.classify import (
    DnsFailure,
    IncidentKind,
    NoMailService,
    Outcome,
    PrivateTargets,
    Replied,
    SessionRefused,
    SuppressedSince,
    Unbuildable,
    Unreachable,
    Verdict,
    classify,
)
from engine.smtp.replies import SmtpReply

R = SmtpReply.of
TABLE: list[tuple[Outcome, Verdict, str]] = [
    (Replied(R(250, "2.0.0 OK")), Verdict.DELIVERED, "250 2.0.0 OK"),
    (Replied(R(251, "2.1.5 forwarded")), Verdict.DELIVERED, "251 2.1.5 forwarded"),
    (Replied(R(450, "4.2.0 busy")), Verdict.DEFERRED, "450 4.2.0 busy"),
    (Replied(R(421, "4.3.2 closing")), Verdict.DEFERRED, "421 4.3.2 closing"),
    (Replied(R(452, "4.5.3 too many")), Verdict.DEFERRED, "452 4.5.3 too many"),
    (Replied(R(550, "5.1.1 no such user")), Verdict.BOUNCED, "550 5.1.1 no such user"),
    (Replied(R(552, "5.3.4 too big")), Verdict.BOUNCED, "552 5.3.4 too big"),
    (Replied(R(553, "5.6.7 needs SMTPUTF8")), Verdict.BOUNCED, "553 5.6.7 needs SMTPUTF8"),
    (NoMailService("x.example accepts no mail (null MX)"), Verdict.BOUNCED, "x.example accepts"),
    (DnsFailure("SERVFAIL"), Verdict.INCIDENT, "SERVFAIL"),
    (PrivateTargets("only private addresses"), Verdict.DEFERRED, "only private"),
    (Unreachable("mx [1.2.3.4]: connection refused"), Verdict.DEFERRED, "connection refused"),
    (Unreachable("mx: closing", R(421, "4.3.2 shutting down")), Verdict.DEFERRED, "mx: closing"),
    (Unreachable("mx: slow down", R(421, "4.7.0 bye")), Verdict.INCIDENT, "mx: slow down"),
    (SessionRefused("mx: 554 go away", R(554, "5.3.2 go away")), Verdict.REFUSED, "554 go"),
    (Unbuildable("the sending domain was deleted"), Verdict.FAILED, "domain was deleted"),
    (SuppressedSince("complaint"), Verdict.FAILED, "suppressed (complaint) after the email"),
]


@pytest.mark.parametrize(("outcome", "verdict", "response"), TABLE)
def test_each_outcome_has_one_verdict(outcome: Outcome, verdict: Verdict, response: str) -> None:
    decision = classify(outcome)
    assert decision.verdict is verdict
    assert response in decision.response


def test_every_kind_of_outcome_is_in_the_table() -> None:
    kinds = {type(outcome) for outcome, _, _ in TABLE}
    assert kinds == set(Outcome.__args__)


def test_something_else_is_not_an_outcome() -> None:
    with pytest.raises(TypeError):
        classify("550 5.1.1 no such user")  # type: ignore[arg-type]


B, U, T = IncidentKind.BLOCKED, IncidentKind.UNAUTHENTICATED, IncidentKind.RATE_LIMITED
IP = "[203.0.113.7]"
# (reply code, text, the incident it reports or None, the verdict): providers' own words.
PROVIDERS: list[tuple[int, str, IncidentKind | None, Verdict]] = [
    # Gmail
    (
        550,
        "5.7.1 [203.0.113.7] Our system has detected that this message is likely"
        " unsolicited mail. To reduce the amount of spam sent to Gmail, this message has been"
        " blocked.",
        B,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.1 The IP you're using to send mail is not authorized to send email directly to"
        " our servers. Please use the SMTP relay at your service provider instead.",
        B,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.26 This mail is unauthenticated, which poses a security risk to the sender and"
        " Gmail users, and has been blocked.",
        U,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.26 Unauthenticated email from example.org is not accepted due to domain's DMARC"
        " policy.",
        U,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.25 [203.0.113.7] The IP address sending this message does not have a PTR record"
        " setup, or the corresponding forward DNS entry does not point to the sending IP.",
        U,
        Verdict.INCIDENT,
    ),
    (
        421,
        "4.7.0 [203.0.113.7] Our system has detected an unusual rate of unsolicited mail"
        " originating from your IP address. To protect our users from spam, mail sent from your"
        " IP address has been temporarily rate limited.",
        T,
        Verdict.INCIDENT,
    ),
    (
        421,
        "4.7.28 [203.0.113.7] Gmail has detected an unusual rate of mail originating from"
        " your DKIM domain [example.org 1].",
        U,
        Verdict.INCIDENT,
    ),
    (
        452,
        "4.7.28 [203.0.113.7] Our system has detected an unusual rate of unsolicited mail"
        " originating from your IP address.",
        T,
        Verdict.INCIDENT,
    ),
    (421, "4.7.0 Try again later, closing connection.", T, Verdict.INCIDENT),
    # One mailbox receiving too fast, or full: this recipient only, deferred on its own.
    (
        450,
        "4.2.1 The user you are trying to contact is receiving mail at a rate that prevents"
        " additional messages from being delivered. Please resend your message at a later time.",
        None,
        Verdict.DEFERRED,
    ),
    (
        452,
        "4.2.1 The recipient is receiving mail too quickly. Please try again later.",
        None,
        Verdict.DEFERRED,
    ),
    (452, "4.2.2 The email account that you tried to reach is over quota.", None, Verdict.DEFERRED),
    (
        550,
        "5.1.1 The email account that you tried to reach does not exist. Please try"
        " double-checking the recipient's email address for typos or unnecessary spaces.",
        None,
        Verdict.BOUNCED,
    ),
    (550, "5.2.1 The email account that you tried to reach is disabled.", None, Verdict.BOUNCED),
    # Outlook.com, Microsoft 365
    (
        550,
        "5.7.606 Access denied, banned sending IP [203.0.113.7]. To request removal from"
        " this list please visit https://sender.office.com/.",
        B,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.708 Service unavailable. Access denied, traffic not accepted from this IP.",
        B,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.1 Unfortunately, messages from [203.0.113.7] weren't sent. Please contact your"
        " Internet service provider since part of their network is on our block list (S3150).",
        B,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.1 Service unavailable, Client host [203.0.113.7] blocked using Spamhaus.",
        B,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.509 Access denied, sending domain example.org does not pass DMARC verification"
        " and has a DMARC policy of reject.",
        U,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.515 Access denied, sending domain example.org doesn't meet the required"
        " authentication level.",
        U,
        Verdict.INCIDENT,
    ),
    (
        451,
        "4.7.500 Server busy. Please try again later from [203.0.113.7]. (S77719)",
        T,
        Verdict.INCIDENT,
    ),
    (
        451,
        "4.7.650 The mail server [203.0.113.7] has been temporarily rate limited due to IP"
        " reputation.",
        T,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient ann@outlook.com not found by SMTP"
        " address lookup",
        None,
        Verdict.BOUNCED,
    ),
    (550, "5.7.1 RESOLVER.RST.AuthRequired; authentication required", None, Verdict.BOUNCED),
    (550, "5.7.1 RESOLVER.RST.NotAuthorized; not authorized", None, Verdict.BOUNCED),
    (552, "5.2.2 STOREDRV.Deliver; mailbox full", None, Verdict.BOUNCED),
    # Yahoo, AOL
    (
        553,
        "5.7.2 [TSS09] All messages from 203.0.113.7 will be permanently deferred;"
        " Retrying will NOT succeed. See https://senders.yahooinc.com/error-codes",
        B,
        Verdict.INCIDENT,
    ),
    (
        421,
        "4.7.0 [TSS04] Messages from 203.0.113.7 temporarily deferred due to unexpected"
        " volume or user complaints - 4.16.55.1",
        T,
        Verdict.INCIDENT,
    ),
    (
        554,
        "5.7.9 Message not accepted for policy reasons. See"
        " https://senders.yahooinc.com/error-codes",
        B,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.9 This mail has been blocked because the sender is unauthenticated. Yahoo"
        " requires all senders to authenticate with either SPF or DKIM.",
        U,
        Verdict.INCIDENT,
    ),
    (
        554,
        "delivery error: dd This user doesn't have a yahoo.com account (ann@yahoo.com)"
        " [0] - mta1.mail.bf1.yahoo.com",
        None,
        Verdict.BOUNCED,
    ),
    (552, "1 Requested mail action aborted, mailbox not found", None, Verdict.BOUNCED),
    # iCloud
    (
        554,
        "5.7.1 [CS01] Message rejected due to local policy. Please visit"
        " https://support.apple.com/en-us/HT204137",
        B,
        Verdict.INCIDENT,
    ),
    (
        550,
        "5.7.0 Blocked - see https://support.proofpoint.com/dnsbl-lookup.cgi?ip=203.0.113.7",
        B,
        Verdict.INCIDENT,
    ),
    (550, "5.1.1 <ann@icloud.com>: user does not exist", None, Verdict.BOUNCED),
    # Comcast
    (
        554,
        "5.7.1 resimta-po-01v.sys.comcast.net Comcast block for spam. Please see"
        " http://postmaster.comcast.net/smtp-error-codes.php#BL000000",
        B,
        Verdict.INCIDENT,
    ),
    (
        421,
        "4.7.0 resimta-po-02v.sys.comcast.net Too many sessions opened from this IP,"
        " try again later (RL000001)",
        T,
        Verdict.INCIDENT,
    ),
    (550, "5.1.1 <ann@comcast.net> Not our Customer", None, Verdict.BOUNCED),
    # GMX, web.de
    (
        554,
        "Transaction failed Reject due to policy restrictions. For explanation visit"
        " https://postmaster.gmx.net/en/error-messages?ip=203.0.113.7&c=sp",
        B,
        Verdict.INCIDENT,
    ),
    (
        421,
        "gmx.net (mxgmx106) Nemesis ESMTP Service not available No SMTP service Bad DNS PTR"
        " resource record.",
        U,
        Verdict.INCIDENT,
    ),
    (550, "Requested action not taken: mailbox unavailable", None, Verdict.BOUNCED),
    # Mail.ru
    (
        550,
        "spam message rejected. Please visit https://help.mail.ru/notspam-support/id?c=x"
        " or report details to abuse@corp.mail.ru.",
        B,
        Verdict.INCIDENT,
    ),
    (421, "Try again later. Ratelimit exceeded for your IP.", T, Verdict.INCIDENT),
    (
        550,
        "Message was not accepted -- invalid mailbox. Local mailbox ann@mail.ru is"
        " unavailable: user not found",
        None,
        Verdict.BOUNCED,
    ),
    # Plain temporary failures and recipient policies stay what they were.
    (451, "4.3.0 Temporary lookup failure", None, Verdict.DEFERRED),
    (
        550,
        "5.7.1 <ann@example.com>: Recipient address rejected: Access denied",
        None,
        Verdict.BOUNCED,
    ),
]


@pytest.mark.parametrize(("code", "text", "kind", "verdict"), PROVIDERS)
def test_providers_replies_tell_sender_side_blocks_from_recipient_failures(
    code: int, text: str, kind: IncidentKind | None, verdict: Verdict
) -> None:
    decision = classify(Replied(R(code, text)))
    assert (decision.verdict, decision.incident) == (verdict, kind)
    assert text in decision.response


def test_a_dns_failure_is_an_incident_of_its_own_kind() -> None:
    assert classify(DnsFailure("SERVFAIL for x.example")).incident is IncidentKind.DNS


def test_only_incidents_carry_a_kind() -> None:
    for outcome, verdict, _ in TABLE:
        assert (classify(outcome).incident is not None) == (verdict is Verdict.INCIDENT)
