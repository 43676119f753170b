"""Identifiers an outgoing email carries: its Message-ID and its per-email bounce address.

Both use the sending domain, as DMARC alignment and the domain's reputation want. The
envelope sender of every email is `bounces+<email id>@<sending domain>` (VERP), so a
delivery status notification or complaint that reaches the inbound server names the email
it is about, whatever the remote server quotes of the original.
"""

from __future__ import annotations

import os
import re

BOUNCE_PREFIX = "bounces"
# The mailto: alternative of List-Unsubscribe: `unsubscribe+<email id>@<bounce domain>`.
UNSUBSCRIBE_PREFIX = "unsubscribe"

_DOMAIN = re.compile(r"(?=.{1,253}\Z)[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?", re.IGNORECASE)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def message_id(domain: str) -> str:
    """A new, globally unique Message-ID on the sending domain: `<32 hex digits@domain>`."""
    # 128 random bits, as unique as a UUID's 122, at a fifth of uuid4's cost per email.
    return f"<{os.urandom(16).hex()}@{_ascii_domain(domain)}>"


def bounce_address(email_id: str, domain: str) -> str:
    """The envelope sender (Return-Path) for one email: `bounces+<email_id>@<domain>`.

    Raises ValueError unless email_id is a UUID (the local part stays under 64 octets and
    `email_id_from_bounce_address` reads it back).
    """
    if not _UUID.fullmatch(email_id):
        raise ValueError(f"email id {email_id!r} is not a UUID")
    return f"{BOUNCE_PREFIX}+{email_id.lower()}@{_ascii_domain(domain)}"


def email_id_from_bounce_address(address: str) -> str | None:
    """The email id in a bounce address (any domain, any case, `<>` allowed), else None."""
    return _email_id(address, BOUNCE_PREFIX)


def unsubscribe_address(bounce: str) -> str:
    """The mailto: unsubscribe address of the email whose bounce address is `bounce`: on
    the same domain, which the inbound MX serves for the email's reports already."""
    local, _, domain = bounce.rpartition("@")
    return f"{UNSUBSCRIBE_PREFIX}+{local.partition('+')[2]}@{domain}"


def email_id_from_unsubscribe_address(address: str) -> str | None:
    """The email id in an unsubscribe address (any domain, any case, `<>` allowed), else None."""
    return _email_id(address, UNSUBSCRIBE_PREFIX)


def _email_id(address: str, wanted: str) -> str | None:
    local, at, domain = address.strip().removeprefix("<").removesuffix(">").rpartition("@")
    prefix, plus, email_id = local.partition("+")
    if not at or not domain or not plus or prefix.lower() != wanted:
        return None
    if not _UUID.fullmatch(email_id):
        return None
    return email_id.lower()


def _ascii_domain(domain: str) -> str:
    name = domain.rstrip(".").lower()
    if not _DOMAIN.fullmatch(name):
        raise ValueError(f"{domain!r} is not an ASCII domain name")
    return name
