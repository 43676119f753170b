"""A workspace's team: its members and their roles, invitations by email, leaving, removing
and handing the workspace over.

Rules: a workspace has exactly one owner at any time (the member whose role is `owner`, also
named by the workspace row); ownership moves only by a hand-over, which makes the old owner an
admin, so the owner cannot leave nor be removed. An invitation carries a random token that
only its email holds (stored as its hash), is used once and lapses after seven days. A member
removed loses the workspace at once: sessions read their memberships on every request
(engine/accounts/auth.py). Every change is logged under the activity category Team.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.accounts.passwords import token_hash
from engine.accounts.users import MIN_PASSWORD_LENGTH
from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.platform.errors import Conflict, Forbidden, Gone, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.transfers import notices
from engine.transfers.notices import Notice, SystemSender
from storage import accounts, sandbox, team
from storage.accounts import User
from storage.codec import new_id
from storage.team import Invitation, Member
from storage.tx import Tx

INVITATION_LIFETIME = timedelta(days=7)
# Roles an invitation or a role change may give: the owner's comes only by a hand-over.
GRANTABLE = ("admin", "developer", "viewer")


def _log(tx: Tx, who: Principal, workspace_id: str, change: Change, now: datetime) -> None:
    record(tx, workspace_id, who.user_email, change, now)


def _grantable(role: str) -> str:
    if role not in GRANTABLE:
        raise Unprocessable(
            f"role must be one of {', '.join(GRANTABLE)}; the owner's role moves by a hand-over"
        )
    return role


async def members(rt: Runtime, who: Principal) -> list[Member]:
    """The workspace's members, first joined first."""
    return await rt.db.read(team.members, who.workspace_id)


def _other_member(tx: Tx, who: Principal, user_id: str) -> Member:
    found = team.member(tx, who.workspace_id, user_id, lock=True)
    if found is None:
        raise NotFound("member not found")
    if found.user_id == who.user_id:
        raise Conflict("this is you: leave the workspace instead", code="self_change")
    if found.role == "owner":
        raise Conflict(
            "the owner keeps the owner's role until they hand the workspace over",
            code="owner_unchangeable",
        )
    return found


def _change_role(tx: Tx, who: Principal, user_id: str, role: str, now: datetime) -> Member:
    found = _other_member(tx, who, user_id)
    if found.role != role:
        team.set_role(tx, who.workspace_id, user_id, role)
        change = Change(
            "member.role_changed", found.email, user_id, {"from": found.role, "to": role}
        )
        _log(tx, who, who.workspace_id, change, now)
    return Member(found.user_id, found.email, role, found.joined_at)


async def change_role(rt: Runtime, who: Principal, user_id: str, role: str) -> Member:
    """Give another member (not the owner) a new role."""
    return await rt.db.write(_change_role, who, user_id, _grantable(role), rt.clock.now())


def _remove(tx: Tx, who: Principal, user_id: str, now: datetime) -> None:
    found = _other_member(tx, who, user_id)
    team.remove_member(tx, who.workspace_id, user_id)
    _log(tx, who, who.workspace_id, Change("member.removed", found.email, user_id), now)


async def remove(rt: Runtime, who: Principal, user_id: str) -> None:
    """Take another member (not the owner) out of the workspace; their sessions lose it at
    once. The API keys they made stay: keys belong to the workspace."""
    await rt.db.write(_remove, who, user_id, rt.clock.now())


def _leave(tx: Tx, who: Principal, now: datetime) -> None:
    found = team.member(tx, who.workspace_id, who.user_id, lock=True)
    if found is None:
        raise NotFound("member not found")
    if found.role == "owner":
        raise Conflict(
            "the owner cannot leave: hand the workspace over to another member first",
            code="owner_cannot_leave",
        )
    team.remove_member(tx, who.workspace_id, who.user_id)
    _log(tx, who, who.workspace_id, Change("member.left", found.email, who.user_id), now)


async def leave(rt: Runtime, who: Principal) -> None:
    """Leave the workspace (the owner hands it over first)."""
    if who.session_id is None:
        raise Forbidden("leaving a workspace needs a person's session, not an API key")
    await rt.db.write(_leave, who, rt.clock.now())


def _hand_over(tx: Tx, who: Principal, user_id: str, now: datetime) -> Member:
    me = team.member(tx, who.workspace_id, who.user_id, lock=True)
    if me is None or me.role != "owner":
        raise Forbidden("only the owner hands the workspace over", code="role_forbidden")
    found = team.member(tx, who.workspace_id, user_id)
    if found is None:
        raise NotFound("member not found")
    if found.user_id == who.user_id:
        raise Conflict("you own the workspace already", code="self_change")
    team.set_role(tx, who.workspace_id, who.user_id, "admin")
    team.set_role(tx, who.workspace_id, user_id, "owner")
    team.set_owner(tx, who.workspace_id, user_id)
    change = Change("member.ownership_transferred", found.email, user_id, {"from": me.email})
    _log(tx, who, who.workspace_id, change, now)
    return Member(found.user_id, found.email, "owner", found.joined_at)


async def hand_over(rt: Runtime, who: Principal, user_id: str) -> Member:
    """Make another member the owner; the old owner becomes an admin."""
    return await rt.db.write(_hand_over, who, user_id, rt.clock.now())


# Invitations.


@dataclass(frozen=True, slots=True)
class Invited:
    invitation: Invitation
    token: str  # only in the mail, never in an answer: the invitee's credential


def invitation_link(public_url: str, token: str) -> str:
    """The console page an invitee opens to join."""
    return f"{public_url}/invitations/{token}"


def _invitation_notice(
    invitation: Invitation, workspace_name: str, token: str, public_url: str
) -> Notice:
    link = invitation_link(public_url, token)
    text = (
        f"{invitation.invited_by} invites you to the Postroom workspace {workspace_name}"
        f" as {invitation.role}.\n\n"
        "To join, open this link and sign in, or create your account (it works once; it is"
        " your credential, keep it private):\n\n"
        f"    {link}\n\n"
        "Already have an account? You may also sign in and join from the Team page.\n"
        f"The invitation expires on {invitation.expires_at.strftime('%Y-%m-%d %H:%M UTC')}.\n"
    )
    return Notice(invitation.email, f"Join {workspace_name} on Postroom", text)


def _invite(
    tx: Tx,
    who: Principal,
    invitation: Invitation,
    token: str,
    sender: SystemSender,
    public_url: str,
) -> Invitation:
    invitee = accounts.user_by_email(tx, invitation.email)
    if invitee is not None and team.member(tx, who.workspace_id, invitee.id) is not None:
        raise Conflict(f"{invitation.email} is a member already", code="already_member")
    pending = team.pending_invitations(tx, who.workspace_id, invitation.created_at)
    if any(p.email == invitation.email for p in pending):
        raise Conflict(
            f"{invitation.email} has a pending invitation: revoke it to send another",
            code="invitation_pending",
        )
    team.insert_invitation(tx, invitation, token_hash(token))
    workspace = next(w for w in accounts.workspaces_of(tx, who.user_id) if w.id == who.workspace_id)
    notice = _invitation_notice(invitation, workspace.name, token, public_url)
    now = invitation.created_at
    if sandbox.is_sandboxed(tx, who.workspace_id):
        # Nothing a sandboxed workspace does leaves the machine; the link is withheld, as
        # the invitee's credential is from the members who can read the sandbox.
        notices.capture(tx, sender, notice, who.workspace_id, invitation.id, now, token)
    else:
        notices.queue(tx, sender, notice, now, tags=("team-invitation",))
    change = Change("member.invited", invitation.email, invitation.id, {"role": invitation.role})
    _log(tx, who, who.workspace_id, change, now)
    return invitation


async def invite(rt: Runtime, who: Principal, email: str, role: str) -> Invitation:
    """Invite `email` to the workspace with `role`: one mail with a one-time link."""
    address = normalize_email(email)
    now = rt.clock.now()
    invitation = Invitation(
        id=new_id(),
        workspace_id=who.workspace_id,
        email=address,
        role=_grantable(role),
        invited_by=who.user_email,
        created_at=now,
        expires_at=now + INVITATION_LIFETIME,
        accepted_at=None,
        revoked_at=None,
    )
    token = secrets.token_urlsafe(32)
    sender = await notices.system_sender(rt)
    return await rt.db.write(_invite, who, invitation, token, sender, rt.public_url)


async def pending(rt: Runtime, who: Principal) -> list[Invitation]:
    """The workspace's invitations not yet used, revoked nor expired, newest first."""
    return await rt.db.read(team.pending_invitations, who.workspace_id, rt.clock.now())


def _revoke(tx: Tx, who: Principal, invitation_id: str, now: datetime) -> None:
    found = team.invitation(tx, who.workspace_id, invitation_id)
    if found is None or not team.mark_revoked(tx, invitation_id, now):
        raise NotFound("invitation not found or no longer pending")
    change = Change("member.invitation_revoked", found.email, found.id)
    _log(tx, who, who.workspace_id, change, now)


async def revoke(rt: Runtime, who: Principal, invitation_id: str) -> None:
    await rt.db.write(_revoke, who, invitation_id, rt.clock.now())


def _open(found: Invitation | None, now: datetime) -> Invitation:
    if found is None or found.accepted_at is not None or found.revoked_at is not None:
        raise NotFound("the invitation link is invalid or was already used")
    if found.expires_at <= now:
        raise Gone("the invitation expired: ask for a new one", code="expired")
    return found


def _usable(tx: Tx, token: str, now: datetime) -> Invitation:
    return _open(team.invitation_by_token(tx, token_hash(token)), now)


@dataclass(frozen=True, slots=True)
class InvitationView:
    invitation: Invitation
    workspace_name: str
    has_account: bool


def _view(tx: Tx, token: str, now: datetime) -> InvitationView:
    found = _usable(tx, token, now)
    workspace_name = str(
        tx.value("SELECT name FROM workspaces WHERE id = :id", {"id": found.workspace_id})
    )
    return InvitationView(
        found, workspace_name, accounts.user_by_email(tx, found.email) is not None
    )


async def view(rt: Runtime, token: str) -> InvitationView:
    """What an invitation link offers (NotFound / Gone as accepting it would say)."""
    return await rt.db.read(_view, token, rt.clock.now())


def _join(tx: Tx, found: Invitation, user: User, now: datetime) -> str:
    if not team.mark_accepted(tx, found.id, now):
        raise NotFound("the invitation link is invalid or was already used")
    if team.member(tx, found.workspace_id, user.id) is not None:
        raise Conflict("you are a member of this workspace already", code="already_member")
    team.add_member(tx, found.workspace_id, user.id, found.role, now)
    change = Change("member.joined", user.email, user.id, {"role": found.role})
    record(tx, found.workspace_id, user.email, change, now)
    return found.workspace_id


def _accept(tx: Tx, token: str | None, invitation_id: str, who: Principal, now: datetime) -> str:
    if token is not None:
        found = _usable(tx, token, now)
    else:
        found = _open(team.invitation_by_id(tx, invitation_id), now)
    if found.email != who.user_email:
        raise Forbidden(
            f"this invitation is for {found.email}: sign in with that account",
            code="wrong_recipient",
        )
    user = accounts.user_by_id(tx, who.user_id)
    assert user is not None
    return _join(tx, found, user, now)


async def accept(rt: Runtime, who: Principal, token: str | None, invitation_id: str = "") -> str:
    """Join the invitation's workspace as the signed-in user, named by its link's `token` or,
    by the invitee signed in as its address, by its id (a sandboxed workspace's invitation
    mail is kept in its sandbox without the link); the workspace's id."""
    if who.session_id is None:
        raise Forbidden("accepting an invitation needs a person's session, not an API key")
    return await rt.db.write(_accept, token, invitation_id, who, rt.clock.now())


@dataclass(frozen=True, slots=True)
class Offer:
    invitation: Invitation
    workspace_name: str


async def offers(rt: Runtime, who: Principal) -> list[Offer]:
    """The open invitations addressed to the signed-in user."""
    found = await rt.db.read(team.pending_for, who.user_email, rt.clock.now())
    return [Offer(invitation, name) for invitation, name in found]


def _sign_up(tx: Tx, token: str, user_id: str, password_hash: str, now: datetime) -> str:
    found = _usable(tx, token, now)
    if accounts.user_by_email(tx, found.email) is not None:
        raise Conflict(
            f"an account with {found.email} already exists: sign in to accept",
            code="email_taken",
        )
    user = User(user_id, found.email, password_hash, False, now)
    accounts.insert_user(tx, user)
    return _join(tx, found, user, now)


async def sign_up(rt: Runtime, token: str, password: str) -> str:
    """Create the invitee's account (no workspace of its own) and join; the workspace's id.
    The new user then signs in as anyone does."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise Unprocessable(f"the password must have at least {MIN_PASSWORD_LENGTH} characters")
    await rt.db.read(_usable, token, rt.clock.now())  # no argon2 spent on a dead link
    password_hash = await rt.passwords.hash(password)
    return await rt.db.write(_sign_up, token, new_id(), password_hash, rt.clock.now())
