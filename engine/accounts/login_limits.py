"""Limits on password guessing, per account and per client address, shared by every node.

Every login and re-authentication attempt is counted in the database before its password is
checked, in the same unit of work that reads the counts, so concurrent attempts on any node
cannot slip past a limit and a refused attempt costs no argon2. An account is keyed by the
SHA-256 of the email as typed, whether or not a user has it, so a limit is reached, answered
and lifted the same way for an unknown address as for a known one.

A correct password resets its account's count. An address's count only lapses with its
window: a login to one's own account must not buy more guesses at other people's.

SMTP AUTH on the relay counts failures only (`relay_*`): a relay client authenticates on
every connection, and counting each would throttle an honest busy sender. The counts are
read in the unit of work that reads the credential, and a failure is counted right after
it; attempts racing on open connections can pass a reached limit by at most the number of
connections a client may hold (relay/listener.py).
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.platform import rate_limits
from engine.platform.rate_limits import Limit
from storage import rate_limits as counters
from storage.tx import Tx

# Failures per account: slow enough for guessing to be hopeless, and a legitimate user
# locked out by someone else's guesses waits at most 15 minutes.
ACCOUNT = Limit("account", 10, timedelta(minutes=15))
# Attempts per client address, across accounts: bounds spraying one common password over
# many accounts from one address.
ADDRESS = Limit("ip", 30, timedelta(minutes=1))
# IPv6 addresses are counted per /64, the block one subscriber is usually given whole.
IPV6_PREFIX = 64
# Failed SMTP AUTH per username, as for accounts; and per client address across usernames,
# a little more, for one office behind one address whose clients share a few usernames.
RELAY_USERNAME = Limit("smtp_user", 10, timedelta(minutes=15))
RELAY_ADDRESS = Limit("smtp_ip", 30, timedelta(minutes=15))


@dataclass(frozen=True, slots=True)
class Attempt:
    """Whose password attempt this is: its account key and its client address key."""

    account: str
    address: str


def attempt(email: str, client: str | None) -> Attempt:
    """The keys of an attempt on `email` (as it will be looked up) from peer address `client`."""
    return Attempt(
        account=ACCOUNT.key(hashlib.sha256(email.encode()).hexdigest()),
        address=ADDRESS.key(client_group(client)),
    )


def client_group(client: str | None) -> str:
    """The key a peer address is counted under: an IPv4 address as it is, an IPv6 address
    by its /64 (an IPv4-mapped one as the IPv4 address), "unknown" without one."""
    try:
        ip = ipaddress.ip_address(client or "")
    except ValueError:
        return "unknown"  # no peer address (a UNIX socket): all such callers share one count
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network((ip, IPV6_PREFIX), strict=False))
    return str(ip)


def count(tx: Tx, who: Attempt, now: datetime) -> None:
    """Count an attempt against both limits; RateLimited when either is already reached."""
    # Always the account row first, then the address row: one lock order on every node.
    rate_limits.count(
        tx,
        [(ACCOUNT, who.account), (ADDRESS, who.address)],
        now,
        "too many password attempts; retry after the time in Retry-After",
    )


def succeeded(tx: Tx, who: Attempt) -> None:
    """A correct password: the account's failures are forgiven (the address's are not)."""
    rate_limits.forget(tx, who.account)


def relay_attempt(username: str, client: str | None) -> Attempt:
    """The keys of an SMTP AUTH attempt as `username` (as typed) from peer address `client`."""
    return Attempt(
        account=RELAY_USERNAME.key(hashlib.sha256(username.lower().encode()).hexdigest()),
        address=RELAY_ADDRESS.key(client_group(client)),
    )


def relay_failures(tx: Tx, who: Attempt, now: datetime) -> tuple[bool, int]:
    """Whether the attempt is refused unchecked (a limit is reached), and the username's
    failures so far."""
    username = counters.attempts(tx, who.account, now)
    address = counters.attempts(tx, who.address, now)
    refused = username >= RELAY_USERNAME.attempts or address >= RELAY_ADDRESS.attempts
    return refused, username


def relay_failed(tx: Tx, who: Attempt, now: datetime) -> None:
    """Count a failed SMTP AUTH against its username and its client address."""
    for limit, key in ((RELAY_USERNAME, who.account), (RELAY_ADDRESS, who.address)):
        counters.count(tx, key, now, now + limit.window)
    counters.prune(tx, now)
