"""MTA-STS (RFC 8461) on the way out: which TLS a recipient domain demands of its MX hosts.

A domain opts in with a `_mta-sts.<domain>` TXT record (`v=STSv1; id=...`) and serves its
policy at `https://mta-sts.<domain>/.well-known/mta-sts.txt`. The policy is fetched over
verified HTTPS (the system CAs plus POSTROOM_EXTRA_CA_FILE; a redirect or any status but 200
is a failed fetch), at most `MAX_POLICY` octets within `FETCH_WITHIN` seconds, and kept in the
database for every node (storage/mta_sts.py) until its `max_age` runs out or the TXT record
names another id. RFC 8461 section 5.1: when the TXT record is gone or DNS or the fetch fails,
an unexpired cached policy still applies; without one the domain has no policy (opportunistic).

`enforce` lets mail go only over STARTTLS with a certificate valid for the MX name (verified)
to an MX host the policy lists; `testing` delivers as opportunistic TLS does and records the
policy; `none` is no policy. The host name to address step follows the private-network rule as
every outbound connection does (POSTROOM_ALLOW_PRIVATE_TARGETS).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

import dns.asyncresolver
import trio

from engine.platform import dns as lookups
from engine.platform import outbound_http
from engine.platform.http1_client import MAX_ANSWER, Client, Connect, HttpError
from engine.platform.private_networks import public_only
from engine.platform.runtime import Runtime
from storage import mta_sts as stored

MAX_POLICY = MAX_ANSWER  # RFC 8461 3.3: senders may refuse policies over 64 KiB
FETCH_WITHIN = 30.0  # seconds for the whole fetch (RFC 8461 3.3: "a timeout", e.g. 60 s)
FETCH_AGAIN = timedelta(minutes=5)  # after a failed fetch, before the next one
MAX_AGE_LIMIT = 31_557_600  # RFC 8461 3.2: max_age is at most a year in seconds
POLICY_PATH = "/.well-known/mta-sts.txt"
MODES = ("enforce", "testing", "none")

log = logging.getLogger("postroom.delivery")

_ID = re.compile(r"[A-Za-z0-9]{1,32}")
_PATTERN = re.compile(r"(\*\.)?([a-z0-9]([a-z0-9-]*[a-z0-9])?\.)+[a-z0-9-]+\.?")


@dataclass(frozen=True, slots=True)
class Policy:
    """A domain's policy as it applies to one delivery."""

    domain: str
    policy_id: str
    mode: str  # enforce, testing (none is no policy: `policy_for` returns None)
    mx: tuple[str, ...]  # host patterns, lower-case; "*.example.com" matches one label

    @property
    def enforced(self) -> bool:
        return self.mode == "enforce"

    def allows(self, host: str) -> bool:
        """Whether the MX host name is one the policy lists (RFC 8461 4.1)."""
        name = host.lower().rstrip(".")
        for pattern in self.mx:
            if pattern.startswith("*."):
                first, _, rest = name.partition(".")
                if first and rest == pattern[2:]:
                    return True
            elif name == pattern:
                return True
        return False


def txt_id(records: list[str]) -> str | None:
    """The policy id of the domain's `_mta-sts` TXT records, None when there is none usable
    (RFC 8461 3.1: exactly one record starting with `v=STSv1`)."""
    ours = [r for r in records if r.startswith("v=STSv1")]
    if len(ours) != 1:
        return None
    fields = dict(_field(part) for part in ours[0].split(";") if part.strip())
    found = fields.get("id")
    return found if found is not None and _ID.fullmatch(found) else None


def _field(part: str) -> tuple[str, str]:
    key, _, value = part.strip().partition("=")
    return key.strip(), value.strip()


def parse(text: str) -> tuple[str, tuple[str, ...], int]:
    """The mode, MX patterns and max_age of a policy file; ValueError saying what is wrong."""
    fields: dict[str, str] = {}
    mx: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"the policy line {line[:40]!r} is not key: value")
        key, value = key.strip(), value.strip()
        if key == "mx":
            if not _PATTERN.fullmatch(value.lower()):
                raise ValueError(f"the policy's mx {value[:60]!r} is not a host name pattern")
            mx.append(value.lower().rstrip("."))
        else:
            fields.setdefault(key, value)  # RFC 8461 3.2: the first of a repeated key counts
    if fields.get("version") != "STSv1":
        raise ValueError("the policy's version is not STSv1")
    mode = fields.get("mode", "")
    if mode not in MODES:
        raise ValueError(f"the policy's mode {mode[:20]!r} is none of {', '.join(MODES)}")
    age = fields.get("max_age", "")
    if not age.isdigit() or len(age) > 10:
        raise ValueError("the policy's max_age is not a number of seconds")
    if mode != "none" and not mx:
        raise ValueError("the policy lists no mx")
    return mode, tuple(mx), min(int(age), MAX_AGE_LIMIT)


def _connect(rt: Runtime) -> Connect:
    """Reach a policy host through the service's resolver and the private-network rule."""

    async def connect(host: str, port: int) -> trio.SocketStream:
        try:
            found = await lookups.addresses(rt.resolver, host)
        except lookups.TemporaryDnsError as exc:
            raise HttpError(f"{host} could not be resolved: {exc}") from None
        allowed = found if rt.allow_private_targets else public_only(found)
        if not allowed:
            raise HttpError(f"{host} has no address the service may connect to")
        return await trio.open_tcp_stream(allowed[0], port)

    return connect


async def fetch(rt: Runtime, domain: str) -> tuple[str, tuple[str, ...], int]:
    """The domain's policy file, parsed; ValueError saying why there is none to use."""
    port = "" if rt.mta_sts_port == 443 else f":{rt.mta_sts_port}"
    url = f"https://mta-sts.{domain}{port}{POLICY_PATH}"
    client = Client(outbound_http.tls_context(rt.extra_ca_file), _connect(rt), per_origin=1)
    try:
        with trio.fail_after(FETCH_WITHIN):
            reply = await client.get(url, {"Accept": "text/plain"})
    except trio.TooSlowError:
        raise ValueError(f"{url}: no answer within {FETCH_WITHIN:.0f} s") from None
    except HttpError as exc:
        raise ValueError(f"{url}: {outbound_http.reason(exc)}") from None
    finally:
        await client.aclose()
    if reply.status != 200:  # redirects included (RFC 8461 3.3)
        raise ValueError(f"{url} answered {reply.status}")
    if len(reply.body) >= MAX_POLICY:
        raise ValueError(f"{url}: the policy is larger than {MAX_POLICY} octets")
    try:
        return parse(reply.body.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{url}: the policy is not UTF-8") from None


async def _txt(resolver: dns.asyncresolver.Resolver, domain: str) -> str | None:
    """The TXT record's id, None when there is none; TemporaryDnsError when DNS fails."""
    return txt_id(await lookups.txt(resolver, f"_mta-sts.{domain}"))


class Policies:
    """The MTA-STS policy of one recipient domain, for the queue delivering to it: looked up
    once per round (the TXT record, then the database's copy), fetched when the TXT record
    names an id the copy lacks. A failed fetch is not tried again for `FETCH_AGAIN` (each
    try may take `FETCH_WITHIN`); the copy, if unexpired, applies meanwhile."""

    def __init__(self, rt: Runtime, domain: str) -> None:
        self._rt = rt
        self._domain = domain.lower()
        self._fetch_again_at: datetime | None = None

    async def current(self) -> Policy | None:
        """The policy that applies to mail for the domain now, None for none."""
        rt, domain = self._rt, self._domain
        now = rt.clock.now()
        cached = await rt.db.read(stored.get, domain)
        if cached is not None and cached.expires_at <= now:
            cached = None
        try:
            wanted = await _txt(rt.resolver, domain)
        except lookups.TemporaryDnsError:
            wanted = None  # RFC 8461 5.1: a cached policy still applies, else none
        may_fetch = self._fetch_again_at is None or now >= self._fetch_again_at
        stale = cached is None or cached.policy_id != wanted
        if wanted is not None and stale and may_fetch:
            try:
                mode, mx, max_age = await fetch(rt, domain)
            except ValueError as exc:
                log.info("MTA-STS policy of %s not fetched: %s", domain, exc)
                self._fetch_again_at = now + FETCH_AGAIN
            else:
                expires = now + timedelta(seconds=max_age)
                cached = stored.Cached(wanted, mode, mx, max_age, expires)
                await rt.db.write(stored.put, domain, cached, now)
                self._fetch_again_at = None
        if cached is None or cached.mode == "none":
            return None
        return Policy(domain, cached.policy_id, cached.mode, cached.mx)
