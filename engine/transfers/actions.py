"""Domain transfers: initiate, accept, decline, cancel, stop, the timer's deadlines, force.

Each operation is one unit of work: the state change (decided by engine/transfers/rules.py),
its activity entries on each side, and the mail announcing it (engine/transfers/notices.py)
commit together. Accept and stop tokens are random, stored as SHA-256 and used up when used.
On completion the domain moves with its senders, forwards and BIMI settings; the previous
owner's SMTP credentials for it are revoked; with `rotate_dkim` it gets new DKIM keys (RSA,
and Ed25519 if it has one) and is pending until the new records are published and verified.
A domain the sandbox marked verified arrives pending whatever the path (the mark was valid
only where it was made).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from engine import plans
from engine.accounts import roles
from engine.accounts.passwords import token_hash
from engine.accounts.users import require_admin
from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.domains import dkim_keys, registry
from engine.platform import faults
from engine.platform.errors import (
    Conflict,
    EngineError,
    Forbidden,
    Gone,
    NotFound,
    PlanLimit,
    RateLimited,
)
from engine.platform.runtime import Principal, Runtime
from engine.transfers import notices as transfer_mail
from engine.transfers import rules
from engine.transfers.notices import Notice, SystemSender
from storage import accounts, broadcasts, domains, forwards, sandbox, smtp_credentials, transfers
from storage.codec import new_id
from storage.domains import Domain
from storage.transfers import NewDkimKey, Transfer
from storage.tx import Tx

SYSTEM_ACTOR = "postroom"  # the actor of changes nobody made by hand (deadlines)
DUE_BATCH = 100
MAX_TOKEN_LENGTH = 200

log = logging.getLogger("postroom.transfers")

_ERRORS: dict[str, type[EngineError]] = {
    "not_found": NotFound,
    "forbidden": Forbidden,
    "conflict": Conflict,
    "gone": Gone,
}


def _raise(refusal: rules.Refusal | None, **extra: object) -> None:
    if refusal is None:
        return
    kind = PlanLimit if refusal.code == "domain_limit" else _ERRORS[refusal.kind]
    raise kind(refusal.detail, code=refusal.code, **extra)


@dataclass(frozen=True, slots=True)
class _Outbox:
    """Mail to queue with a state change, in the same unit of work."""

    sender: SystemSender
    public_url: str

    def send(
        self, tx: Tx, t: Transfer, notice: Notice, now: datetime, withhold: str | None = None
    ) -> None:
        """Queue `notice`, or keep it in the sandbox when the transferring workspace is in it
        (`withhold`: a token in it that is its recipient's credential)."""
        if sandbox.is_sandboxed(tx, t.source_org_id):
            transfer_mail.capture(tx, self.sender, notice, t.source_org_id, t.id, now, withhold)
        else:
            transfer_mail.queue(tx, self.sender, notice, now)


async def _outbox(rt: Runtime) -> _Outbox:
    return _Outbox(await transfer_mail.system_sender(rt), rt.public_url)


def _done(rt: Runtime, outbox: _Outbox, transfer_id: str) -> None:
    """After commit: wake the timer of every node for the new deadline (delivery hears of
    the queued mail from the unit that stored it)."""
    rt.wakeups.announce(["transfers"])


def _user_email(tx: Tx, user_id: str) -> str:
    user = accounts.user_by_id(tx, user_id)
    return "" if user is None else user.email


def _log_both(tx: Tx, t: Transfer, actor: str, action: str, now: datetime, **meta: object) -> None:
    """The same entry in the source workspace and, once known, the target workspace."""
    change = Change(action, t.domain_name, t.id, {"domain_id": t.domain_id, **meta})
    record(tx, t.source_org_id, actor, change, now)
    if t.target_org_id is not None and t.target_org_id != t.source_org_id:
        record(tx, t.target_org_id, actor, change, now)


def _refreshed(tx: Tx, transfer_id: str) -> Transfer:
    current = transfers.get(tx, transfer_id)
    assert current is not None
    return current


# -- initiate -------------------------------------------------------------------------------


def _count_attempt(tx: Tx, user_id: str, now: datetime) -> None:
    attempts = transfers.note_initiation(tx, user_id, now, now - rules.RATE_WINDOW)
    wait = rules.retry_after(attempts, now)
    if wait is not None:
        raise RateLimited(
            f"at most {rules.INITIATIONS_PER_WINDOW} transfers may be initiated per minute;"
            f" retry in {wait} s",
            retry_after=wait,
        )
    transfers.add_initiation(tx, user_id, now)


def _blockers(found: Sequence[broadcasts.Broadcast]) -> list[dict[str, object]]:
    return [
        {
            "type": "broadcast",
            "id": b.id,
            "name": b.name,
            "status": b.status,
            "created_at": b.created_at.isoformat().replace("+00:00", "Z"),
        }
        for b in found
    ]


def _initiate(
    tx: Tx,
    who: Principal,
    domain_id: str,
    target_email: str,
    note: str,
    token: str,
    outbox: _Outbox,
    now: datetime,
) -> Transfer:
    domain = domains.get(tx, who.workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    in_flight = broadcasts.in_flight_for_domain(tx, who.workspace_id, domain.id)
    target = accounts.user_by_email(tx, target_email)
    facts = rules.InitiateFacts(
        active_transfer=bool(transfers.active_for_domain(tx, domain.id)),
        broadcasts_in_flight=in_flight,
        scheduled_emails=transfers.scheduled_email_count(tx, who.workspace_id, domain.id),
        target_exists=target is not None,
        target_is_self=target is not None and target.id == who.user_id,
    )
    refusal = rules.initiate_refusal(facts)
    if refusal is not None and refusal.code == "broadcasts_in_flight":
        _raise(refusal, blockers=_blockers(in_flight))
    _raise(refusal)
    t = Transfer(
        id=new_id(),
        domain_id=domain.id,
        domain_name=domain.name,
        source_user_id=who.user_id,
        source_org_id=who.workspace_id,
        source_label=who.user_email,
        target_email=target_email,
        target_user_id=None,
        target_org_id=None,
        status=rules.PENDING,
        note=note,
        rotate_dkim=False,
        forced_by=None,
        cooloff_until=None,
        initiated_at=now,
        accepted_at=None,
        completed_at=None,
        ended_at=None,
        expires_at=now + rules.EXPIRY,
    )
    transfers.insert(tx, t, token_hash(token))
    _log_both(tx, t, who.user_email, "transfer.initiated", now, target_email=target_email)
    outbox.send(tx, t, transfer_mail.invitation(t, token, outbox.public_url), now, token)
    return t


async def initiate(
    rt: Runtime, who: Principal, domain_id: str, target_email: str, note: str
) -> Transfer:
    """Offer a domain to another account: pending, the recipient mailed an accept link.

    At most `INITIATIONS_PER_WINDOW` attempts per user and minute count, refused ones included
    (the target check must not become a way to probe which addresses have accounts).
    """
    now = rt.clock.now()
    await rt.db.write(_count_attempt, who.user_id, now)
    target = normalize_email(target_email, "target_email")
    outbox = await _outbox(rt)
    token = secrets.token_urlsafe(32)
    t = await rt.db.write(_initiate, who, domain_id, target, note, token, outbox, now)
    _done(rt, outbox, t.id)
    return t


# -- accept ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AcceptRequest:
    caller: Principal | None  # None: the accept token alone is the credential
    target_org_id: str | None
    rotate_dkim: bool


def _accept(
    tx: Tx,
    t: Transfer,
    req: AcceptRequest,
    stop_token: str,
    outbox: _Outbox,
    now: datetime,
) -> Transfer:
    recipient = accounts.user_by_email(tx, t.target_email)
    is_recipient = recipient is not None and (
        req.caller is None or req.caller.user_id == recipient.id
    )
    memberships = [] if recipient is None else accounts.memberships_of(tx, recipient.id)
    org_id = req.target_org_id or (memberships[0].workspace.id if memberships else "")
    member = next((m for m in memberships if m.workspace.id == org_id), None)
    chosen = None if member is None else member.workspace
    _raise(
        rules.accept_refusal(
            t.status,
            t.expires_at,
            now,
            is_recipient=is_recipient,
            in_workspace=chosen is not None,
            domains_in_workspace=0 if chosen is None else domains.count(tx, chosen.id),
            domain_limit=0 if chosen is None else plans.plan(chosen.plan).domains,
        )
    )
    assert recipient is not None and chosen is not None and member is not None
    # Taking a domain into a workspace is managing its domains (engine/accounts/roles.py).
    roles.require(member.role, roles.DOMAINS)
    if chosen.id == t.source_org_id:
        raise Conflict("the domain already belongs to that workspace", code="self_transfer")
    if domains.get(tx, t.source_org_id, t.domain_id) is None:
        raise Conflict("the domain no longer exists", code="not_pending")
    accepted = transfers.set_accepted(
        tx,
        t.id,
        recipient.id,
        chosen.id,
        req.rotate_dkim,
        token_hash(stop_token),
        now,
        now + rules.SAFETY_WINDOW,
    )
    if not accepted:
        raise Conflict("the transfer is no longer pending", code="not_pending")
    t = _refreshed(tx, t.id)
    _log_both(tx, t, recipient.email, "transfer.accepted", now, rotate_dkim=req.rotate_dkim)
    source_email = _user_email(tx, t.source_user_id)
    if source_email:
        notice = transfer_mail.accepted_notice(t, source_email, stop_token, outbox.public_url)
        outbox.send(tx, t, notice, now)
    return t


def _accept_found(
    tx: Tx,
    by_token: bool,
    key: str,
    req: AcceptRequest,
    stop_token: str,
    outbox: _Outbox,
    now: datetime,
) -> Transfer:
    t = transfers.by_accept_token(tx, key) if by_token else transfers.get(tx, key)
    if t is None:
        raise NotFound(
            "the accept link is invalid or was already used" if by_token else "transfer not found"
        )
    return _accept(tx, t, req, stop_token, outbox, now)


async def _accept_by(rt: Runtime, by_token: bool, key: str, req: AcceptRequest) -> Transfer:
    outbox = await _outbox(rt)
    stop_token = secrets.token_urlsafe(32)
    t = await rt.db.write(_accept_found, by_token, key, req, stop_token, outbox, rt.clock.now())
    _done(rt, outbox, t.id)
    return t


async def accept_by_token(rt: Runtime, token: str, req: AcceptRequest) -> Transfer:
    """Accept with the invitation's one-shot token: accepted, the 24-hour window starts."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        raise NotFound("the accept link is invalid or was already used")
    return await _accept_by(rt, True, token_hash(token), req)


async def accept_by_id(rt: Runtime, transfer_id: str, req: AcceptRequest) -> Transfer:
    """Accept as the logged-in recipient, matched by account email (no token)."""
    return await _accept_by(rt, False, transfer_id, req)


# -- decline, cancel, stop ------------------------------------------------------------------


def _decline(tx: Tx, who: Principal, transfer_id: str, outbox: _Outbox, now: datetime) -> Transfer:
    t = transfers.get(tx, transfer_id)
    if t is None:
        raise NotFound("transfer not found")
    if t.target_email != who.user_email:
        raise Forbidden("this transfer was sent to another account", code="wrong_recipient")
    _raise(rules.pending_refusal(rules.Trigger.DECLINE, t.status, t.expires_at, now))
    if not transfers.set_ended(tx, t.id, rules.PENDING, rules.DECLINED, now):
        raise Conflict("the transfer is no longer pending", code="not_pending")
    t = _refreshed(tx, t.id)
    _log_both(tx, t, who.user_email, "transfer.declined", now)
    source_email = _user_email(tx, t.source_user_id)
    if source_email:
        outbox.send(tx, t, transfer_mail.declined_notice(t, source_email), now)
    return t


async def decline(rt: Runtime, who: Principal, transfer_id: str) -> Transfer:
    """The addressed recipient refuses the offer; the sender is told by mail."""
    outbox = await _outbox(rt)
    t = await rt.db.write(_decline, who, transfer_id, outbox, rt.clock.now())
    _done(rt, outbox, t.id)
    return t


def _cancel(tx: Tx, who: Principal, transfer_id: str, now: datetime) -> Transfer:
    t = transfers.get(tx, transfer_id)
    if t is None or t.source_user_id != who.user_id or t.forced_by is not None:
        raise NotFound("transfer not found")
    _raise(rules.pending_refusal(rules.Trigger.CANCEL, t.status, t.expires_at, now))
    if not transfers.set_ended(tx, t.id, rules.PENDING, rules.CANCELLED, now):
        raise Conflict("the transfer is no longer pending", code="not_pending")
    t = _refreshed(tx, t.id)
    _log_both(tx, t, who.user_email, "transfer.cancelled", now)
    return t


async def cancel(rt: Runtime, who: Principal, transfer_id: str) -> Transfer:
    """The initiator withdraws a pending offer."""
    return await rt.db.write(_cancel, who, transfer_id, rt.clock.now())


def _stop(tx: Tx, hashed: str, now: datetime) -> Transfer:
    t = transfers.by_stop_token(tx, hashed)
    if t is None:
        raise NotFound("the stop link is invalid or was already used")
    _raise(rules.stop_refusal(t.status, t.expires_at, t.cooloff_until, now))
    if not transfers.set_ended(tx, t.id, rules.ACCEPTED, rules.REVERSED, now):
        raise Conflict("the safety window is over", code="not_stoppable")
    t = _refreshed(tx, t.id)
    _log_both(tx, t, _user_email(tx, t.source_user_id) or SYSTEM_ACTOR, "transfer.reversed", now)
    return t


async def stop(rt: Runtime, stop_token: str) -> Transfer:
    """Stop an accepted transfer inside its safety window: reversed, ownership never moves."""
    if not stop_token or len(stop_token) > MAX_TOKEN_LENGTH:
        raise NotFound("the stop link is invalid or was already used")
    return await rt.db.write(_stop, token_hash(stop_token), rt.clock.now())


# -- lists ----------------------------------------------------------------------------------


async def incoming(rt: Runtime, who: Principal) -> list[Transfer]:
    """Pending or accepted transfers addressed to the caller's email, most recent first."""
    found = await rt.db.read(transfers.incoming, who.user_email)
    now = rt.clock.now()
    return [
        t
        for t in found
        if rules.effective_status(t.status, t.expires_at, t.cooloff_until, now) in rules.ACTIVE
    ]


async def outgoing(rt: Runtime, who: Principal) -> list[Transfer]:
    """Transfers the caller initiated, most recent first."""
    return await rt.db.read(transfers.outgoing, who.user_id)


@dataclass(frozen=True, slots=True)
class Eligibility:
    can_accept: bool
    code: str | None
    message: str | None
    current_domains: int
    domain_limit: int


async def accept_eligibility(rt: Runtime, who: Principal) -> Eligibility:
    """Whether the caller's workspace has room for one more domain (advisory)."""
    current = await rt.db.read(domains.count, who.workspace_id)
    limit = plans.plan(who.plan).domains
    if rules.within_domain_limit(current, limit):
        return Eligibility(True, None, None, current, limit)
    message = (
        f"The {who.plan} plan allows {limit} domains and this workspace has {current};"
        " upgrade the plan or remove a domain before accepting a transfer."
    )
    return Eligibility(False, "domain_limit", message, current, limit)


# -- completion: the timer's deadlines and the admin's force transfer ------------------------


def _move(
    tx: Tx, t: Transfer, to_org: str, key: NewDkimKey | None, actor: str, now: datetime
) -> None:
    """Move the domain and everything of it to `to_org`; revoke the old owner's credentials;
    drop a sandbox mark (every completion, the admin's force included, comes here)."""
    removed = transfers.move_domain(tx, t.domain_id, to_org, key, now)
    moved = domains.get(tx, to_org, t.domain_id)
    assert moved is not None
    reason = "transferred: a sandbox mark is valid only where it was made; verify it in DNS"
    registry.drop_mark(tx, moved, reason, actor, now)
    for duplicate_id, name in removed:
        change = Change("domain.deleted", name, duplicate_id, {"replaced_by_transfer": t.id})
        record(tx, to_org, actor, change, now)
    forwards.move_domain(tx, t.domain_id, to_org)
    revoked = smtp_credentials.revoke_for_domain(tx, t.domain_id, now)
    if revoked:
        change = Change(
            "smtp_credential.revoked",
            t.domain_name,
            None,
            {"domain_id": t.domain_id, "count": revoked, "reason": "domain transferred"},
        )
        record(tx, t.source_org_id, actor, change, now)
    if key is not None:
        change = Change(
            "domain.dkim_rotated", t.domain_name, t.domain_id, {"selector": key.selector}
        )
        record(tx, to_org, actor, change, now)


async def _new_key() -> NewDkimKey:
    """New keys for a transferred domain: RSA, and Ed25519 in place of any it has."""
    rsa, ed25519 = await dkim_keys.generate(), dkim_keys.generate_ed25519()
    return NewDkimKey(
        rsa.selector,
        rsa.private_pem,
        rsa.public_b64,
        ed25519.selector,
        ed25519.private_pem,
        ed25519.public_b64,
    )


def _apply_deadline(tx: Tx, transfer_id: str, key: NewDkimKey | None, now: datetime) -> str | None:
    """Expire or complete one transfer whose deadline passed; the state it ended in, if any."""
    t = transfers.get(tx, transfer_id)
    if t is None:
        return None
    status = rules.effective_status(t.status, t.expires_at, t.cooloff_until, now)
    if status == rules.EXPIRED and t.status == rules.PENDING:
        if transfers.set_ended(tx, t.id, rules.PENDING, rules.EXPIRED, now):
            _log_both(tx, t, SYSTEM_ACTOR, "transfer.expired", now)
            return rules.EXPIRED
        return None
    if status != rules.COMPLETED or t.status != rules.ACCEPTED or t.target_org_id is None:
        return None
    if domains.get(tx, t.source_org_id, t.domain_id) is None:  # deleted during the window
        if transfers.set_ended(tx, t.id, rules.ACCEPTED, rules.CANCELLED, now):
            _log_both(tx, t, SYSTEM_ACTOR, "transfer.cancelled", now, reason="domain deleted")
            return rules.CANCELLED
        return None
    if not transfers.set_completed(tx, t.id, now):
        return None
    _move(tx, t, t.target_org_id, key if t.rotate_dkim else None, SYSTEM_ACTOR, now)
    _log_both(tx, _refreshed(tx, t.id), SYSTEM_ACTOR, "transfer.completed", now)
    return rules.COMPLETED


async def apply_deadlines(rt: Runtime) -> dict[str, int]:
    """Expire pending transfers past 7 days and complete accepted ones past their window.

    Each transfer is its own unit of work, so one that cannot be applied (it is logged and
    tried again next round) holds no other back and does not stop the timer. Returns how many
    ended in each state.
    """
    counts: dict[str, int] = {}
    while True:
        now = rt.clock.now()
        due = await rt.db.read(transfers.due, now, DUE_BATCH)
        applied = 0
        for t in due:
            rotate = t.rotate_dkim and t.status == rules.ACCEPTED
            try:
                key = await _new_key() if rotate else None
                ended = await rt.db.write(_apply_deadline, t.id, key, now)
            except Exception as exc:  # one transfer's fault: tried again next round
                if not faults.blames_item(exc):
                    raise
                rt.faults.item_fault("transfer_timer", f"domain transfer {t.id}", exc)
                continue
            applied += 1
            if ended is not None:
                counts[ended] = counts.get(ended, 0) + 1
        if len(due) < DUE_BATCH or not applied:
            return counts


async def next_deadline(rt: Runtime) -> datetime | None:
    return await rt.db.read(transfers.next_deadline)


@dataclass(frozen=True, slots=True)
class ForceRequest:
    admin: Principal
    reauthenticated_until: datetime | None
    domain_id: str
    target_email: str
    rotate_dkim: bool = True


def _force(tx: Tx, req: ForceRequest, key: NewDkimKey | None, now: datetime) -> Transfer:
    domain: Domain | None = domains.by_id(tx, req.domain_id)
    if domain is None or domain.workspace_id == transfer_mail.SYSTEM_WORKSPACE_ID:
        raise NotFound("domain not found")
    target = accounts.user_by_email(tx, req.target_email)
    workspaces = [] if target is None else accounts.workspaces_of(tx, target.id)
    if target is None or not workspaces:
        raise NotFound("no account uses the target email", code="target_not_found")
    to_org = workspaces[0]
    if to_org.id == domain.workspace_id:
        raise Conflict("the domain already belongs to that workspace", code="self_transfer")
    source = transfers.workspace_owner(tx, domain.workspace_id)
    for active in transfers.active_for_domain(tx, domain.id):
        if transfers.set_ended(tx, active.id, active.status, rules.CANCELLED, now):
            _log_both(tx, active, req.admin.user_email, "transfer.cancelled", now, reason="forced")
    t = Transfer(
        id=new_id(),
        domain_id=domain.id,
        domain_name=domain.name,
        source_user_id=source[0],
        source_org_id=domain.workspace_id,
        source_label=source[1],
        target_email=target.email,
        target_user_id=target.id,
        target_org_id=to_org.id,
        status=rules.COMPLETED,
        note="",
        rotate_dkim=req.rotate_dkim,
        forced_by=req.admin.user_email,
        cooloff_until=None,
        initiated_at=now,
        accepted_at=now,
        completed_at=now,
        ended_at=None,
        expires_at=now + rules.EXPIRY,
    )
    transfers.insert(tx, t, None)
    _move(tx, t, to_org.id, key, req.admin.user_email, now)
    _log_both(tx, t, req.admin.user_email, "transfer.forced", now, rotate_dkim=req.rotate_dkim)
    return t


async def force(rt: Runtime, req: ForceRequest) -> Transfer:
    """Move a domain at once for a re-authenticated platform admin: completed, irreversible."""
    await require_admin(rt, req.admin)
    until = req.reauthenticated_until
    if req.admin.session_id is None or until is None or until <= rt.clock.now():
        raise Forbidden(
            "re-authenticate first: POST /v1/auth/reauth with your password (valid 5 minutes)",
            code="reauth_required",
        )
    target = normalize_email(req.target_email, "target_email")
    key = await _new_key() if req.rotate_dkim else None
    return await rt.db.write(
        _force,
        ForceRequest(req.admin, until, req.domain_id, target, req.rotate_dkim),
        key,
        rt.clock.now(),
    )
