"""The area of the role table (engine/accounts/roles.py) each API and console route changes.

Routes are named by endpoint (`blueprint.function`; console pages without their `console.`
prefix). An endpoint named here takes its own area, others their blueprint's; a blueprint
named nowhere is the workspace's owners' and admins' to change, so a route added later is
refused to developers and viewers until someone decides otherwise. Reads are every member's.
"""

from __future__ import annotations

from engine.accounts import roles
from engine.platform.errors import Forbidden
from engine.platform.runtime import Principal

BLUEPRINT_AREAS = {
    # The API's blueprints.
    "sessions": roles.SELF,
    "totp": roles.SELF,
    "emails": roles.SEND,
    "broadcasts": roles.SEND,
    "templates": roles.SEND,
    "contacts": roles.SEND,
    "suppressions": roles.SEND,
    "verify": roles.SEND,
    "api_keys": roles.KEYS,
    "smtp_credentials": roles.KEYS,
    "webhooks": roles.WEBHOOKS,
    "domains": roles.DOMAINS,
    "senders": roles.DOMAINS,
    "transfers": roles.DOMAINS,
    "bimi": roles.DOMAINS,
    "forwards": roles.DOMAINS,
    "compliance": roles.DOMAINS,
    "dmarc_reports": roles.DOMAINS,
    "tls_reports": roles.DOMAINS,
    "postmaster_mail": roles.DOMAINS,
    "delivery": roles.DELIVERY,
    "delivery_incidents": roles.DELIVERY,
    "queue": roles.DELIVERY,
    "complaint_guard": roles.DELIVERY,
    "mcp_policy": roles.MCP_POLICY,
    "privacy": roles.WORKSPACE,
    "unsubscribe_footer": roles.WORKSPACE,
    "sandbox": roles.WORKSPACE,
    "members": roles.MEMBERS,
    "invitations": roles.MEMBERS,
    # Platform administration: `is_admin` and a fresh re-authentication decide (api/auth.py).
    "admin": roles.SELF,
    "egress": roles.SELF,
    "nodes": roles.SELF,
    # The console's pages (the Delivery page's blueprint is "delivery", as the API's is).
    "auth": roles.SELF,
    "workspaces": roles.SELF,
    "keys": roles.KEYS,
    "postmaster": roles.DOMAINS,
    "team": roles.MEMBERS,
}
ENDPOINT_AREAS = {
    "sandbox.create_test_key": roles.KEYS,
    "sandbox.mark_verified": roles.DOMAINS,
    "account.change_password": roles.SELF,
    "account.change_mcp_policy": roles.MCP_POLICY,
    "members.leave": roles.SELF,
    "invitations.accept": roles.SELF,  # joining another workspace, whatever the role here
    "invitations.accept_by_id": roles.SELF,
    "members.hand_over": roles.OWNERSHIP,
    "team.leave": roles.SELF,
    "team.accept": roles.SELF,
    "team.accept_by_id": roles.SELF,
    "team.hand_over": roles.OWNERSHIP,
    "totp.set_requirement": roles.SECURITY,
    "account.two_factor_enrol": roles.SELF,
    "account.two_factor_confirm": roles.SELF,
    "account.two_factor_disable": roles.SELF,
    "account.two_factor_requirement": roles.SECURITY,
}


def area_of(endpoint: str) -> str:
    """The area a change through `endpoint` falls in."""
    name = endpoint.removeprefix("console.")
    found = ENDPOINT_AREAS.get(name)
    if found is not None:
        return found
    return BLUEPRINT_AREAS.get(name.partition(".")[0], roles.WORKSPACE)


def authorise_change(who: Principal, endpoint: str) -> None:
    """Forbidden `role_forbidden` unless the caller's role may change what `endpoint` does."""
    roles.require(who.role, area_of(endpoint))


# What a member without two-factor sign-in may still do in a workspace that requires it:
# enrol, and sign out. Everything else answers 403 `two_factor_required` (the console sends
# them to the enrol page).
WITHOUT_TWO_FACTOR = frozenset(
    {
        "totp.status",
        "totp.enrol",
        "totp.confirm",
        "sessions.logout",
        "account.two_factor",
        "account.two_factor_enrol",
        "account.two_factor_confirm",
        "auth.sign_out",
    }
)


def allowed_without_two_factor(endpoint: str) -> bool:
    return endpoint.removeprefix("console.") in WITHOUT_TWO_FACTOR


def require_two_factor(missing: bool, endpoint: str) -> None:
    """Forbidden `two_factor_required` when the caller's workspace requires two-factor sign-in
    they have not set up, unless `endpoint` is one that sets it up."""
    if missing and not allowed_without_two_factor(endpoint):
        raise Forbidden(
            "this workspace requires two-factor sign-in: set it up at /v1/auth/totp/enrol"
            " (or on the console's account page) first",
            code="two_factor_required",
        )
