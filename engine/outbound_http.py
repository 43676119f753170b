"""Outbound HTTPS targets chosen by users (webhook endpoints, forward URLs).

Both kinds of URL follow one rule: HTTPS only, and unless POSTROOM_ALLOW_PRIVATE_TARGETS is on,
the host must not name or resolve to a loopback, private, link-local or reserved address, so
a user cannot aim the service at the operator's own network (SSRF). The TLS context trusts
the system store plus POSTROOM_EXTRA_CA_FILE.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from engine import dns
from engine.errors import Unprocessable
from engine.runtime import Runtime


def _invalid(field: str, message: str) -> Unprocessable:
    return Unprocessable(message, errors=[{"loc": ["body", field], "msg": message}])


def _is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_global and not ip.is_multicast


async def checked_url(rt: Runtime, url: str, field: str = "url") -> str:
    """`url` if it is an HTTPS URL the service may call; Unprocessable (422) naming `field` if not."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise _invalid(field, f"{field} must be an https:// URL")
    if rt.allow_private_targets:
        return url
    host = parts.hostname
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = await dns.addresses(rt.resolver, host)
        except dns.TemporaryDnsError:
            raise _invalid(field, f"{host} could not be resolved; try again") from None
    if not addresses or not all(_is_public(a) for a in addresses):
        raise _invalid(field, f"{host} does not resolve to a public address")
    return url


def tls_context(extra_ca_file: Path | None) -> ssl.SSLContext:
    """A verifying client context trusting the system store and the operator's extra CA."""
    context = ssl.create_default_context()
    if extra_ca_file is not None:
        context.load_verify_locations(cafile=str(extra_ca_file))
    return context
