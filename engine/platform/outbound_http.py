"""Outbound HTTPS to targets chosen by users (webhook endpoints, forward URLs).

One rule for the URL, applied when it is saved (a clear 422, `checked_url`) with the same
parser that later sends to it (httpx's): HTTPS, printable ASCII without spaces, a host that is
a well-formed DNS name (labels of 1-63 letters, digits and inner hyphens, at most 253 in all,
A-labels valid IDNA 2008) or an IP literal, a port of 1-65535, no user or password.

Unless POSTROOM_ALLOW_PRIVATE_TARGETS is on, the host must not name or resolve to an address
the private-network rule refuses (engine/platform/private_networks.py), checked when saved and again
at every connect (`client`): the client resolves the host itself and connects to the address
it checked, so a name re-pointed at an internal address later (DNS rebinding) reaches nothing.
The TLS context trusts the system store plus POSTROOM_EXTRA_CA_FILE and verifies the URL's
host name, not the address. The client is engine/platform/http1_client.py's pooled keep-alive one.

`post` is the one way a POST goes out. Whatever goes wrong with one request — building it
from a URL stored by an older release, connecting, TLS, the receiver's answer — comes back as
an `Answer` with the reason, never as an exception, so one item's failure is that item's
failed attempt on the retry schedule (`next_retry`) and never stops the actor sending it.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import idna
import trio

from engine.platform import dns
from engine.platform.errors import Unprocessable
from engine.platform.http1_client import PER_ORIGIN, Client, Connect, HttpError
from engine.platform.private_networks import is_public
from engine.platform.runtime import Runtime

# The spec's schedule: the first POST, then retries 1 m, 5 m, 30 m, 2 h, 6 h, 24 h and 48 h after
# each failure. The 8th failure is final, so the spec's last step (72 h, which would follow it)
# is never waited: see docs/decisions.md.
RETRY_DELAYS = (
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=30),
    timedelta(hours=2),
    timedelta(hours=6),
    timedelta(hours=24),
    timedelta(hours=48),
)
MAX_ATTEMPTS = 8
ANSWER_KEEP = 2048  # characters of a receiver's answer (or of the error) kept in the log

_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)", re.IGNORECASE)
_PORT = re.compile(r"[1-9][0-9]{0,4}")  # as written in the URL: no sign, no leading zero
_MAX_URL = 2000


def next_retry(failures: int) -> timedelta | None:
    """How long to wait after the `failures`-th failed attempt; None once it was the last."""
    return None if failures >= MAX_ATTEMPTS else RETRY_DELAYS[failures - 1]


def _host_problem(host: str) -> str | None:
    if "%" in host:
        return "the host must not carry an IPv6 zone"
    try:
        ipaddress.ip_address(host)
        return None  # an IP literal (the private-network rule is applied separately)
    except ValueError:
        pass
    name = host.removesuffix(".")
    if name.rsplit(".", 1)[-1].isdigit():
        # `1.2.3` or `2130706433` would be read as IPv4 shorthand by the system resolver.
        return "the host name's last label must not be a number; write an IP address in full"
    if len(name) > 253:
        return "the host name is longer than 253 characters"
    for label in name.split("."):
        if not label:
            return "the host name has an empty label"
        if len(label) > 63:
            return f"the host name label {label[:20]}… is longer than 63 characters"
        if not _LABEL.fullmatch(label):
            return f"the host name label {label!r} is not letters, digits and inner hyphens"
        if label.lower().startswith("xn--"):
            try:
                idna.decode(label)
            except idna.IDNAError as exc:
                return f"the host name label {label!r} is not valid IDNA 2008 ({exc})"
    return None


def _ascii_hint(url: str) -> str:
    """What to write instead of a URL with non-ASCII characters, when there is an answer."""
    try:
        encoded = idna.encode(urlsplit(url).hostname or "").decode("ascii")
    except (ValueError, idna.IDNAError, UnicodeError):
        return ""
    return f" (write the host as {encoded})"


def url_problem(url: str) -> str | None:
    """Why a user-chosen URL cannot be a target, or None when it can (pure; no DNS)."""
    if len(url) > _MAX_URL:
        return f"must be at most {_MAX_URL} characters"
    if not url.isascii():
        return "must be printable ASCII; percent-encode other characters" + _ascii_hint(url)
    if any(not ("!" <= c <= "~") for c in url):
        return "must be printable ASCII without spaces or control characters"
    try:
        parsed = httpx.URL(url)
        port = parsed.port
        host = parsed.host
    except (httpx.InvalidURL, ValueError) as exc:  # idna's errors are ValueErrors too
        return f"is not a valid URL: {exc}"
    if parsed.scheme != "https":
        return "must be an https:// URL"
    if not host:
        return "must name a host"
    if parsed.userinfo:
        return "must not carry a user name or password"
    if port is not None and not 1 <= port <= 65535:
        return "must have a port between 1 and 65535"
    try:
        parts = urlsplit(url)
        after_host = parts.netloc[parts.netloc.rfind("]") + 1 :]  # past an IPv6 literal
        _, colon, written_port = after_host.rpartition(":")
        if colon and not _PORT.fullmatch(written_port):
            return "must have a port of digits between 1 and 65535"
        return _host_problem(parts.hostname or "")
    except ValueError as exc:
        return f"is not a valid URL: {exc}"


Origin = tuple[str, str, int]  # scheme, host, port: who a request goes to


def origin(url: str) -> Origin | None:
    """The origin a URL is sent to, as the client reaches it (a default port written out, a
    host's case folded); None when the URL cannot be read."""
    try:
        parsed = httpx.URL(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        return (parsed.scheme, parsed.host.lower(), port)
    except (httpx.InvalidURL, ValueError):
        return None


def _invalid(field: str, message: str) -> Unprocessable:
    return Unprocessable(message, errors=[{"loc": ["body", field], "msg": message}])


class NotPublic(Exception):
    """Raised when a host does not resolve, or resolves to an address the rule refuses."""


async def _public_addresses(rt: Runtime, host: str) -> list[str]:
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = await dns.addresses(rt.resolver, host)
        except dns.TemporaryDnsError:
            raise NotPublic(f"{host} could not be resolved; try again") from None
    if not addresses or not all(is_public(a) for a in addresses):
        raise NotPublic(f"{host} does not resolve to a public address")
    return addresses


async def checked_url(rt: Runtime, url: str, field: str = "url") -> str:
    """`url` if the service may POST to it; Unprocessable (422) naming `field` if not."""
    problem = url_problem(url)
    if problem is not None:
        raise _invalid(field, f"{field} {problem}")
    if not rt.allow_private_targets:
        host = httpx.URL(url).host
        try:
            await _public_addresses(rt, host)
        except NotPublic as exc:
            raise _invalid(field, str(exc)) from None
    return url


@dataclass(frozen=True, slots=True)
class Answer:
    """What became of one POST: the receiver's status (None if it never answered) and its
    answer's text or why there was none."""

    status: int | None
    text: str

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


async def post(
    client: Client,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    within: float,
) -> Answer:
    """POST `body` to `url`, answered `within` seconds; every failure, whatever raised it, is
    an `Answer` saying why."""
    try:
        with trio.fail_after(within):
            reply = await client.post(url, body, headers)
            return Answer(reply.status, reply.text[:ANSWER_KEEP])
    except trio.TooSlowError:
        return Answer(None, f"no answer within {within:.0f} s")
    except Exception as exc:  # a bad stored URL, DNS, TLS, a broken answer: the item's fault
        return Answer(None, reason(exc)[:ANSWER_KEEP])


def reason(exc: BaseException) -> str:
    """An error with the causes it wraps (a TLS verification failure hides in them)."""
    reasons: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(reasons) < 4:
        text = str(seen)
        if text and text not in reasons:
            reasons.append(text)
        seen = seen.__cause__ or seen.__context__
    return f"{type(exc).__name__}: {'; '.join(reasons) or 'no detail'}"


def _public_only(rt: Runtime) -> Connect:
    """A connect that reaches only an address the private-network rule lets through."""

    async def connect(host: str, port: int) -> trio.SocketStream:
        try:
            address = (await _public_addresses(rt, host))[0]
        except NotPublic as exc:
            raise HttpError(f"refused to connect: {exc}") from None
        return await trio.open_tcp_stream(address, port)

    return connect


async def _any_address(host: str, port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream(host, port)


def client(rt: Runtime, tls: ssl.SSLContext, per_origin: int = PER_ORIGIN) -> Client:
    """An HTTPS client for user-chosen URLs that applies the rule again at every connect."""
    connect = _any_address if rt.allow_private_targets else _public_only(rt)
    return Client(tls, connect, per_origin)


@functools.cache
def tls_context(extra_ca_file: Path | None) -> ssl.SSLContext:
    """A verifying client context trusting the system store and the operator's extra CA;
    one per CA file and process (loading the store costs ~45 ms; contexts are shared
    safely and never changed after this)."""
    context = ssl.create_default_context()
    if extra_ca_file is not None:
        context.load_verify_locations(cafile=str(extra_ca_file))
    return context
