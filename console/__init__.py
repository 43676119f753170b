"""The web console, served at `/` by the API's app: server-rendered pages over the engine.

A front door like `api/`: it parses forms, calls the engine functions the API calls, and
renders HTML; no rule lives here. `install` nests every page's blueprint in `console.web`'s,
which signs users in and sets the security headers.
"""

from __future__ import annotations

from quart import Quart
from quart_schema import hide

from console.pages import (
    account,
    activity,
    auth,
    contacts,
    delivery,
    domains,
    emails,
    forwards,
    keys,
    overview,
    postmaster,
    sandbox,
    suppressions,
    team,
    templates,
    webhooks,
    workspaces,
)
from console.web import blueprint

PAGES = (
    auth.blueprint,
    workspaces.blueprint,
    overview.blueprint,
    domains.blueprint,
    postmaster.blueprint,
    emails.blueprint,
    webhooks.blueprint,
    suppressions.blueprint,
    contacts.blueprint,
    templates.blueprint,
    keys.blueprint,
    forwards.blueprint,
    delivery.blueprint,
    team.blueprint,
    activity.blueprint,
    account.blueprint,
    sandbox.blueprint,
)

for _page in PAGES:  # once, at import: an app may be built many times (tests)
    blueprint.register_blueprint(_page)


def install(app: Quart) -> None:
    """Serve the console at `/` (its assets under `/assets/`)."""
    app.register_blueprint(blueprint)
    # HTML pages, not API operations: the OpenAPI document (and its fuzzing) stays the API's.
    for endpoint, view in app.view_functions.items():
        if endpoint.startswith("console.") and endpoint != "console.static":
            hide(view)
