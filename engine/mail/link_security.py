"""Whether the unsubscribe links the service makes meet the bulk-sender rules.

List-Unsubscribe follows `POSTROOM_PUBLIC_URL`. RFC 8058 one-click needs an https URI, and
Gmail and Yahoo ignore (and score) an http:// one, so a public URL on http:// is reported:
one warning line at start-up (`http_warning`), and `unsubscribe_is_https` for a domain's
compliance state. A loopback host (a developer's machine, the tests) or a sandboxed service
(nothing is delivered) is not worth a warning.
"""

from __future__ import annotations

from urllib.parse import urlsplit

_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def unsubscribe_is_https(public_url: str) -> bool:
    """Whether unsubscribe links made under `public_url` are https, as receivers require."""
    return urlsplit(public_url).scheme == "https"


def http_warning(public_url: str, *, sandbox: bool) -> str | None:
    """The start-up warning for unsubscribe links receivers will not honour, or None."""
    host = (urlsplit(public_url).hostname or "").lower()
    if unsubscribe_is_https(public_url) or sandbox or host in _LOOPBACK:
        return None
    return (
        f"POSTROOM_PUBLIC_URL is {public_url}, not https: unsubscribe links use it, and"
        " Gmail, Yahoo and Outlook honour one-click unsubscribe (RFC 8058) only over https"
    )
