"""The rules of SMTP submission: who may send what through the relay, once authenticated.

The same rules as the API, applied at the SMTP step where a client can best be told:
- AUTH is refused unchecked (454) once the username or the client address has failed too
  often (engine/accounts/login_limits.py: failures counted in the database, on every node);
  otherwise it reads the credential with the domain's active senders and the month's volume in
  one unit of work (`authenticate`), so MAIL FROM is checked without the database: it must
  be an active registered sender on the credential's verified domain, and the plan's
  monthly volume must have room. Both are checked again, against the database of the
  moment, in the transaction that stores the message.
- A credential deactivated on any node ends its open sessions: MAIL FROM re-reads it when
  the session's last look is `RECHECK_AFTER` old (`current`; one indexed read a second at
  most, nothing for a burst of messages), and storing a message reads it in any case.
- RCPT TO a suppressed address is refused with the reason and counts as an attempt of the
  one-time override (engine/suppressions/override.py, through `sending.attempt_suppressed`):
  the first attempt opens a 24-hour window, one retry within it is accepted (the override
  is used then), later ones are refused.
- The message names its author as the workspace registered it (what DMARC and the
  recipient see; `_originator_problem`): exactly one From field, every address in it an
  active sender on the credential's domain; at most one Sender field, naming one such
  address. Fields are read strictly (engine/mail/address_list.py): anything ambiguous is
  refused. The message is stored (`intake.store`) before the relay answers 250; messages
  meeting in one group commit are checked and stored together (`_store_submissions`).
- An `Idempotency-Key:` field in the message works as the API's header (engine/sending/
  idempotency.py, the same keys of the workspace): the same key with the same envelope and
  message within 24 hours answers the first email's id and stores nothing; with another
  message it is refused (`KeyConflict`). The field is taken out of the message sent on.
Each function returns why it refuses (a sentence for the SMTP reply) or None.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import outcome

from engine import plans
from engine.accounts import login_limits
from engine.accounts import smtp_credentials as credentials
from engine.mail import address_list, trace
from engine.platform.errors import Conflict
from engine.platform.runtime import Runtime
from engine.sending import idempotency, intake
from engine.sending.intake import NewEmail, attempt_suppressed, suppression_overrides
from engine.sending.raw_mail import HeaderSummary, RawMail, raw_email, sending_domain, summarize
from engine.suppressions import scopes
from storage import domains, emails, smtp_credentials, suppressions
from storage.domains import Domain
from storage.engines import runs_together
from storage.smtp_credentials import RelayLogin
from storage.tx import Tx

# How stale a session's view of its credential may be: a deactivation reaches every open
# session, on any node, within this.
RECHECK_AFTER = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Accepted:
    email_id: str


@dataclass(frozen=True, slots=True)
class TooManyFailures:
    """AUTH refused without a look at the password: too many failures (the relay: 454)."""


@dataclass(frozen=True, slots=True)
class KeyConflict:
    """The message's Idempotency-Key was used with another message (the relay: 5.7.0)."""

    reason: str


class _NotStored(Exception):
    """A message under an Idempotency-Key refused at commit: nothing to remember."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Submitter:
    """An authenticated relay connection: its credential, and what MAIL FROM is checked
    against, read once with the credential (the connection's view; commit re-checks)."""

    login: RelayLogin
    senders: frozenset[str]  # active sender addresses on the credential's domain
    sent_this_month: int
    checked_at: datetime  # when the credential was last read


def _active_senders(tx: Tx, login: RelayLogin) -> frozenset[str]:
    return frozenset(
        s.email
        for s in domains.list_senders(tx, login.workspace_id)
        if s.is_active and s.domain_id == login.domain_id
    )


def _candidates(tx: Tx, username: str, now: datetime) -> list[Submitter]:
    month = intake.month(now)
    return [
        Submitter(
            login,
            _active_senders(tx, login),
            emails.sent_in_month(tx, login.workspace_id, month),
            now,
        )
        for login in smtp_credentials.logins(tx, username)
    ]


def _limited_candidates(
    tx: Tx, name: str | None, who: login_limits.Attempt, now: datetime
) -> tuple[bool, int, list[Submitter]]:
    refused, failures = login_limits.relay_failures(tx, who, now)
    if refused or name is None:
        return refused, failures, []
    return refused, failures, _candidates(tx, name, now)


async def authenticate(
    rt: Runtime, username: str, password: str, client: str | None
) -> Submitter | TooManyFailures | None:
    """The connection's submitter for these credentials, or None (the relay says 535 for
    unknown, wrong, deactivated, and a credential whose domain is gone or unverified), or
    TooManyFailures when the username or the client address `client` failed too often."""
    who = login_limits.relay_attempt(username, client)
    now = rt.clock.now()
    name = credentials.usable_username(username)
    refused, failures, candidates = await rt.db.read(_limited_candidates, name, who, now)
    if refused:
        return TooManyFailures()
    login = None
    if password:
        login = credentials.match([c.login for c in candidates], password)
    if login is None or not login.domain_verified:
        await rt.db.write(login_limits.relay_failed, who, now)
        return None
    if failures:
        await rt.db.write(login_limits.succeeded, who)
    return next(c for c in candidates if c.login is login)


async def current(rt: Runtime, submitter: Submitter) -> Submitter | None:
    """The connection's submitter, its credential re-read if the last look is older than
    `RECHECK_AFTER`; None once the credential is deactivated, or its domain gone or no
    longer verified (the relay then says 535, as AUTH would)."""
    now = rt.clock.now()
    if now - submitter.checked_at < RECHECK_AFTER:
        return submitter
    login = await rt.db.read(smtp_credentials.login, submitter.login.credential_id)
    if login is None or not login.domain_verified:
        return None
    return replace(submitter, login=login, checked_at=now)


def _sender_problem(login: RelayLogin, senders: frozenset[str], address: str) -> str | None:
    if address.rpartition("@")[2] != login.domain_name:
        return f"{address or '<>'} is not on {login.domain_name}, the domain of this credential"
    if address not in senders:
        return f"{address} is not a registered sender; add it under /v1/senders/ first"
    return None


def _volume_problem(login: RelayLogin, sent_this_month: int) -> str | None:
    return intake.volume_problem(plans.plan(login.plan), sent_this_month)


def check_sender(submitter: Submitter, address: str) -> str | None:
    """Why MAIL FROM `address` is refused for this connection, or None (no database)."""
    return _sender_problem(submitter.login, submitter.senders, address.lower()) or _volume_problem(
        submitter.login, submitter.sent_this_month
    )


def _blocking(tx: Tx, workspace_id: str, address: str) -> dict[str, str]:
    # Relay mail is sent as given, with no unsubscribe of ours: an unsubscribe does not block it.
    found = suppressions.suppressed_among(tx, workspace_id, [address])
    return scopes.blocking(found, subscribed=False)


def _attempt(tx: Tx, workspace_id: str, address: str, now: datetime) -> str | None:
    suppressed = _blocking(tx, workspace_id, address)
    if not suppressed:
        return None
    overrides = suppression_overrides(tx, workspace_id, suppressed)
    return attempt_suppressed(tx, workspace_id, suppressed, overrides, now)


async def check_recipient(rt: Runtime, submitter: Submitter, address: str) -> str | None:
    """Why RCPT TO `address` is refused (suppressed, no override), or None.

    Counts as an attempt only for a suppressed address: one read for everyone else.
    """
    address = address.lower()
    workspace_id = submitter.login.workspace_id
    found = await rt.db.read(_blocking, workspace_id, address)
    if not found:
        return None
    reason: str | None = await rt.db.write(_attempt, workspace_id, address, rt.clock.now())
    return reason


def _originator_problem(
    login: RelayLogin, senders: frozenset[str], summary: HeaderSummary
) -> str | None:
    """Why the message's From or Sender field is refused, or None (see the module's rule)."""
    if len(summary.from_fields) != 1:
        return f"the message has {len(summary.from_fields)} From headers; it must have exactly one"
    if len(summary.sender_fields) > 1:
        return f"the message has {len(summary.sender_fields)} Sender headers; it may have one"
    for name, values in (("From", summary.from_fields), ("Sender", summary.sender_fields)):
        for value in values:
            found = address_list.addresses(value)
            if found is None:
                return f"the {name} header cannot be read as a list of email addresses"
            if not found:
                return f"the {name} header names no address"
            if name == "Sender" and len(found) > 1:
                return "the Sender header names more than one address"
            for address in found:
                problem = _sender_problem(login, senders, address.lower())
                if problem is not None:
                    return f"{name} header: {problem}"
    return None


def _store_submissions(
    tx: Tx, calls: list[tuple[Any, ...]]
) -> list[outcome.Outcome[Accepted | str]]:
    """Messages submitted to this node that met in one group commit: per credential, its
    login, senders and month's volume read once (the connection's view may be stale), each
    message checked against them in order (the volume counts the ones before it), and the
    accepted ones stored in one `intake.store`. Each is answered as it would be alone; the
    messages of one call share its time (the latest of theirs)."""
    now = max(call[2] for call in calls)
    answers: dict[int, Accepted | str] = {}
    credentials_of: dict[str, list[int]] = {}
    for i, call in enumerate(calls):
        credentials_of.setdefault(call[0].credential_id, []).append(i)
    accepted: list[NewEmail] = []
    placed: list[int] = []
    for members in credentials_of.values():
        login: RelayLogin = calls[members[0]][0]
        current = smtp_credentials.login(tx, login.credential_id)
        if current is None:
            answers.update(
                (i, "this SMTP credential has been deleted, or its domain has") for i in members
            )
            continue
        if not current.domain_verified:
            answers.update((i, f"{login.domain_name} is not verified") for i in members)
            continue
        senders = _active_senders(tx, current)
        plan = plans.plan(current.plan)
        sent = intake.counted_volume(tx, login.workspace_id, now, calls[0][3], plan, len(members))
        domain: Domain | None = None  # the credential's, read once for its messages
        for i in members:
            mail: RawMail = calls[i][1]
            summary = summarize(mail.data)
            problem = (
                _sender_problem(current, senders, mail.from_email)
                or _originator_problem(current, senders, summary)
                or _volume_problem(current, sent)
            )
            if problem is not None:
                answers[i] = problem
                continue
            domain = domain or sending_domain(tx, mail)
            accepted.append(raw_email(mail, domain, summary))
            placed.append(i)
            sent += 1
    stored = intake.store(tx, accepted, now, volume_shard=calls[0][3])
    answers.update((i, Accepted(email.id)) for i, email in zip(placed, stored, strict=True))
    return [outcome.Value(answers[i]) for i in range(len(calls))]


@runs_together(_store_submissions)
def _store(tx: Tx, login: RelayLogin, mail: RawMail, now: datetime, shard: int) -> Accepted | str:
    """Re-check against the database of now (the connection's view may be stale), store."""
    [answer] = _store_submissions(tx, [(login, mail, now, shard)])
    stored: Accepted | str = answer.unwrap()
    return stored


_KEY_FIELD = b"idempotency-key"


def _idempotency_key(data: bytes) -> tuple[str | None, bytes] | str:
    """The message's Idempotency-Key (None without one) and the message without that field;
    or why the field is refused (more than one, or not 1-256 printable ASCII characters).

    Only the header counts (up to the first empty line, as `raw_mail` reads it); lines end
    in CRLF (the SMTP server refuses bare CR and LF). A message without the field is
    returned as it is after one search of its header.
    """
    end = 0 if data.startswith(b"\r\n") else data.find(b"\r\n\r\n")
    header = data if end < 0 else data[:end]
    if _KEY_FIELD not in header.lower():
        return None, data
    kept: list[bytes] = []
    values: list[bytes] = []
    in_key = False
    for line in header.split(b"\r\n"):
        if line[:1] in (b" ", b"\t") and kept + values:
            if in_key:
                values[-1] += b" " + line.strip()
            else:
                kept.append(line)
            continue
        name, colon, value = line.partition(b":")
        in_key = bool(colon) and name.strip().lower() == _KEY_FIELD
        if in_key:
            values.append(value.strip())
        else:
            kept.append(line)
    if not values:
        return None, data
    if len(values) > 1:
        return f"the message has {len(values)} Idempotency-Key headers; it may have one"
    key = values[0].decode("latin-1")
    if not (1 <= len(key) <= 256 and all(" " <= c <= "~" for c in key)):
        return "the Idempotency-Key header must be 1-256 printable ASCII characters"
    return key, b"\r\n".join(kept) + (b"" if end < 0 else data[end:])


async def submit(
    rt: Runtime,
    submitter: Submitter,
    mail_from: str,
    recipients: list[str],
    data: bytes,
    arrival: trace.Arrival,
    *,
    requiretls: bool = False,
) -> Accepted | KeyConflict | str:
    """Store a submitted message (committed when this returns) under a `Received:` field
    saying how it arrived, or answer the first email of its Idempotency-Key again; or why
    it is refused. `requiretls`: the client asked for REQUIRETLS (RFC 8689)."""
    found = _idempotency_key(data)
    if isinstance(found, str):
        return found
    key, data = found
    if key is None:
        return await _submit(rt, submitter, mail_from, recipients, data, arrival, requiretls)

    async def run() -> tuple[Any, int]:
        result = await _submit(rt, submitter, mail_from, recipients, data, arrival, requiretls)
        if isinstance(result, str):
            raise _NotStored(result)
        return {"id": result.email_id}, 250

    # The envelope is part of the request: the same message to other recipients is another.
    envelope = " ".join([mail_from.lower(), *sorted(r.lower() for r in recipients)])
    digest = idempotency.request_hash("SMTP", envelope, data)
    try:
        response, _ = await idempotency.once_in_workspace(
            rt, submitter.login.workspace_id, key, digest, run
        )
    except _NotStored as refused:
        return refused.reason
    except Conflict:
        return KeyConflict(
            "this Idempotency-Key was used with a different message in the last 24 hours"
        )
    return Accepted(str(response["id"]))


async def _submit(
    rt: Runtime,
    submitter: Submitter,
    mail_from: str,
    recipients: list[str],
    data: bytes,
    arrival: trace.Arrival,
    requiretls: bool,
) -> Accepted | str:
    login = submitter.login
    now = rt.clock.now()
    # Added after the Idempotency-Key's hash was taken (the field differs on every retry),
    # before delivery signs the message, so the DKIM signature covers it.
    received = trace.received_field(arrival, rt.smtp_host, trace.trace_id(), recipients, now)
    mail = RawMail(
        workspace_id=login.workspace_id,
        domain_id=login.domain_id,
        from_email=mail_from.lower(),
        recipients=[r.lower() for r in recipients],
        data=received + data,
        source="smtp",
        requiretls=requiretls,
    )
    result: Accepted | str = await rt.db.write(_store, login, mail, now, rt.usage_shard)
    return result
