"""Every way a delivery attempt can end, and the one verdict `classify` gives it; and real
replies of the large mailbox providers, sender-side blocks apart from recipient failures, and
recipients that are gone apart from full mailboxes and refused messages (RFC 3463)."""

from __future__ import annotations

import pytest

from engine.delivery.bounces import Blame
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
from engine.smtp.replies import S553_NEEDS_SMTPUTF8, S554_MESSAGE_NEEDS_SMTPUTF8, SmtpReply

R = SmtpReply.of
TABLE: list[tuple[Outcome, Verdict, str]] = [
    (Replied(R(250, "2.0.0 OK")), Verdict.DELIVERED, "250 2.0.0 OK"),
    (Replied(R(251, "2.1.5 forwarded")), Verdict.DELIVERED, "251 2.1.5 forwarded"),
    (Replied(R(450, "4.2.0 busy")), Verdict.DEFERRED, "450 4.2.0 busy"),
    (Replied(R(421, "4.3.2 closing")), Verdict.DEFERRED, "421 4.3.2 closing"),
    (Replied(R(452, "4.5.3 too many")), Verdict.DEFERRED, "452 4.5.3 too many"),
    (Replied(R(550, "5.1.1 no such user")), Verdict.BOUNCED, "550 5.1.1 no such user"),
    (Replied(R(552, "5.3.4 too big")), Verdict.UNDELIVERABLE, "552 5.3.4 too big"),
    (Replied(R(553, "5.6.7 needs SMTPUTF8")), Verdict.UNDELIVERABLE, "553 5.6.7 needs SMTPUTF8"),
    (Replied(R(552, "5.2.2 mailbox full")), Verdict.SOFT_BOUNCED, "552 5.2.2 mailbox full"),
    (Replied(R(550, "5.1.1 no such user"), at_mail=True), Verdict.UNDELIVERABLE, "550 5.1.1"),
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
    (
        452,
        "4.2.2 The email account that you tried to reach is over quota.",
        None,
        Verdict.SOFT_BOUNCED,
    ),
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
    # A group taking internal mail only: the recipient's policy, not a gone address.
    (550, "5.7.1 RESOLVER.RST.AuthRequired; authentication required", None, Verdict.UNDELIVERABLE),
    (550, "5.7.1 RESOLVER.RST.NotAuthorized; not authorized", None, Verdict.UNDELIVERABLE),
    (552, "5.2.2 STOREDRV.Deliver; mailbox full", None, Verdict.SOFT_BOUNCED),
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
        Verdict.UNDELIVERABLE,
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


G, F, M, P, S = Blame.RECIPIENT, Blame.MAILBOX_FULL, Blame.MESSAGE, Blame.PROTOCOL, Blame.SENDER
D, V, SB = Verdict.BOUNCED, Verdict.UNDELIVERABLE, Verdict.SOFT_BOUNCED
# (code, text, verdict, what it blames, the `dsn` recorded): real replies, by RFC 3463. Only a
# recipient that is gone suppresses; a full mailbox is tried again and counted; the rest fail
# that one email.
BOUNCES: list[tuple[int, str, Verdict, Blame, str]] = [
    # Gmail
    (
        552,
        "5.2.2 The recipient's inbox is out of storage space and inactive. Please direct the"
        " recipient to https://support.google.com/mail/?p=OverQuotaPerm",
        SB,
        F,
        "5.2.2",
    ),
    (
        452,
        "4.2.2 The recipient's inbox is out of storage space. Please direct the recipient to"
        " https://support.google.com/mail/?p=OverQuotaTemp",
        SB,
        F,
        "4.2.2",
    ),
    (552, "5.2.3 Your message exceeded Google's message size limits.", V, M, "5.2.3"),
    (
        552,
        "5.7.0 This message was blocked because its content presents a potential security"
        " issue. Please visit https://support.google.com/mail/?p=BlockedMessage",
        V,
        M,
        "5.7.0",
    ),
    (550, "5.2.1 The email account that you tried to reach is inactive.", D, G, "5.2.1"),
    (
        550,
        "5.1.1 The email account that you tried to reach does not exist. Please try"
        " double-checking the recipient's email address for typos or unnecessary spaces."
        " https://support.google.com/mail/?p=NoSuchUser",
        D,
        G,
        "5.1.1",
    ),
    # Microsoft (Outlook.com, Exchange Online)
    (
        552,
        "5.2.2 mailbox full; STOREDRV.Deliver.Exception:QuotaExceededException."
        "MapiExceptionShutoffQuotaExceeded",
        SB,
        F,
        "5.2.2",
    ),
    (554, "5.2.2 mailbox full; STOREDRV.Deliver.Exception:QuotaExceededException", SB, F, "5.2.2"),
    (
        550,
        "5.4.1 Recipient address rejected: Access denied. AS(201806281)"
        " [BN1NAM02FT022.eop-nam02.prod.protection.outlook.com]",
        D,
        G,
        "5.4.1",
    ),
    (
        554,
        "5.6.211 Invalid MIME Content: Single text value size (32004) exceeded allowed maximum"
        " (32000) for the 'X-Custom' header.",
        V,
        M,
        "5.6.211",
    ),
    (
        550,
        "5.6.11 SMTPSEND.BareLinefeedsAreIllegal; message contains bare linefeeds",
        V,
        M,
        "5.6.11",
    ),
    # Yahoo, AOL
    (
        554,
        "delivery error: dd Sorry your message to ann@yahoo.com cannot be delivered. This"
        " mailbox is disabled (554.30). - mta1.mail.bf1.yahoo.com",
        D,
        G,
        "5.0.0",
    ),
    (552, "1 Requested mail action aborted, mailbox not found", D, G, "5.0.0"),
    # Postfix, Dovecot, Exim, and the RFC 5321 texts
    (550, "5.1.1 <ann@example.org>: Recipient address rejected: User unknown", D, G, "5.1.1"),
    (
        450,
        "4.1.1 <ann@example.org>: Recipient address rejected: User unknown in local table",
        Verdict.DEFERRED,
        G,
        "4.1.1",
    ),
    (550, "5.1.2 <ann@nx.example>: Recipient address rejected: Domain not found", D, G, "5.1.2"),
    (525, "5.7.13 User account disabled", D, G, "5.7.13"),
    (552, "5.2.2 <ann@example.org> Quota exceeded (mailbox for user is full)", SB, F, "5.2.2"),
    (552, "Requested mail action aborted: exceeded storage allocation", SB, F, "5.0.0"),
    (452, "4.2.2 Mailbox full", SB, F, "4.2.2"),
    (552, "5.3.4 Message size exceeds fixed maximum message size", V, M, "5.3.4"),
    (554, "5.6.0 Message refused: content rejected", V, M, "5.6.0"),
    (552, "Message size exceeds the allowed size for this account (10485760)", V, M, "5.0.0"),
    (500, "5.5.2 Syntax error, command unrecognized", V, P, "5.5.2"),
    (500, "Syntax error", V, P, "5.0.0"),
    (501, "5.5.4 Invalid arguments", V, P, "5.5.4"),
    (
        553,
        "5.1.8 <bounces+1@example.org>: Sender address rejected: Domain not found",
        V,
        S,
        "5.1.8",
    ),
    (
        550,
        "5.1.0 <bounces+1@example.org>: Sender address rejected: User unknown in local"
        " recipient table",
        V,
        S,
        "5.1.0",
    ),
    (550, "5.0.0 rejected", V, Blame.UNKNOWN, "5.0.0"),
    (550, "5.4.4 SMTPSEND.DNS.NonExistentDomain; nonexistent domain", V, Blame.SYSTEM, "5.4.4"),
]


@pytest.mark.parametrize(("code", "text", "verdict", "blame", "dsn"), BOUNCES)
def test_only_a_recipient_that_is_gone_bounces_and_a_full_mailbox_is_soft(
    code: int, text: str, verdict: Verdict, blame: Blame, dsn: str
) -> None:
    decision = classify(Replied(R(code, text)))
    assert (decision.verdict, decision.blame, decision.dsn) == (verdict, blame, dsn)
    assert decision.incident is None
    assert text in decision.response


def test_a_refusal_at_mail_from_never_blames_the_recipient() -> None:
    decision = classify(Replied(R(550, "5.1.1 <ann@example.org>: user unknown"), at_mail=True))
    assert (decision.verdict, decision.blame) == (Verdict.UNDELIVERABLE, Blame.SENDER)


def test_a_utf8_header_no_hop_can_take_fails_the_message_without_suppressing() -> None:
    """Made up by our client (engine/smtp/session.py) for a UTF-8 header with no ASCII form
    and a hop without SMTPUTF8, in place of MAIL's reply."""
    decision = classify(Replied(S554_MESSAGE_NEEDS_SMTPUTF8, at_mail=True))
    assert decision.verdict is Verdict.UNDELIVERABLE
    assert (decision.dsn, decision.blame) == ("5.6.7", Blame.MESSAGE)
    decision = classify(Replied(S553_NEEDS_SMTPUTF8))
    assert decision.verdict is Verdict.UNDELIVERABLE and decision.blame is Blame.MESSAGE
