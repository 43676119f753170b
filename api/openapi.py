"""The `/openapi.json` quart-schema builds, with the error responses each operation can give.

Every error has one body (`Error`, api/errors.py), so the errors are declared here once rather
than on each route: most follow from what a route is (authenticated: 401; an unsafe method a
session may call: 403 for a foreign Origin; a path id: 404; a JSON body: 413, 415, 422; a
query model: 422), and the rest, the refusals particular to a route (plan gates, conflicts,
rate limits), are listed in `DECLARED` by endpoint. Each operation's summary and description
come from `OPERATIONS` (or the route's docstring), its tag from its blueprint (`TAGS`); its
security says whether it needs a credential. `/docs` is Swagger UI in a page of ours. Operation ids are made unique. Files (the console's assets) are not API
operations and are left out.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, render_template_string, url_for
from quart_schema import hide
from quart_schema.openapi import OpenAPIProvider
from quart_schema.validation import (
    QUART_SCHEMA_QUERYSTRING_ATTRIBUTE,
    QUART_SCHEMA_REQUEST_ATTRIBUTE,
)
from werkzeug.routing import Rule

# `/docs`: Swagger UI 5.4.2 (the version quart-schema names) from api/static/docs, in a page of
# our own rather than quart-schema's: it has a language and a viewport, starts Swagger from a
# file (no inline script), and docs.css raises Swagger's greys to a readable contrast.
docs = Blueprint("docs", __name__)
DOCS_ASSETS = "docs"  # under the application's static folder (api/static)
DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>Postroom API</title>
  <link rel="stylesheet" href="{{ asset('swagger-ui.css') }}">
  <link rel="stylesheet" href="{{ asset('docs.css') }}">
  <script src="{{ asset('swagger-ui-bundle.js') }}" defer></script>
  <script src="{{ asset('docs.js') }}" defer></script>
</head>
<body data-openapi="{{ url_for('openapi') }}">
  <main id="swagger-ui" aria-label="Postroom API reference">
    <h1>Postroom API</h1>
    <p>The reference needs JavaScript; the document itself is at
      <a href="{{ url_for('openapi') }}">/openapi.json</a>.</p>
  </main>
</body>
</html>
"""


@docs.get("/docs")
@hide
async def docs_page() -> Response:
    """The API reference, for people."""

    def asset(name: str) -> str:
        return url_for("static", filename=f"{DOCS_ASSETS}/{name}")

    body = await render_template_string(DOCS_PAGE, asset=asset)
    return Response(body, content_type="text/html; charset=utf-8")


ERROR_SCHEMA = {
    "type": "object",
    "description": "The body of every error.",
    "required": ["code", "detail"],
    "properties": {
        "code": {"type": "string", "description": "snake_case, stable: branch on it"},
        "detail": {"type": "string", "description": "what went wrong, for people"},
        "errors": {
            "type": "array",
            "description": "validation problems (code validation_error)",
            "items": {
                "type": "object",
                "required": ["loc", "msg"],
                "properties": {
                    "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
                    "msg": {"type": "string"},
                },
            },
        },
    },
    "additionalProperties": True,  # e.g. `blockers` on broadcasts_in_flight
}

MEANING = {
    400: "The request cannot be carried out as asked (see `code`).",
    401: "Missing or invalid credentials (code unauthorized).",
    403: "Not allowed: the plan's gate or limit (plan_feature, plan_limit), the caller's role,"
    " a session request whose Origin is not the service's (csrf_failed), or a session in a"
    " workspace that requires two-factor sign-in the caller has not set up"
    " (two_factor_required).",
    404: "Not found, or not this workspace's (code not_found).",
    409: "Conflicts with the current state of the resource (see `code`).",
    410: "No longer available (code expired).",
    413: "The body is too large (code payload_too_large).",
    415: "The body is not JSON (code unsupported_media_type).",
    422: "The request failed validation (code validation_error, `errors` lists each problem).",
    429: "Too many requests (code rate_limited); try again after `Retry-After` seconds.",
}

# The refusals particular to a route, by endpoint (blueprint.function), beyond those its
# shape implies; tests/test_openapi.py checks that each names a route that exists.
DECLARED: dict[str, tuple[int, ...]] = {
    "delivery_incidents.resolve_incident": (409,),
    "health.metrics": (401,),
    "tracking.clicked": (400, 404),
    "tracking.opened": (404,),
    "tracking.unsubscribe_page": (400,),
    "tracking.unsubscribe": (400,),
    "sessions.login": (401, 429),
    "sessions.reauth": (401, 429),
    "totp.enrol": (409,),
    "totp.confirm": (409, 429),
    "totp.disable": (409, 429),
    "totp.login": (401, 429),
    "totp.set_requirement": (409,),
    "api_keys.create": (403,),
    "domains.create": (403, 409),
    "domains.verify": (409,),
    "senders.create": (409,),
    "emails.send": (400, 403, 409),
    "emails.send_batch": (400, 403, 409),
    "emails.retry": (403, 409),
    "emails.send_now": (409, 422),
    "emails.replace_saved_searches": (400,),
    "verify.verify": (429,),
    "bimi.status": (403,),
    "bimi.upload": (400, 403, 413),
    "bimi.enable": (400, 403),
    "forwards.create": (400, 403, 409),
    "forwards.update": (400, 403, 409),
    "smtp_credentials.create": (400, 403, 409),
    "contacts.create": (403,),
    "contacts.add_contact": (403, 409),
    "contacts.upload": (400, 403, 413, 422),
    "contacts.send": (400, 403, 409),
    "templates.create": (403,),
    "templates.update": (403,),
    "templates.duplicate": (403,),
    "templates.list_templates": (403,),
    "templates.get": (403,),
    "templates.delete": (403,),
    "webhooks.replay": (409,),
    "transfers.initiate": (409, 429),
    "transfers.accept_by_token": (403, 409, 410, 422),
    "transfers.accept_by_id": (403, 409, 410, 422),
    "transfers.decline": (403, 409),
    "transfers.cancel": (409,),
    "transfers.stop": (409,),
    "admin.force_transfer": (403, 409),
    "egress.list_sources": (403,),
    "egress.get_source": (403,),
    "egress.create_source": (409,),
    "egress.update_source": (409,),
    "egress.delete_source": (409,),
    "egress.list_pools": (403,),
    "egress.get_pool": (403,),
    "egress.create_pool": (404, 409),
    "egress.update_pool": (409,),
    "egress.delete_pool": (409,),
    "egress.workspace_pool": (403,),
    "egress.domain_pool": (403,),
    "nodes.list_nodes": (403,),
    "sandbox.switch": (403, 409),
    "sandbox.mark_verified": (403,),
    "sandbox.create_test_key": (403,),
    "mcp_policy.update": (403,),
}

# Successes no response model describes: (status, media type or None for no body, what it is).
# Every other operation documents its answer with `document_response`, or is a DELETE that
# answers 204 (tests/test_openapi.py checks that none is left vague).
SUCCESS: dict[str, tuple[int, str | None, str]] = {
    "members.leave": (204, None, "Left the workspace."),
    "sessions.logout": (204, None, "Signed out: the session is over and its cookie cleared."),
    "totp.disable": (204, None, "Two-factor sign-in is off."),
    "health.metrics": (200, "text/plain", "Prometheus's text exposition format."),
    "tracking.opened": (200, "image/gif", "A 1x1 transparent GIF."),
    "tracking.clicked": (302, None, "A redirect to the link's destination."),
    "tracking.unsubscribe_page": (200, "text/html", "A page asking to confirm."),
    "tracking.unsubscribe": (200, "text/html", "A page saying the address is unsubscribed."),
    "bimi.logo": (200, "image/svg+xml", "The domain's BIMI logo (SVG Tiny PS)."),
    "emails.export": (200, "text/csv", "The log as CSV, newest first."),
    "sandbox.source": (200, "message/rfc822", "The message as it would have been sent."),
}

# Headers a success carries beside its body, by endpoint: the body of the email log's pages
# stays the array the spec fixes, and what else a client needs comes in these.
HEADERS: dict[str, dict[str, str]] = {
    "emails.list_emails": {"X-Total-Count": "How many emails match in all."},
    "emails.search": {"X-Total-Count": "How many emails match in all."},
    "emails.export": {
        "X-Total-Count": "How many emails match in all.",
        "X-Row-Limit": "The most rows an export holds.",
    },
    "emails.updates": {
        "X-Next-Since": "The `since` of the changes after these: the last one's time.",
    },
}

# Each resource's tag, by blueprint: Swagger groups the operations by it.
TAGS: dict[str, str] = {
    "admin": "admin",
    "api_keys": "api-keys",
    "audit_log": "activity",
    "bimi": "domains",
    "broadcasts": "broadcasts",
    "complaint_guard": "workspace",
    "compliance": "domains",
    "contacts": "contacts",
    "delivery": "delivery-control",
    "delivery_incidents": "delivery-control",
    "dmarc_reports": "domains",
    "domains": "domains",
    "egress": "egress",
    "emails": "emails",
    "forwards": "forwards",
    "health": "health",
    "invitations": "team",
    "mcp_policy": "mcp",
    "members": "team",
    "nodes": "admin",
    "postmaster_mail": "domains",
    "privacy": "privacy",
    "queue": "delivery-control",
    "sandbox": "sandbox",
    "senders": "senders",
    "sessions": "sessions",
    "smtp_credentials": "smtp-credentials",
    "stats": "stats",
    "suppressions": "suppressions",
    "templates": "templates",
    "tls_reports": "domains",
    "totp": "sessions",
    "tracking": "tracking",
    "transfers": "domain-transfers",
    "unsubscribe_footer": "workspace",
    "verify": "verify",
    "webhooks": "webhooks",
}

# Each operation's summary and description, by endpoint (blueprint.function), where its route
# has no docstring of a summary line and a description (quart-schema reads those): the words
# people read in /docs, beside the errors. tests/test_openapi.py checks that every operation
# has both and that each entry names a route.
OPERATIONS: dict[str, tuple[str, str]] = {
    "egress.list_sources": (
        "List egress sources",
        "The operator's egress sources: a bind address and an EHLO name each (platform admins).",
    ),
    "egress.create_source": (
        "Create an egress source",
        "Adds a local address mail may leave from, with the name its connections greet with (platform admins).",
    ),
    "egress.get_source": (
        "Get an egress source",
        "One egress source (platform admins).",
    ),
    "egress.update_source": (
        "Update an egress source",
        "Changes a source's name, bind address or EHLO name (platform admins).",
    ),
    "egress.delete_source": (
        "Delete an egress source",
        "Removes a source no pool uses; 409 source_in_use while one does (platform admins).",
    ),
    "egress.list_pools": (
        "List egress pools",
        "The operator's pools of weighted egress sources (platform admins).",
    ),
    "egress.create_pool": (
        "Create an egress pool",
        "A named pool picking among its sources by weight (platform admins).",
    ),
    "egress.get_pool": (
        "Get an egress pool",
        "One pool with its weighted sources (platform admins).",
    ),
    "egress.update_pool": (
        "Update an egress pool",
        "Changes a pool's name or its weighted sources (platform admins).",
    ),
    "egress.delete_pool": (
        "Delete an egress pool",
        "Removes a pool no workspace or domain is assigned; 409 pool_in_use otherwise (platform admins).",
    ),
    "egress.workspace_pool": (
        "Get a workspace's egress pool",
        "The pool a workspace's mail leaves from, or null for the default (platform admins).",
    ),
    "egress.assign_workspace_pool": (
        "Assign a workspace's egress pool",
        "Sets (or clears with null) the pool a workspace's mail leaves from (platform admins).",
    ),
    "egress.domain_pool": (
        "Get a sending domain's egress pool",
        "The pool a sending domain's mail leaves from, or null (platform admins).",
    ),
    "egress.assign_domain_pool": (
        "Assign a sending domain's egress pool",
        "Sets (or clears with null) the pool a domain's mail leaves from; it wins over the workspace's (platform admins).",
    ),
    "emails.export": (
        "Export the email log as CSV",
        "The log filtered as the list is (q, source, created_from, created_before), newest first, at most 50,000 rows.",
    ),
    "invitations.list_invitations": (
        "List pending invitations",
        "The workspace's invitations not yet accepted, revoked or expired.",
    ),
    "invitations.invite": (
        "Invite someone to the workspace",
        "Mails a one-time link (7 days) granting admin, developer or viewer; 409 invitation_pending for an address already invited.",
    ),
    "invitations.revoke": (
        "Revoke an invitation",
        "The link stops working at once.",
    ),
    "invitations.accept": (
        "Accept an invitation",
        "The signed-in person joins the workspace with the invitation's token.",
    ),
    "invitations.accept_by_id": (
        "Accept an invitation by id",
        "The signed-in person joins without the link, when the invitation names their address.",
    ),
    "invitations.sign_up": (
        "Create an account from an invitation",
        "Creates an account with the invitation's token and a password, and joins the workspace.",
    ),
    "members.list_members": (
        "List the workspace's members",
        "Every member with their role.",
    ),
    "members.change_role": (
        "Change a member's role",
        "admin, developer or viewer; the owner's role moves only by hand-over.",
    ),
    "members.remove": (
        "Remove a member",
        "Their access to the workspace ends at their next request; the owner cannot be removed.",
    ),
    "members.leave": (
        "Leave the workspace",
        "The signed-in member leaves; the owner cannot (hand the workspace over first).",
    ),
    "members.hand_over": (
        "Hand the workspace over",
        "Makes another member the owner; the old owner becomes an admin.",
    ),
    "sandbox.pending_outcomes": (
        "List pending sandbox outcomes",
        "Scripted outcomes that happen later (complaint or bounce after a while), optionally for one email.",
    ),
    "sandbox.fast_forward": (
        "Fast-forward sandbox outcomes",
        "Makes pending scripted outcomes due now (all, or one email's); they happen within 15 s.",
    ),
    "sandbox.inject_inbound": (
        "Send a message in (sandbox)",
        "Passes a message to the workspace's forwarding rules as the MX would; sandbox only.",
    ),
    "admin.force_transfer": (
        "Force a domain transfer",
        "Moves a domain to another workspace at once, without the owner's consent (operators only).",
    ),
    "api_keys.create": (
        "Create an API key",
        "Creates a key for the workspace; its secret is shown in this answer only.",
    ),
    "api_keys.list_keys": ("List API keys", "The workspace's keys, without their secrets."),
    "api_keys.delete": (
        "Revoke an API key",
        "Revokes the key: requests made with it fail from now on.",
    ),
    "audit_log.audit_log": (
        "Read the activity log",
        "Who changed what in the workspace, newest first, filtered by category and time.",
    ),
    "bimi.status": (
        "BIMI status of a domain",
        "Whether the domain's logo, DMARC policy and BIMI record are ready for inboxes to show.",
    ),
    "bimi.upload": (
        "Upload a BIMI logo",
        "Stores the domain's logo as SVG Tiny PS after checking it runs and loads nothing.",
    ),
    "bimi.enable": (
        "Enable BIMI",
        "Turns BIMI on for the domain once its logo and DMARC allow it.",
    ),
    "bimi.logo": (
        "A domain's BIMI logo",
        "The public SVG logo mailbox providers fetch through the domain's BIMI record.",
    ),
    "broadcasts.list_broadcasts": (
        "List broadcasts",
        "The workspace's broadcasts to contact lists, newest first, with their progress.",
    ),
    "broadcasts.get": ("Get a broadcast", "One broadcast with its progress and, if paused, why."),
    "broadcasts.stats": (
        "A broadcast's figures",
        "Recipients sent, delivered, bounced, complained, opened and clicked (people and"
        " machines apart), and the rates they make, over all the broadcast's emails.",
    ),
    "broadcasts.resume": (
        "Resume a broadcast",
        "Resumes a broadcast the complaint guard paused, unless its domain's marketing mail is stopped.",
    ),
    "complaint_guard.get": (
        "Read the complaint guard",
        "The complaint rate at which the workspace's marketing mail pauses.",
    ),
    "complaint_guard.update": (
        "Change the complaint guard",
        "Sets the complaint rate at which broadcasts pause and a domain's marketing mail stops.",
    ),
    "contacts.create": ("Create a contact list", "Creates an empty contact list."),
    "contacts.list_lists": (
        "List contact lists",
        "The workspace's contact lists with their sizes.",
    ),
    "contacts.read": ("Get a contact list", "One contact list with a page of its contacts."),
    "contacts.update": ("Rename a contact list", "Changes the contact list's name."),
    "contacts.delete": ("Delete a contact list", "Deletes the list and its contacts."),
    "contacts.add_contact": ("Add a contact", "Adds one address to the contact list."),
    "contacts.remove_contact": ("Remove a contact", "Removes one contact from the list."),
    "contacts.upload": (
        "Import contacts from CSV",
        "Adds the addresses of an uploaded CSV file to the list, reporting the rows it skipped.",
    ),
    "contacts.send": (
        "Send a broadcast",
        "Sends one message to every contact of the list, skipping suppressed addresses.",
    ),
    "delivery.list_policies": (
        "List destination policies",
        "The workspace's per-destination limits on connections and sending rate.",
    ),
    "delivery.create_policy": (
        "Create a destination policy",
        "Limits how fast and over how many connections mail goes to a destination.",
    ),
    "delivery.get_policy": ("Get a destination policy", "One destination policy."),
    "delivery.update_policy": (
        "Change a destination policy",
        "Changes a destination policy's limits.",
    ),
    "delivery.delete_policy": (
        "Delete a destination policy",
        "Removes the policy: the destination gets the default limits again.",
    ),
    "delivery.list_ramps": (
        "List warm-up ramps",
        "The workspace's warm-up ramps: daily volumes that grow as a new domain or IP earns trust.",
    ),
    "delivery.create_ramp": (
        "Create a warm-up ramp",
        "Caps a sending domain's daily volume by a schedule that grows day by day.",
    ),
    "delivery.get_ramp": ("Get a warm-up ramp", "One warm-up ramp with today's cap."),
    "delivery.update_ramp": ("Change a warm-up ramp", "Changes a warm-up ramp's schedule."),
    "delivery.delete_ramp": (
        "Delete a warm-up ramp",
        "Removes the ramp: its domain's volume is no longer capped.",
    ),
    "delivery.delivery_forecast": (
        "Forecast the backlog",
        "When the queued mail should have gone, destination by destination, under the current limits.",
    ),
    "delivery.broadcast_forecast": (
        "Forecast a broadcast",
        "When the broadcast's remaining mail should have gone under the current limits.",
    ),
    "delivery_incidents.list_incidents": (
        "List destination incidents",
        "Destinations that are blocking or slowing the workspace's sending domains, and since when.",
    ),
    "delivery_incidents.resolve_incident": (
        "Resolve a destination incident",
        "Ends an open incident's pause at once, once what the destination complained of is fixed.",
    ),
    "dmarc_reports.dmarc": (
        "DMARC report summary",
        "What the aggregate DMARC reports received for the domain say, by source and result.",
    ),
    "domains.create": (
        "Add a sending domain",
        "Adds a domain and answers the DNS records (SPF, DKIM, DMARC) to publish for it.",
    ),
    "domains.list_domains": (
        "List sending domains",
        "The workspace's domains with their verification state.",
    ),
    "domains.get": ("Get a sending domain", "One domain with its DNS records and their state."),
    "domains.update": (
        "Change a sending domain",
        "Changes the domain's settings, such as open and click tracking.",
    ),
    "domains.verify": (
        "Verify a sending domain",
        "Looks up the domain's DNS records now and answers which are found.",
    ),
    "domains.delete": (
        "Delete a sending domain",
        "Removes the domain: mail can no longer be sent from it.",
    ),
    "domains.resume_marketing": (
        "Resume marketing mail",
        "Lets the domain send marketing mail again after the complaint guard stopped it.",
    ),
    "emails.send": (
        "Send an email",
        "Queues one email for delivery; an Idempotency-Key header makes retrying the request safe.",
    ),
    "emails.validate": (
        "Validate an email",
        "Checks a send request as sending would, without queueing anything.",
    ),
    "emails.search": (
        "Search the email log",
        "Emails matching a query such as `to:` or `status:`, newest first.",
    ),
    "emails.updates": (
        "Emails changed since",
        "The emails whose state changed after a point in time, for keeping a copy up to date.",
    ),
    "emails.send_batch": (
        "Send a batch of emails",
        "Queues up to 100 emails in one request; each entry is validated and answered on its own.",
    ),
    "emails.saved_searches": (
        "List saved searches",
        "The email-log searches saved for the workspace.",
    ),
    "emails.replace_saved_searches": (
        "Replace saved searches",
        "Replaces the workspace's saved email-log searches.",
    ),
    "emails.list_scheduled": ("List scheduled emails", "Emails waiting for their scheduled time."),
    "emails.cancel": ("Cancel a scheduled email", "Cancels an email that has not been sent yet."),
    "emails.send_now": (
        "Send a scheduled email now",
        "Sends a scheduled email at once instead of at its time.",
    ),
    "emails.list_emails": ("List emails", "The email log, newest first, by page."),
    "emails.get": ("Get an email", "One email with its recipients' states and its content."),
    "emails.events": (
        "List an email's events",
        "What happened to the email, in order: queued, sent, delivered, opened...",
    ),
    "emails.retry": ("Retry an email", "Sends a failed or bounced email again as a new email."),
    "forwards.logs": (
        "Forwarding log",
        "Inbound messages the forwarding rules handled, newest first.",
    ),
    "forwards.logs_count": (
        "Count forwarded messages",
        "How many entries of the forwarding log match the filter.",
    ),
    "stats.rates": (
        "Rates per domain, tag or broadcast",
        "Delivery, bounce, complaint, open and click rates of the workspace's mail created in"
        " the range, per sending domain, tag or broadcast; opens and clicks by machines"
        " (privacy proxies, link scanners) are counted apart and in no rate.",
    ),
    "forwards.stats": (
        "Forwarding statistics",
        "How many inbound messages were forwarded, refused or failed.",
    ),
    "forwards.create": (
        "Create a forwarding rule",
        "Forwards mail received for an address to a mailbox or a URL.",
    ),
    "forwards.list_forwards": (
        "List forwarding rules",
        "The workspace's inbound forwarding rules.",
    ),
    "forwards.update": (
        "Change a forwarding rule",
        "Changes a forwarding rule's destination or state.",
    ),
    "forwards.delete": (
        "Delete a forwarding rule",
        "Removes the rule: mail for its address is refused.",
    ),
    "health.healthz": (
        "Health check",
        "Whether the service and its database answer (503 when degraded).",
    ),
    "health.metrics": (
        "Prometheus metrics",
        "The service's metrics in Prometheus's text format; needs the metrics token when one is set.",
    ),
    "mcp_policy.get": (
        "Read the MCP policy",
        "What AI agents connected through MCP may do in the workspace.",
    ),
    "mcp_policy.update": (
        "Change the MCP policy",
        "Changes what MCP agents may do; only a person's signed-in session may, never an API key.",
    ),
    "nodes.list_nodes": (
        "List cluster nodes",
        "The service's nodes with their last heartbeat (operators only).",
    ),
    "postmaster_mail.list_mail": (
        "List postmaster mail",
        "Mail received for the domain's postmaster and abuse addresses, newest first.",
    ),
    "postmaster_mail.get_mail": (
        "Get postmaster mail",
        "One message received for the domain's postmaster.",
    ),
    "privacy.erase": (
        "Erase an address",
        "Removes one person's address and what was sent to them from the workspace's data.",
    ),
    "privacy.get_retention": (
        "Read content retention",
        "How long the workspace keeps email content.",
    ),
    "privacy.put_retention": (
        "Change content retention",
        "Sets how long the workspace keeps email content, at most its plan's period.",
    ),
    "queue.act": (
        "Act on queued mail",
        "Holds, releases, cancels or retries now the mail an email-log search matches; `dry_run` counts only.",
    ),
    "sandbox.status": (
        "Sandbox status",
        "Whether the workspace is in sandbox mode, where no mail leaves.",
    ),
    "sandbox.switch": (
        "Turn the sandbox on or off",
        "Switches the workspace in or out of sandbox mode.",
    ),
    "sandbox.mark_verified": (
        "Verify a domain in the sandbox",
        "Marks a domain verified without DNS, for trying sending in the sandbox.",
    ),
    "sandbox.create_test_key": (
        "Create a test key",
        "Creates an API key whose mail is always captured, never sent.",
    ),
    "sandbox.messages": (
        "List captured mail",
        "The mail the sandbox captured instead of delivering, newest first.",
    ),
    "sandbox.message": (
        "Get captured mail",
        "One captured message with its header fields, parts and DKIM result.",
    ),
    "sandbox.source": (
        "Captured message source",
        "The captured message as sent, signed, in RFC 5322 form.",
    ),
    "sandbox.captured_requests": (
        "List captured requests",
        "Webhook and forwarding POSTs the sandbox captured instead of sending.",
    ),
    "sandbox.captured_request": (
        "Get a captured request",
        "One captured POST with its URL, header fields and body.",
    ),
    "senders.create": ("Add a sender address", "Adds a From address on a verified domain."),
    "senders.list_senders": ("List sender addresses", "The workspace's From addresses."),
    "senders.delete": ("Delete a sender address", "Removes a From address."),
    "sessions.login": (
        "Sign in",
        "Starts a console session with an email and password (sets the session cookie); for"
        " a person with two-factor sign-in it answers 202 with a pending-login token for"
        " `POST /v1/auth/totp/login` instead.",
    ),
    "sessions.logout": ("Sign out", "Ends the caller's session."),
    "totp.status": (
        "Two-factor sign-in status",
        "Whether the signed-in person has two-factor sign-in, how many recovery codes are left,"
        " and whether the workspace requires it.",
    ),
    "totp.enrol": (
        "Enrol in two-factor sign-in",
        "Creates a TOTP secret, shown once as text and as an otpauth:// URI; it counts once"
        " confirmed with a first code.",
    ),
    "totp.confirm": (
        "Confirm two-factor sign-in",
        "Turns two-factor sign-in on with a first code; the answer holds ten single-use"
        " recovery codes, never shown again.",
    ),
    "totp.disable": (
        "Turn two-factor sign-in off",
        "Needs a current code (or a recovery code) or the password.",
    ),
    "totp.login": (
        "Finish signing in with a code",
        "The second step of a login: the pending-login token of a 202 login and a code or a"
        " recovery code open the session (sets the session cookie).",
    ),
    "totp.set_requirement": (
        "Require two-factor sign-in",
        "The owner requires two-factor sign-in of every member of the workspace, or stops;"
        " members without it can use the workspace only once enrolled. API keys are"
        " unaffected.",
    ),
    "sessions.reauth": (
        "Confirm the password",
        "Confirms the signed-in person's password before a sensitive change.",
    ),
    "smtp_credentials.create": (
        "Create an SMTP credential",
        "Creates a user name and password for the SMTP relay; the password and the relay's host"
        " and port are in this answer.",
    ),
    "smtp_credentials.list_credentials": (
        "List SMTP credentials",
        "The workspace's SMTP relay credentials.",
    ),
    "smtp_credentials.delete": (
        "Revoke an SMTP credential",
        "Revokes the credential: the relay refuses it from now on.",
    ),
    "suppressions.list_suppressions": (
        "List suppressions",
        "Addresses no mail is sent to (bounced, complained, unsubscribed or added), by page.",
    ),
    "suppressions.add": ("Suppress an address", "Stops all mail to the address."),
    "suppressions.remove": ("Unsuppress an address", "Lets mail go to the address again."),
    "templates.create": ("Create a template", "Creates an email template with variables."),
    "templates.list_templates": ("List templates", "The workspace's email templates."),
    "templates.get": ("Get a template", "One email template."),
    "templates.update": (
        "Change a template",
        "Changes a template's subject, content or variables.",
    ),
    "templates.delete": ("Delete a template", "Removes a template."),
    "templates.duplicate": ("Duplicate a template", "Creates a copy of the template."),
    "tls_reports.tls_report_summary": (
        "TLS report summary",
        "What the SMTP TLS reports received for the domain say of its inbound mail's encryption.",
    ),
    "tracking.opened": (
        "Open tracking pixel",
        "The image that records an open (in tracked emails).",
    ),
    "tracking.clicked": (
        "Click tracking link",
        "Records a click and sends the reader on to the link's target.",
    ),
    "tracking.unsubscribe_page": ("Unsubscribe page", "The page a reader unsubscribes on."),
    "tracking.unsubscribe": (
        "Unsubscribe",
        "Unsubscribes the reader (also RFC 8058's one-click List-Unsubscribe-Post).",
    ),
    "transfers.initiate": (
        "Start a domain transfer",
        "Invites another workspace to take over the domain; the invitation carries a token.",
    ),
    "transfers.incoming": (
        "Incoming domain transfers",
        "Transfers offered to the caller's workspaces.",
    ),
    "transfers.outgoing": ("Outgoing domain transfers", "Transfers the workspace started."),
    "transfers.accept_eligibility": (
        "Which workspaces may accept",
        "The caller's workspaces that could take a transferred domain.",
    ),
    "transfers.accept_by_token": (
        "Accept a domain transfer by token",
        "Accepts with the invitation's token, which is the credential; a signed-in caller must be"
        " its recipient.",
    ),
    "transfers.accept_by_id": (
        "Accept a domain transfer",
        "Accepts a transfer offered to the caller.",
    ),
    "transfers.decline": (
        "Decline a domain transfer",
        "Declines a transfer offered to the caller.",
    ),
    "transfers.cancel": ("Cancel a domain transfer", "Withdraws a transfer the workspace started."),
    "transfers.stop": (
        "Stop a domain transfer",
        "Stops a transfer with the stop token sent to the domain's owner; no sign-in needed.",
    ),
    "unsubscribe_footer.get": (
        "Read the unsubscribe footer",
        "The footer added to marketing mail.",
    ),
    "unsubscribe_footer.update": (
        "Change the unsubscribe footer",
        "Changes the footer added to marketing mail.",
    ),
    "verify.verify": (
        "Verify an address",
        "Checks an address by syntax, MX and an SMTP probe; nothing is sent.",
    ),
    "webhooks.list_webhooks": ("List webhooks", "The workspace's webhook endpoints."),
    "webhooks.create": (
        "Create a webhook",
        "Posts the chosen events to a URL, signed with the endpoint's secret.",
    ),
    "webhooks.update": ("Change a webhook", "Changes a webhook's URL, events or state."),
    "webhooks.delete": (
        "Delete a webhook",
        "Removes the endpoint: no more events are posted to it.",
    ),
    "webhooks.send_test": ("Send a test event", "Posts a test event to the endpoint."),
    "webhooks.replay_matching": (
        "Replay deliveries",
        "Posts again the endpoint's deliveries that match the filter.",
    ),
    "webhooks.deliveries": (
        "List a webhook's deliveries",
        "The endpoint's deliveries with their outcome, newest first.",
    ),
    "webhooks.delivery_of_webhook": (
        "Get a webhook's delivery",
        "One delivery of the endpoint with its request and answer.",
    ),
    "webhooks.delivery": ("Get a webhook delivery", "One delivery with its request and answer."),
    "webhooks.replay": ("Replay a delivery", "Posts the delivery's event again."),
}


def _implied(rule: Rule, view: Any) -> set[int]:
    """The errors a route gives by its shape (see the module's header)."""
    statuses: set[int] = set()
    authenticated = rule.rule.startswith("/v1/") and not getattr(view, "_postroom_public", False)
    if authenticated:
        # 403 on any method: a session in a workspace that requires two-factor sign-in the
        # caller has not set up (two_factor_required), besides roles and Origin on changes.
        statuses |= {401, 403}
    if rule.arguments:
        statuses.add(404)
    if getattr(view, QUART_SCHEMA_REQUEST_ATTRIBUTE, None) is not None:
        statuses |= {413, 415, 422}
    if getattr(view, QUART_SCHEMA_QUERYSTRING_ATTRIBUTE, None) is not None:
        statuses.add(422)
    return statuses


def _security(rule: Rule, view: Any) -> list[dict[str, list[str]]]:
    """Who may call: a credential on `/v1/` (optional where the path carries one), nothing
    on public routes (the document's default would show them locked)."""
    if not rule.rule.startswith("/v1/") or getattr(view, "_postroom_public", False):
        return []
    if getattr(view, "_postroom_credential_optional", False):
        return [{}, {"apiKey": []}]
    return [{"apiKey": []}]


def _error_response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": MEANING[status],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    if status == 429:
        response["headers"] = {
            "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
        }
    return response


class ErrorDocumentingProvider(OpenAPIProvider):
    """quart-schema's provider, adding each operation's error responses and the Error schema."""

    def generate_rules(self) -> Any:
        return (rule for rule in super().generate_rules() if not rule.endpoint.endswith("static"))

    def operation_id(self, method: str, path: str, func: Any) -> str:
        # quart-schema names an operation by method and function alone, and many resources
        # have a `create`; the module (the resource) makes the name unique, as OpenAPI asks
        resource = func.__module__.rsplit(".", 1)[-1]
        return f"{method.lower()}_{resource}_{func.__name__}"

    def build_paths(self, rule: Rule) -> tuple[dict[str, Any], dict[str, Any]]:
        paths, components = super().build_paths(rule)
        view = self._app.view_functions[rule.endpoint]
        statuses = _implied(rule, view) | set(DECLARED.get(rule.endpoint, ()))
        words = OPERATIONS.get(rule.endpoint)
        for operations in paths.values():
            for method, operation in operations.items():
                if words is not None:  # else quart-schema's, from the route's docstring
                    operation["summary"], operation["description"] = words
                operation["tags"] = [TAGS[rule.endpoint.split(".", 1)[0]]]
                operation["security"] = _security(rule, view)
                # quart-schema shares one `responses` dict among a rule's methods (copy
                # it) and keys it by int; the document's keys are strings
                responses = {str(code): r for code, r in operation["responses"].items()}
                for status in sorted(statuses):
                    responses[str(status)] = _error_response(status)
                if rule.endpoint in SUCCESS:
                    status, media, said = SUCCESS[rule.endpoint]
                    responses[str(status)] = {"description": said}
                    if media is not None:
                        responses[str(status)]["content"] = {media: {}}
                elif not any(code.startswith("2") for code in responses):
                    responses["204" if method == "delete" else "200"] = {"description": "Success."}
                for name, said in HEADERS.get(rule.endpoint, {}).items():
                    headers = responses["200"].setdefault("headers", {})
                    headers[name] = {"description": said, "schema": {"type": "string"}}
                operation["responses"] = responses
        if statuses:
            components["Error"] = ERROR_SCHEMA
        return paths, components
