"""Teams: the role table, invitations by email (mail with a one-time link, sign-up or sign-in
to accept, expiry, revoke), members (roles, removal that ends access at once, leaving, the
ownership hand-over), the Team activity entries, and transfers into a workspace the caller no
longer belongs to (`org_access_lost`).

Tokens are read out of the mail that reaches the SMTP sink, as an invitee would read them.
"""

from __future__ import annotations

import secrets
from types import SimpleNamespace
from typing import Any

import httpx
from trio.testing import MockClock

import console
from api.app import create_app
from api.permissions import BLUEPRINT_AREAS, ENDPOINT_AREAS, area_of
from engine.accounts import roles
from tests.harness.api import assert_error
from tests.harness.dns_server import DnsServer
from tests.harness.sending import only_domain_id, route_mail
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.team import (
    PASSWORD,
    invitation_token,
    invite,
    join_as_new_user,
    owner_session,
    session_of,
)
from tests.harness.transfers import initiate, setup


def test_the_role_table_gives_each_role_less_than_the_one_above() -> None:
    may = roles.MAY_CHANGE
    assert set(roles.ROLES) <= set(may)
    assert may["viewer"] == {roles.SELF}
    assert may["viewer"] < may["developer"] < may["admin"] < may["owner"]
    assert roles.MEMBERS in may["admin"] and roles.OWNERSHIP not in may["admin"]
    assert roles.DOMAINS not in may["developer"] and roles.KEYS in may["developer"]
    # A key acts as an admin but for the team itself.
    assert may[roles.KEY_ROLE] == may["admin"] - {roles.MEMBERS}


def test_every_route_that_changes_something_has_its_area_named() -> None:
    app = create_app(SimpleNamespace(domain_transfers=True), None, None, None)  # type: ignore[arg-type]
    console.install(app)  # as postroom/service.py puts the front doors together
    unsafe = {
        rule.endpoint.removeprefix("console.")
        for rule in app.url_map.iter_rules()
        if set(rule.methods or ()) - {"GET", "HEAD", "OPTIONS"}
    }
    public = {"health", "tracking"}  # no principal: nothing to authorise
    unnamed = {
        e
        for e in unsafe
        if e not in ENDPOINT_AREAS and e.partition(".")[0] not in BLUEPRINT_AREAS.keys() | public
    }
    assert unnamed == set()
    assert unsafe >= set(ENDPOINT_AREAS)
    assert area_of("console.account.change_mcp_policy") == roles.MCP_POLICY
    assert area_of("domains.create") == roles.DOMAINS
    assert area_of("console.delivery.resolve_incident") == roles.DELIVERY
    assert area_of("later.added") == roles.WORKSPACE


async def members(client: httpx.AsyncClient) -> dict[str, str]:
    response = await client.get("/v1/workspace/members")
    assert response.status_code == 200, response.text
    return {m["email"]: m["role"] for m in response.json()}


async def team_actions(client: httpx.AsyncClient) -> list[str]:
    page = (await client.get("/v1/audit-log?range=7d&category=team")).json()
    return sorted(item["action"] for item in page["items"])


async def test_an_invitee_signs_up_through_the_link_once_and_a_viewer_only_reads(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    route_mail(dns_server, "example.org")
    owner = await service.account("starter")
    owner_client = await owner_session(service, owner)
    email = f"viewer-{secrets.token_hex(4)}@example.org"

    invited = await invite(service, owner, email, "viewer")
    assert invited["email"] == email and invited["role"] == "viewer"
    assert invited["invited_by"] == owner.email
    listed = (await owner.client.get("/v1/workspace/invitations")).json()
    assert [i["id"] for i in listed] == [invited["id"]]
    assert "token" not in listed[0]
    again = await owner_client.post(
        "/v1/workspace/invitations", json={"email": email, "role": "admin"}
    )
    assert_error(again, 409, "invitation_pending")

    token = await invitation_token(smtp_sink, email)
    short = await service.client().post(
        "/v1/workspace/invitations/sign-up", json={"token": token, "password": "short"}
    )
    assert short.status_code == 422
    joined = await service.client().post(
        "/v1/workspace/invitations/sign-up", json={"token": token, "password": PASSWORD}
    )
    assert joined.status_code == 201, joined.text
    reused = await service.client().post(
        "/v1/workspace/invitations/sign-up", json={"token": token, "password": PASSWORD}
    )
    assert_error(reused, 404, "not_found")
    assert (await owner.client.get("/v1/workspace/invitations")).json() == []
    assert await members(owner_client) == {owner.email: "owner", email: "viewer"}

    viewer = await session_of(service, email, owner.workspace_id)
    assert (await viewer.get("/v1/domains/")).status_code == 200
    assert_error(
        await viewer.post("/v1/domains/", json={"name": "v.example"}), 403, "role_forbidden"
    )
    assert_error(await viewer.post("/v1/api-keys/", json={"name": "mine"}), 403, "role_forbidden")
    assert (await viewer.get("/v1/workspace/members")).status_code == 200
    assert await team_actions(owner_client) == ["member.invited", "member.joined"]


async def test_a_developer_sends_and_keys_but_neither_domains_nor_the_team(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    route_mail(dns_server, "example.org")
    owner = await service.account("starter")
    _, developer = await join_as_new_user(service, owner, smtp_sink, "developer")

    assert (await developer.post("/v1/api-keys/", json={"name": "ci"})).status_code == 201
    refused = await developer.post("/v1/domains/", json={"name": "dev.example"})
    assert_error(refused, 403, "role_forbidden")
    invited = await developer.post(
        "/v1/workspace/invitations", json={"email": "x@example.org", "role": "viewer"}
    )
    assert_error(invited, 403, "role_forbidden")
    # An API key acts as keys always have, but does not change the team.
    assert (
        await owner.client.post("/v1/domains/", json={"name": "key.example"})
    ).status_code == 201
    by_key = await owner.client.get("/v1/workspace/members")
    assert by_key.status_code == 200
    first = by_key.json()[0]
    assert_error(
        await owner.client.patch(
            f"/v1/workspace/members/{first['user_id']}", json={"role": "viewer"}
        ),
        403,
        "role_forbidden",
    )


async def test_an_existing_user_accepts_signed_in_and_links_expire(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    route_mail(dns_server, "example.org")
    owner = await service.account("starter")
    member = await service.account()
    stranger = await service.account()
    await invite(service, owner, member.email, "admin")
    token = await invitation_token(smtp_sink, member.email)

    as_stranger = await (await owner_session(service, stranger)).post(
        "/v1/workspace/invitations/accept", json={"token": token}
    )
    assert_error(as_stranger, 403, "wrong_recipient")
    by_key = await member.client.post("/v1/workspace/invitations/accept", json={"token": token})
    assert by_key.status_code == 403
    signed_in = await owner_session(service, member)
    accepted = await signed_in.post("/v1/workspace/invitations/accept", json={"token": token})
    assert accepted.status_code == 200, accepted.text
    assert accepted.json() == {"workspace_id": owner.workspace_id}
    login = await service.client().post(
        "/v1/auth/login", json={"email": member.email, "password": member.password}
    )
    assert {w["id"] for w in login.json()["workspaces"]} == {
        member.workspace_id,
        owner.workspace_id,
    }

    late = f"late-{secrets.token_hex(4)}@example.org"
    await invite(service, owner, late, "viewer")
    late_token = await invitation_token(smtp_sink, late)
    clock.jump(7 * 24 * 3600 + 1)
    expired = await service.client().post(
        "/v1/workspace/invitations/sign-up", json={"token": late_token, "password": PASSWORD}
    )
    assert_error(expired, 410, "expired")
    assert (await owner.client.get("/v1/workspace/invitations")).json() == []


async def test_a_signed_in_invitee_accepts_by_id_without_the_link(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    route_mail(dns_server, "example.org")
    owner = await service.account("starter")
    member = await service.account()
    stranger = await service.account()
    invited = await invite(service, owner, member.email, "developer")
    path = f"/v1/workspace/invitations/by-id/{invited['id']}/accept"

    as_stranger = await (await owner_session(service, stranger)).post(path)
    assert_error(as_stranger, 403, "wrong_recipient")
    accepted = await (await owner_session(service, member)).post(path)
    assert accepted.status_code == 200, accepted.text
    assert_error(await (await owner_session(service, member)).post(path), 404, "not_found")
    assert (await members(await owner_session(service, owner)))[member.email] == "developer"


async def test_a_revoked_invitation_cannot_be_used(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    route_mail(dns_server, "example.org")
    owner = await service.account("starter")
    owner_client = await owner_session(service, owner)
    email = f"revoked-{secrets.token_hex(4)}@example.org"
    invited = await invite(service, owner, email, "developer")
    token = await invitation_token(smtp_sink, email)
    by_key = await owner.client.delete(f"/v1/workspace/invitations/{invited['id']}")
    assert_error(by_key, 403, "role_forbidden")
    gone = await owner_client.delete(f"/v1/workspace/invitations/{invited['id']}")
    assert gone.status_code == 204
    again = await owner_client.delete(f"/v1/workspace/invitations/{invited['id']}")
    assert_error(again, 404, "not_found")
    used = await service.client().post(
        "/v1/workspace/invitations/sign-up", json={"token": token, "password": PASSWORD}
    )
    assert_error(used, 404, "not_found")
    bad_role = await owner_client.post(
        "/v1/workspace/invitations", json={"email": email, "role": "owner"}
    )
    assert bad_role.status_code == 422
    unknown = await owner_client.post(
        "/v1/workspace/invitations", json={"email": email, "role": "viewer", "team": "x"}
    )
    assert unknown.status_code == 422


async def test_members_change_roles_are_removed_at_once_leave_and_hand_over(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    route_mail(dns_server, "example.org")
    owner = await service.account("starter")
    owner_client = await owner_session(service, owner)
    admin_email, admin = await join_as_new_user(service, owner, smtp_sink, "admin")
    dev_email, developer = await join_as_new_user(service, owner, smtp_sink, "developer")
    ids = {
        m["email"]: m["user_id"] for m in (await owner_client.get("/v1/workspace/members")).json()
    }

    promoted = await admin.patch(f"/v1/workspace/members/{ids[dev_email]}", json={"role": "viewer"})
    assert promoted.status_code == 200, promoted.text
    assert promoted.json()["role"] == "viewer"
    assert_error(
        await admin.patch(f"/v1/workspace/members/{ids[owner.email]}", json={"role": "viewer"}),
        409,
        "owner_unchangeable",
    )
    assert_error(
        await admin.delete(f"/v1/workspace/members/{ids[owner.email]}"), 409, "owner_unchangeable"
    )
    assert_error(await owner_client.post("/v1/workspace/members/leave"), 409, "owner_cannot_leave")
    assert_error(
        await admin.post(f"/v1/workspace/members/{ids[dev_email]}/ownership"), 403, "role_forbidden"
    )

    # Removed: the very next request finds the workspace gone.
    assert (await developer.get("/v1/domains/")).status_code == 200
    assert (await admin.delete(f"/v1/workspace/members/{ids[dev_email]}")).status_code == 204
    # (an invitee who signed up has no workspace of their own left)
    assert_error(await developer.get("/v1/domains/"), 403, "forbidden")

    handed = await owner_client.post(f"/v1/workspace/members/{ids[admin_email]}/ownership")
    assert handed.status_code == 200, handed.text
    assert await members(owner_client) == {owner.email: "admin", admin_email: "owner"}
    assert (await owner_client.post("/v1/workspace/members/leave")).status_code == 204
    assert await members(admin) == {admin_email: "owner"}
    assert await team_actions(admin) == [
        "member.invited",
        "member.invited",
        "member.joined",
        "member.joined",
        "member.left",
        "member.ownership_transferred",
        "member.removed",
        "member.role_changed",
    ]


async def test_a_transfer_into_a_team_needs_a_role_that_manages_domains_and_membership(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    source, target, domain = await setup(service, dns_server)
    team_owner = await service.account("starter")
    await invite(service, team_owner, target.email, "viewer")
    token = await invitation_token(smtp_sink, target.email)
    target_client = await owner_session(service, target)
    joined = await target_client.post("/v1/workspace/invitations/accept", json={"token": token})
    assert joined.status_code == 200, joined.text
    started = await initiate(source, target, domain)

    by_id = f"/v1/domain-transfers/by-id/{started['id']}/accept"
    into_team = {"target_org_id": team_owner.workspace_id}
    # A viewer does not take a domain into the team's workspace.
    assert_error(await target_client.post(by_id, json=into_team), 403, "role_forbidden")

    owner_client = await owner_session(service, team_owner)
    assert (await owner_client.delete(f"/v1/workspace/members/{target.user_id}")).status_code == 204

    lost = await target_client.post(by_id, json={"target_org_id": team_owner.workspace_id})
    assert_error(lost, 403, "org_access_lost")
    assert await only_domain_id(source) == domain  # nothing moved


async def test_a_viewer_reads_through_the_mcp_door_but_does_not_send(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    route_mail(dns_server, "example.org")
    owner = await service.account("starter")
    owner_client = await owner_session(service, owner)
    policy = await owner_client.patch("/v1/mcp/policy", json={"policy": "send"})
    assert policy.status_code == 200, policy.text
    _, viewer = await join_as_new_user(service, owner, smtp_sink, "viewer")
    accept = {"Accept": "application/json, text/event-stream"}

    async def tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        answer = await viewer.post("/mcp", json=call, headers=accept)
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()["result"]
        return result

    listed = await tool("list_domains", {})
    assert not listed.get("isError"), listed
    added = await tool("add_suppression", {"email": "someone@example.net"})
    assert added["isError"] is True
    assert added["structuredContent"]["code"] == "role_forbidden"
