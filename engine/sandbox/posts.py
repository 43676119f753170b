"""HTTP requests of sandboxed workspaces, captured instead of sent: webhook deliveries and
forwards to URLs.

The sandbox promises that nothing a sandboxed workspace does leaves the machine, so the
webhook dispatcher and the forwarder hand each POST of such a workspace here, built exactly
as it would have gone out (URL, header fields with the signature, body). It is stored, and
its outcome recorded as a success, in one unit of work: the delivery log and the forward log
read as they would after a receiver's 2xx. The one header field kept back is a basic-auth
`Authorization`: its password is never shown again, so the capture shows the username only.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from engine.platform.errors import NotFound
from engine.platform.runtime import Principal, Runtime
from storage import sandbox
from storage.codec import new_id
from storage.sandbox import CapturedPost
from storage.tx import Tx

ANSWER = "captured by the sandbox: nothing left the machine"
WITHHELD = "(withheld: shown to no one)"


def shown_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The header fields as captured: a basic-auth password replaced by a note."""
    shown = []
    for name, value in headers.items():
        if name.lower() == "authorization" and value.startswith("Basic "):
            try:
                pair = base64.b64decode(value.removeprefix("Basic "), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                pair = ""
            value = f"Basic (username {pair.partition(':')[0]!r}, password {WITHHELD})"
        shown.append((name, value))
    return shown


async def capture(
    rt: Runtime,
    workspace_id: str,
    kind: str,
    source_id: str,
    request: tuple[str, Mapping[str, str], bytes],
    outcome: Callable[[Tx, datetime], None],
) -> None:
    """Store the POST `request` (URL, header fields, body) and, in the same unit of work,
    `outcome` (called with the unit and the time of the capture): the caller's record of it
    as delivered."""
    url, headers, body = request
    post = CapturedPost(
        id=new_id(),
        workspace_id=workspace_id,
        kind=kind,
        source_id=source_id,
        url=url,
        headers=shown_headers(headers),
        created_at=rt.clock.now(),
        body=body,
    )

    def unit(tx: Tx) -> None:
        sandbox.capture_post(tx, post)
        outcome(tx, post.created_at)

    await rt.db.write(unit)


class PostCaptures:
    """The capture as the webhook dispatcher and the forwarder are given it (by
    postroom/service.py: neither imports the sandbox)."""

    answer = ANSWER  # the response a captured POST is recorded with

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    async def capture(
        self,
        workspace_id: str,
        kind: str,
        source_id: str,
        request: tuple[str, Mapping[str, str], bytes],
        outcome: Callable[[Tx, datetime], None],
    ) -> None:
        await capture(self._rt, workspace_id, kind, source_id, request, outcome)


@dataclass(frozen=True, slots=True)
class CapturedRequest:
    """One captured POST, with its body as text (JSON, as every POST we make is)."""

    post: CapturedPost
    body: str
    signature: str | None  # X-Webhook-Signature, when it carries one


async def page(
    rt: Runtime, who: Principal, page_number: int, limit: int
) -> tuple[list[CapturedPost], int]:
    """Captured POSTs newest first, and the total."""
    return await rt.db.read(sandbox.posts_page, who.workspace_id, page_number * limit, limit)


async def request(rt: Runtime, who: Principal, post_id: str) -> CapturedRequest:
    found = await rt.db.read(sandbox.post, who.workspace_id, post_id)
    if found is None:
        raise NotFound("captured request not found")
    signature = next((v for n, v in found.headers if n.lower() == "x-webhook-signature"), None)
    return CapturedRequest(found, (found.body or b"").decode("utf-8", "replace"), signature)
