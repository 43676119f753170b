"""Teams as tests set them up: an owner's session in their workspace, an invitation mailed
and its link, and a new user who signs up through it into the owner's workspace."""

from __future__ import annotations

import re
import secrets
from typing import Any

import httpx

from tests.harness.mailbox import mail_to, text_of
from tests.harness.service import Account, Service
from tests.harness.sessions import SAME_ORIGIN, session_token, with_cookie
from tests.harness.smtp_sink import SmtpSink

INVITE_LINK = re.compile(r"/invitations/([A-Za-z0-9_-]{20,})")
PASSWORD = "correct horse battery staple"


async def invitation_token(sink: SmtpSink, email: str) -> str:
    found = INVITE_LINK.search(text_of(await mail_to(sink, email, "Join")))
    assert found is not None
    return found.group(1)


async def invite(service: Service, owner: Account, email: str, role: str) -> dict[str, Any]:
    """Invite as the owner, signed in (an API key does not change the team)."""
    client = await owner_session(service, owner)
    response = await client.post("/v1/workspace/invitations", json={"email": email, "role": role})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def session_of(service: Service, email: str, workspace_id: str) -> httpx.AsyncClient:
    response = await service.client().post(
        "/v1/auth/login", json={"email": email, "password": PASSWORD}
    )
    assert response.status_code == 200, response.text
    return with_cookie(
        service,
        response.cookies["postroom_session"],
        **SAME_ORIGIN,
        **{"X-Workspace-Id": workspace_id},
    )


async def join_as_new_user(
    service: Service, owner: Account, sink: SmtpSink, role: str
) -> tuple[str, httpx.AsyncClient]:
    """Invite a new address with `role`, sign it up through the link; its email and a session
    in the owner's workspace."""
    email = f"invitee-{secrets.token_hex(4)}@example.org"
    await invite(service, owner, email, role)
    token = await invitation_token(sink, email)
    joined = await service.client().post(
        "/v1/workspace/invitations/sign-up", json={"token": token, "password": PASSWORD}
    )
    assert joined.status_code == 201, joined.text
    assert joined.json() == {"workspace_id": owner.workspace_id}
    return email, await session_of(service, email, owner.workspace_id)


async def owner_session(service: Service, owner: Account) -> httpx.AsyncClient:
    token = await session_token(service, owner)
    return with_cookie(service, token, **SAME_ORIGIN, **{"X-Workspace-Id": owner.workspace_id})
