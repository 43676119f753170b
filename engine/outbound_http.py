"""Outbound HTTPS targets chosen by users (webhook endpoints, forward URLs).

Both kinds of URL follow one rule: HTTPS only, and unless POSTROOM_ALLOW_PRIVATE_TARGETS is on,
the host must not name or resolve to a loopback, private, link-local or reserved address, so
a user cannot aim the service at the operator's own network (SSRF). The rule is applied twice:
when the URL is saved (a clear 422) and again at every connect (`client`), which resolves the
host itself and connects to the address it checked, so a name re-pointed at an internal
address after it was saved (DNS rebinding) reaches nothing. The TLS context trusts the system
store plus POSTROOM_EXTRA_CA_FILE and verifies the URL's host name, not the address.
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

from engine import dns
from engine.errors import Unprocessable
from engine.runtime import Runtime


def _invalid(field: str, message: str) -> Unprocessable:
    return Unprocessable(message, errors=[{"loc": ["body", field], "msg": message}])


def _is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_global and not ip.is_multicast


class NotPublic(Exception):
    """Raised when a host does not resolve, or resolves to an address the rule forbids."""


async def _public_addresses(rt: Runtime, host: str) -> list[str]:
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = await dns.addresses(rt.resolver, host)
        except dns.TemporaryDnsError:
            raise NotPublic(f"{host} could not be resolved; try again") from None
    if not addresses or not all(_is_public(a) for a in addresses):
        raise NotPublic(f"{host} does not resolve to a public address")
    return addresses


async def checked_url(rt: Runtime, url: str, field: str = "url") -> str:
    """`url` if it is an HTTPS URL the service may call; Unprocessable (422) naming `field` if not."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise _invalid(field, f"{field} must be an https:// URL")
    if not rt.allow_private_targets:
        try:
            await _public_addresses(rt, parts.hostname)
        except NotPublic as exc:
            raise _invalid(field, str(exc)) from None
    return url


class _PublicOnlyBackend(httpcore.AsyncNetworkBackend):
    """httpcore's Trio backend, connecting only to an address that passed the rule."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._trio = httpcore.TrioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's backend interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            address = (await _public_addresses(self._rt, host))[0]
        except NotPublic as exc:
            raise httpcore.ConnectError(f"refused to connect: {exc}") from None
        return await self._trio.connect_tcp(address, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's backend interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not outbound targets")

    async def sleep(self, seconds: float) -> None:
        await self._trio.sleep(seconds)


def client(
    rt: Runtime, tls: ssl.SSLContext, timeout: float, limits: httpx.Limits | None = None
) -> httpx.AsyncClient:
    """An HTTPS client for user-chosen URLs that applies the rule again at every connect."""
    transport = httpx.AsyncHTTPTransport(verify=tls, limits=limits or httpx.Limits())
    if not rt.allow_private_targets:
        # httpx takes no network backend of its own; its pool (pinned httpx 0.28) keeps one.
        pool = transport._pool
        if not hasattr(pool, "_network_backend"):
            raise RuntimeError("httpx's connection pool changed: the SSRF guard cannot attach")
        pool._network_backend = _PublicOnlyBackend(rt)
    return httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False)


def tls_context(extra_ca_file: Path | None) -> ssl.SSLContext:
    """A verifying client context trusting the system store and the operator's extra CA."""
    context = ssl.create_default_context()
    if extra_ca_file is not None:
        context.load_verify_locations(cafile=str(extra_ca_file))
    return context
