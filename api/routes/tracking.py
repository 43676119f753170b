"""Public tracking and unsubscribe links (`/t/...`): the signed token is the credential.

`/t/o/{token}` answers a 1x1 GIF and records an open; `/t/c/{token}` redirects to the link's
target and records a click; `/t/u/{token}` shows a confirmation page on GET and unsubscribes
on POST (the RFC 8058 one-click request, or the page's button).
"""

from __future__ import annotations

import base64
import html

from quart import Blueprint, Response, request

from api.auth import public, runtime
from engine.sending import tracking

blueprint = Blueprint("tracking", __name__, url_prefix="/t")

PIXEL = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")
_NO_STORE = {"Cache-Control": "no-store, private"}


def _hit() -> tracking.Hit:
    """What the request shows of its maker, to tell a person from a machine; not stored."""
    return tracking.Hit(request.method, request.headers.get("User-Agent", "")[:512])


def _page(title: str, body: str) -> Response:
    text = (
        "<!doctype html><html><head><meta charset=utf-8><title>"
        f"{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    return Response(text, content_type="text/html; charset=utf-8", headers=_NO_STORE)


@blueprint.get("/o/<token>")
@public
async def opened(token: str) -> Response:
    await tracking.opened(runtime(), token, _hit())
    return Response(PIXEL, content_type="image/gif", headers=_NO_STORE)


@blueprint.get("/c/<token>")
@public
async def clicked(token: str) -> Response:
    url = await tracking.clicked(runtime(), token, _hit())
    return Response(b"", status=302, headers={"Location": url, **_NO_STORE})


@blueprint.get("/u/<token>")
@public
async def unsubscribe_page(token: str) -> Response:
    address = tracking.check_unsubscribe(runtime(), token)
    form = (
        f"<p>Stop sending email to {html.escape(address)}?</p>"
        '<form method="post"><button type="submit">Unsubscribe</button></form>'
    )
    return _page("Unsubscribe", form)


@blueprint.post("/u/<token>")
@public
async def unsubscribe(token: str) -> Response:
    form = await request.form
    method = "one-click" if form.get("List-Unsubscribe") == "One-Click" else "link"
    address = await tracking.unsubscribed(runtime(), token, method)
    return _page(
        "Unsubscribed",
        f"<p>{html.escape(address)} will receive no more email from this sender.</p>",
    )
