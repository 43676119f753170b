"""Email address and domain name syntax, checked without the network."""

from __future__ import annotations

import re

import idna
from email_validator import EmailNotValidError, validate_email

from engine.errors import Unprocessable

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def normalize_email(value: str, field: str = "email") -> str:
    """The address in canonical form (lower case, IDNA domain); Unprocessable when invalid.

    The domain is kept in its ASCII (A-label) form, as domain names are, so an address on
    an internationalised domain matches that domain however it was spelled.
    """
    try:
        checked = validate_email(value, check_deliverability=False)
    except EmailNotValidError as exc:
        raise Unprocessable(
            f"{field}: {exc}", errors=[{"loc": ["body", field], "msg": str(exc)}]
        ) from None
    return f"{checked.local_part}@{checked.ascii_domain}".lower()


def normalize_domain(value: str) -> str:
    """The domain name in canonical form (lower case, IDNA 2008 A-labels, no trailing dot)."""
    name = value.strip().rstrip(".").lower()
    try:
        # UTS 46 non-transitional processing, as registries and email addresses use it:
        # `faß.de` is its own domain (xn--fa-hia.de), not `fass.de`.
        ascii_name = idna.encode(name, uts46=True, transitional=False).decode("ascii")
    except (idna.IDNAError, UnicodeError):
        ascii_name = ""
    labels = ascii_name.split(".")
    if (
        len(ascii_name) > 253
        or len(labels) < 2
        or not all(_LABEL.match(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise Unprocessable(
            f"{value!r} is not a domain name",
            errors=[{"loc": ["body", "name"], "msg": "not a valid domain name"}],
        )
    return ascii_name
