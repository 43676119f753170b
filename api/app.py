"""Builds the Quart-Trio application: routes, authentication, errors, OpenAPI.

The ASGI middleware around it (the send door's edge, the body guard, metrics, the MCP door)
and the console are put on in one place, postroom/service.py.
"""

from __future__ import annotations

from quart_schema import QuartSchema
from quart_trio import QuartTrio

from api import auth, errors, responses
from api.converters import IdConverter
from api.openapi import ErrorDocumentingProvider, docs
from api.routes import (
    admin,
    api_keys,
    audit_log,
    bimi,
    broadcasts,
    complaint_guard,
    compliance,
    contacts,
    delivery,
    dmarc_reports,
    domains,
    egress,
    emails,
    forwards,
    health,
    incidents,
    invitations,
    mcp_policy,
    members,
    nodes,
    postmaster_mail,
    privacy,
    queue,
    sandbox,
    senders,
    sessions,
    smtp_credentials,
    stats,
    suppressions,
    templates,
    tls_reports,
    totp,
    tracking,
    transfers,
    unsubscribe_footer,
    verify,
    webhooks,
)
from api.url_rules import SharedBuilderRule
from engine.platform.runtime import Runtime
from engine.platform.supervisor import Supervisor

# Attachments may total 24 MiB, which base64 makes ~32 MiB; anything larger is refused early.
MAX_BODY_BYTES = 40 * 1024 * 1024

BLUEPRINTS = (
    health.blueprint,
    sessions.blueprint,
    api_keys.blueprint,
    domains.blueprint,
    senders.blueprint,
    suppressions.blueprint,
    privacy.blueprint,
    audit_log.blueprint,
    emails.blueprint,
    tracking.blueprint,
    webhooks.blueprint,
    verify.blueprint,
    bimi.blueprint,
    forwards.blueprint,
    postmaster_mail.blueprint,
    dmarc_reports.blueprint,
    compliance.blueprint,
    tls_reports.blueprint,
    smtp_credentials.blueprint,
    contacts.blueprint,
    templates.blueprint,
    broadcasts.blueprint,
    stats.blueprint,
    complaint_guard.blueprint,
    nodes.blueprint,
    sandbox.blueprint,
    mcp_policy.blueprint,
    queue.blueprint,
    incidents.blueprint,
    delivery.blueprint,
    unsubscribe_footer.blueprint,
    egress.blueprint,
    members.blueprint,
    invitations.blueprint,
    totp.blueprint,
)

# Registered only when POSTROOM_DOMAIN_TRANSFERS is on: off, the paths do not exist (404).
TRANSFER_BLUEPRINTS = (transfers.blueprint, admin.blueprint)


def create_app(
    rt: Runtime, supervisor: Supervisor, metrics: health.Scrape, metrics_token: str | None
) -> QuartTrio:
    """The `/v1` API over one engine runtime; `/metrics` needs `metrics_token` when set."""
    app = QuartTrio(__name__)
    app.url_rule_class = SharedBuilderRule
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.url_map.strict_slashes = False
    app.url_map.converters["id"] = IdConverter
    app.extensions["postroom"] = rt
    app.extensions["postroom.metrics"] = metrics
    app.extensions["postroom.metrics_token"] = metrics_token
    app.extensions["postroom.supervisor"] = supervisor
    QuartSchema(
        app,
        swagger_ui_path=None,  # /docs is api/openapi.py's page, from the package's files
        redoc_ui_path=None,  # ReDoc and Scalar would load floating versions from a CDN
        scalar_ui_path=None,
        info={"title": "Postroom", "version": "1"},
        security_schemes={"apiKey": {"type": "http", "scheme": "bearer"}},
        security=[{"apiKey": []}],
        openapi_provider_class=ErrorDocumentingProvider,  # adds each operation's errors
    )
    responses.install(app)
    app.register_blueprint(docs)
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    for blueprint in TRANSFER_BLUEPRINTS if rt.domain_transfers else ():
        app.register_blueprint(blueprint)
    errors.install(app)
    auth.install(app, rt)
    return app
