"""Email address verification: syntax, MX lookup, then an SMTP recipient probe. Never sends.

Checks run in order and stop at the first verdict: a malformed address, a domain with a null
MX or no mail host at all is `invalid`; otherwise the primary MX is asked with EHLO, MAIL FROM
and RCPT TO, then RSET — never DATA. 2xx -> `valid`, 5xx -> `invalid`, 4xx (greylisting) ->
`risky`; a server that cannot be reached, times out or breaks off -> `unknown`.

A probe connects to a server of the caller's choosing and can get the service's address
blocklisted, so each workspace may ask `VERIFY.attempts` times per window (429 beyond, held in
the database for every node); a private or reserved MX is never probed (engine/delivery/mx.py).
A sandboxed workspace's address is answered by the sandbox instead (engine/sandbox/probes.py),
under the same limit and the same reading of the reply (`judged`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import trio

from engine.addresses import normalize_email
from engine.delivery import mx
from engine.platform import dns, rate_limits
from engine.platform.errors import Unprocessable
from engine.platform.rate_limits import Limit
from engine.platform.runtime import Principal, Runtime
from engine.smtp.errors import SmtpError
from engine.smtp.replies import SmtpReply
from engine.smtp.session import connect
from storage.tx import Tx

PROBE_TIMEOUT = 20.0
VERIFY = Limit("verify", 30, timedelta(minutes=1))


@dataclass(frozen=True, slots=True)
class Verification:
    email: str
    result: str  # valid, invalid, risky or unknown
    reason: str
    mx_found: bool
    mx_host: str | None


def _count(tx: Tx, workspace_id: str, now: datetime) -> None:
    detail = f"at most {VERIFY.attempts} verifications a minute; retry after Retry-After"
    rate_limits.count(tx, [(VERIFY, VERIFY.key(workspace_id))], now, detail)


async def counted(rt: Runtime, who: Principal, email: str) -> str | Verification:
    """Count a verification against the workspace's limit (RateLimited once reached); the
    address in canonical form, or the verdict on a malformed one."""
    await rt.db.write(_count, who.workspace_id, rt.clock.now())
    try:
        return normalize_email(email)
    except Unprocessable as exc:
        return Verification(email, "invalid", f"malformed address: {exc.detail}", False, None)


def judged(address: str, reply: SmtpReply, mx_found: bool, mx_host: str) -> Verification:
    """The verdict a server's answer to RCPT TO gives."""
    if reply.is_success:
        result, reason = "valid", "the mail server accepts this address"
    elif reply.is_permanent:
        result, reason = "invalid", f"the mail server refused this address: {reply}"
    else:
        result, reason = "risky", f"the mail server deferred the question: {reply}"
    return Verification(address, result, reason, mx_found, mx_host)


async def verify(rt: Runtime, who: Principal, email: str, probe_sender: str) -> Verification:
    """Check one address for `who`'s workspace (RateLimited once its limit is reached)."""
    address = await counted(rt, who, email)
    if isinstance(address, Verification):
        return address
    domain = address.rsplit("@", 1)[1]
    try:
        targets = await mx.targets(rt.resolver, domain, allow_private=rt.allow_private_targets)
    except mx.NoMailService as exc:
        return Verification(address, "invalid", str(exc), False, None)
    except mx.PrivateTargets as exc:  # never probed: the operator's own network
        return Verification(address, "unknown", str(exc), True, None)
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
    return judged(address, reply, mx_found, primary.host)
