"""Email address verification: syntax, MX lookup, then an SMTP recipient probe. Never sends.

Checks run in order and stop at the first verdict: a malformed address, a domain with a null
MX or no mail host at all is `invalid`; otherwise the primary MX is asked with EHLO, MAIL FROM
and RCPT TO, then RSET — never DATA. 2xx -> `valid`, 5xx -> `invalid`, 4xx (greylisting) ->
`risky`; a server that cannot be reached, times out or breaks off -> `unknown`.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from engine import dns
from engine.addresses import normalize_email
from engine.delivery import mx
from engine.errors import Unprocessable
from engine.runtime import Runtime
from engine.smtp.errors import SmtpError
from engine.smtp.session import connect

PROBE_TIMEOUT = 20.0


@dataclass(frozen=True, slots=True)
class Verification:
    email: str
    result: str  # valid, invalid, risky or unknown
    reason: str
    mx_found: bool
    mx_host: str | None


async def verify(rt: Runtime, email: str, probe_sender: str) -> Verification:
    try:
        address = normalize_email(email)
    except Unprocessable as exc:
        return Verification(email, "invalid", f"malformed address: {exc.detail}", False, None)
    domain = address.rsplit("@", 1)[1]
    try:
        targets = await mx.targets(rt.resolver, domain)
    except mx.NoMailService as exc:
        return Verification(address, "invalid", str(exc), False, None)
    except dns.TemporaryDnsError as exc:
        return Verification(address, "unknown", f"DNS did not answer: {exc}", False, None)
    primary = targets[0]
    mx_found = primary.host != domain or bool(await dns.mx(rt.resolver, domain))
    try:
        with trio.fail_after(PROBE_TIMEOUT):
            session = await connect(
                primary.addresses[0],
                rt.delivery_port,
                helo_name=rt.smtp_host,
                tls=None,  # a probe carries no content worth the handshake
                timeout=PROBE_TIMEOUT,
            )
            try:
                reply = await session.probe(probe_sender, address)
            finally:
                await session.quit()
    except (SmtpError, trio.TooSlowError) as exc:
        reason = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
        return Verification(
            address,
            "unknown",
            f"{primary.host} could not be asked: {reason}",
            mx_found,
            primary.host,
        )
    if reply.is_success:
        result, reason = "valid", "the mail server accepts this address"
    elif reply.is_permanent:
        result, reason = "invalid", f"the mail server refused this address: {reply}"
    else:
        result, reason = "risky", f"the mail server deferred the question: {reply}"
    return Verification(address, result, reason, mx_found, primary.host)
