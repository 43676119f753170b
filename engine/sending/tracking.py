"""Open and click tracking and unsubscribe links: public tokens, sealed and opaque.

A token carries what it is for (open, click, unsubscribe), the email and the recipient (and
the target URL of a click), sealed with AES-GCM under a key derived from the service's
secret key: a link can neither be forged nor pointed elsewhere, and nobody who sees one (a
forwardee, a log, a link scanner) reads the address in it. Mail that offers unsubscribe is
built per recipient, so each copy's links name its own recipient; other mail to several
recipients is one message whose tracking reports its first `to` address. Following a link
records an event; unsubscribing also suppresses the address (reason `unsubscribe`, for the
workspace's mail that offers unsubscribe: engine/suppressions/scopes.py). The mailto:
alternative of List-Unsubscribe carries the same token in its subject; the inbound MX reads
it (engine/forwarding/unsubscribe_mail.py). Opening the unsubscribe
page changes nothing: only its POST (the RFC 8058 one-click request, or the page's button)
does, so link scanners cannot unsubscribe anyone. A link whose recipient was erased since
(`POST /v1/privacy/erase`) still works for its reader but records nothing: it would write
the address back.

Releases before sealing signed readable tokens (`<base64 JSON>.<HMAC>`); those already in
people's mailboxes are honoured while their email is younger than `LEGACY_LINKS`, then
refused: the service makes no new ones, so after that no valid one is left.

Opens and clicks are told apart as human or machine when they are recorded, from what the
request shows (`audience`): privacy proxies (Apple Mail Privacy Protection) and security
scanners fetch a message's images and links on delivery, not when a person reads it. Only
the verdict and its reason are kept, never the requester's address or user agent.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import unescape
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from engine.mail.addresses import unsubscribe_address
from engine.platform.errors import InvalidRequest, NotFound
from engine.platform.runtime import Runtime
from engine.webhooks import outbox
from storage import emails, suppressions
from storage.codec import new_id
from storage.emails import Email, Event
from storage.suppressions import Suppression
from storage.tx import Tx

OPEN, CLICK, UNSUBSCRIBE = "o", "c", "u"
LEGACY_LINKS = timedelta(days=90)
# No person opens a message, or follows its links, this soon after it reached the mailbox;
# a proxy or scanner fetching everything on arrival does.
ON_DELIVERY = timedelta(seconds=10)
# A click this close to one on another link of the same copy: a scanner following them all.
LINK_BURST = timedelta(seconds=3)
# User agents of the link and attachment scanners of mail security gateways and of HTTP
# libraries (lowercase substrings); a mail reader's own never contains them.
SCANNER_AGENTS = (
    "barracuda",
    "mimecast",
    "proofpoint",
    "messagelabs",
    "symantec",
    "forcepoint",
    "trendmicro",
    "sophos",
    "fortiguard",
    "safelinks",
    "bot",
    "spider",
    "crawler",
    "scanner",
    "python-requests",
    "python-httpx",
    "curl/",
    "wget/",
    "go-http-client",
    "java/",
    "okhttp",
    "headlesschrome",
)
_HREF = re.compile(r"""(<a\b[^>]*?\bhref\s*=\s*)(["'])(https?://[^"']+)\2""", re.IGNORECASE)
# A click answers with the link's URL as its Location header, which a control character
# breaks (a CR or LF would split it): such a link is not tracked, and such a token refused.
_URL_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NONCE_BYTES = 12
# Names the purpose, so the service's secret yields this key for nothing else.
_LINK_KEY_INFO = b"postroom/tracking-links/v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(secret: str, payload: dict[str, str]) -> str:
    """A readable token of `payload` signed with `secret` (what the MCP door's session ids
    are; tracking links were, before they were sealed)."""
    body = _b64(json.dumps(payload, separators=(",", ":")).encode())
    mac = hmac.new(secret.encode(), body.encode(), hashlib.sha256).digest()[:16]
    return f"{body}.{_b64(mac)}"


def verify(secret: str, token: str) -> dict[str, str] | None:
    """The payload of a token signed with `secret`, or None."""
    body, _, mac = token.partition(".")
    try:
        expected = hmac.new(secret.encode(), body.encode(), hashlib.sha256).digest()[:16]
        if not hmac.compare_digest(expected, _unb64(mac)):
            return None
        payload = json.loads(_unb64(body))
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


@functools.lru_cache(maxsize=4)
def _link_cipher(secret: str) -> AESGCM:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LINK_KEY_INFO)
    return AESGCM(hkdf.derive(secret.encode()))


def seal(secret: str, payload: dict[str, str]) -> str:
    """An opaque token of `payload` (base64url of nonce and ciphertext: no `.` in it)."""
    nonce = os.urandom(_NONCE_BYTES)
    body = json.dumps(payload, separators=(",", ":")).encode()
    return _b64(nonce + _link_cipher(secret).encrypt(nonce, body, _LINK_KEY_INFO))


def unseal(secret: str, token: str) -> dict[str, str] | None:
    """The payload a token sealed with `secret` holds, or None."""
    try:
        blob = _unb64(token)
        opened = _link_cipher(secret).decrypt(
            blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], _LINK_KEY_INFO
        )
        payload = json.loads(opened)
    except (ValueError, binascii.Error, InvalidTag, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


@dataclass(frozen=True, slots=True)
class Links:
    """The tracking and unsubscribe URLs of one email."""

    base: str
    secret: str
    email_id: str
    recipient: str

    def _url(self, kind: str, **extra: str) -> str:
        payload = {"k": kind, "e": self.email_id, "r": self.recipient, **extra}
        return f"{self.base}/t/{kind}/{seal(self.secret, payload)}"

    @property
    def open(self) -> str:
        return self._url(OPEN)

    def unsubscribe(self, bounce: str) -> tuple[str, str]:
        """The one-click URL and the mailto: alternative (an email to the address beside
        `bounce`, the email's bounce address) of List-Unsubscribe, sharing one token."""
        token = seal(self.secret, {"k": UNSUBSCRIBE, "e": self.email_id, "r": self.recipient})
        return f"{self.base}/t/u/{token}", f"mailto:{unsubscribe_address(bounce)}?subject={token}"

    def click(self, url: str) -> str:
        return self._url(CLICK, u=url)


def instrument_html(html: str, links: Links, *, opens: bool, clicks: bool) -> str:
    """The html with its http(s) links routed through click tracking and an open pixel."""
    if clicks:

        def track(m: re.Match[str]) -> str:
            # The attribute's value is HTML: `&amp;` in it is the URL's `&`.
            url = unescape(m.group(3))
            if _URL_CONTROL.search(url):
                return m.group(0)
            return f"{m.group(1)}{m.group(2)}{links.click(url)}{m.group(2)}"

        html = _HREF.sub(track, html)
    if opens:
        pixel = f'<img src="{links.open}" width="1" height="1" alt="" style="display:none">'
        closing = html.lower().rfind("</body>")
        html = html + pixel if closing < 0 else html[:closing] + pixel + html[closing:]
    return html


@dataclass(frozen=True, slots=True)
class Hit:
    """What a followed tracking link's request shows of its maker: read, never stored."""

    method: str
    user_agent: str


def audience(
    hit: Hit, since_delivery: timedelta | None, other_link_just_clicked: bool
) -> tuple[str, str | None]:
    """("human", None) or ("machine", why) for an open or click: `since_delivery` is how long
    after its recipient's delivery it came (None if not known), `other_link_just_clicked`
    whether the same copy's recipient clicked another link within LINK_BURST."""
    agent = hit.user_agent.strip().lower()
    if hit.method == "HEAD":
        return "machine", "head_request"
    if not agent:
        return "machine", "no_user_agent"
    if any(name in agent for name in SCANNER_AGENTS):
        return "machine", "scanner_user_agent"
    if since_delivery is not None and since_delivery < ON_DELIVERY:
        return "machine", "fetched_on_delivery"
    if other_link_just_clicked:
        return "machine", "every_link_at_once"
    return "human", None


def _classify(
    tx: Tx, email_id: str, recipient: str, hit: Hit, url: str | None, now: datetime
) -> dict[str, Any]:
    """The verdict on an open (`url` None) or click, from the recipient's events so far."""
    mine = [e for e in emails.events_of(tx, email_id) if e.recipient == recipient]
    delivered = [e.created_at for e in mine if e.event_type == "delivered"]
    since = now - min(delivered) if delivered else None
    burst = url is not None and any(
        e.event_type == "clicked"
        and e.metadata.get("url") != url
        and now - e.created_at < LINK_BURST
        for e in mine
    )
    verdict, reason = audience(hit, since, burst)
    return {"audience": verdict} if reason is None else {"audience": verdict, "reason": reason}


def _event(email: Email, kind: str, recipient: str, meta: dict[str, Any], now: datetime) -> Event:
    metadata = {"subject": email.subject, "tags": email.tags, **meta}
    return Event(new_id(), email.id, email.workspace_id, kind, recipient, metadata, now)


@dataclass(frozen=True, slots=True)
class _Link:
    """What a followed link's token says, and whether it is a readable one of old."""

    payload: dict[str, str]
    legacy: bool


def _record(
    tx: Tx, link: _Link, meta: dict[str, Any], now: datetime, hit: Hit | None = None
) -> None:
    payload = link.payload
    found = emails.by_ids(tx, [payload["e"]])
    email = found.get(payload["e"])
    if email is None or (link.legacy and email.created_at + LEGACY_LINKS < now):
        raise NotFound("unknown link")
    recipient = payload["r"]
    if recipient not in {r.address for r in emails.recipients_of(tx, email.id)}:
        return  # erased since the link was made: recording it would write the address back
    kind = {OPEN: "opened", CLICK: "clicked", UNSUBSCRIBE: "unsubscribed"}[payload["k"]]
    if hit is not None:
        meta = meta | _classify(tx, email.id, recipient, hit, meta.get("url"), now)
    outbox.record(tx, [_event(email, kind, recipient, meta, now)])
    if payload["k"] == UNSUBSCRIBE:
        suppressions.add(
            tx, email.workspace_id, Suppression(recipient, "unsubscribe", now, email.id)
        )


def _link(rt: Runtime, token: str, kind: str) -> _Link:
    legacy = "." in token
    payload = verify(rt.secret_key, token) if legacy else unseal(rt.secret_key, token)
    if payload is None or payload.get("k") != kind or "e" not in payload or "r" not in payload:
        raise NotFound("unknown link")
    return _Link(payload, legacy)


async def opened(rt: Runtime, token: str, hit: Hit) -> None:
    link = _link(rt, token, OPEN)
    await rt.db.write(_record, link, {}, rt.clock.now(), hit)


async def clicked(rt: Runtime, token: str, hit: Hit) -> str:
    """Record the click; the URL to send the reader on to.

    InvalidRequest when the URL holds a control character: such links are not tracked, but
    a message sent before they were refused may still carry one.
    """
    link = _link(rt, token, CLICK)
    url = link.payload.get("u", "")
    if link.legacy:
        url = unescape(url)  # made before `&amp;` was decoded: it went to the wrong URL
    if not url.startswith(("http://", "https://")):
        raise NotFound("unknown link")
    if _URL_CONTROL.search(url):
        raise InvalidRequest("the link's URL contains a control character", code="invalid_link")
    await rt.db.write(_record, link, {"url": url}, rt.clock.now(), hit)
    return url


def check_unsubscribe(rt: Runtime, token: str) -> str:
    """The address an unsubscribe link is for (NotFound if the token is not valid)."""
    return _link(rt, token, UNSUBSCRIBE).payload["r"]


def unsubscribe_request(secret: str, token: str) -> tuple[str, str] | None:
    """The email id and recipient a sealed unsubscribe token names, or None."""
    payload = unseal(secret, token)
    if payload is None or payload.get("k") != UNSUBSCRIBE:
        return None
    email_id, recipient = payload.get("e"), payload.get("r")
    if not isinstance(email_id, str) or not isinstance(recipient, str):
        return None
    return email_id, recipient


def record_unsubscribe(tx: Tx, email_id: str, recipient: str, method: str, now: datetime) -> None:
    """Suppress a recipient of an email who asked to unsubscribe, and record it (NotFound
    when the email is gone); in the caller's unit of work."""
    payload = {"k": UNSUBSCRIBE, "e": email_id, "r": recipient}
    _record(tx, _Link(payload, legacy=False), {"method": method}, now)


async def unsubscribed(rt: Runtime, token: str, method: str) -> str:
    """Suppress the link's recipient and record it; the address."""
    link = _link(rt, token, UNSUBSCRIBE)
    await rt.db.write(_record, link, {"method": method}, rt.clock.now())
    return link.payload["r"]
