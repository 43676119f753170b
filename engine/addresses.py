"""Email address and domain name syntax, checked without the network."""

from __future__ import annotations

import re

from email_validator import EmailNotValidError, validate_email

from engine.errors import Unprocessable

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def normalize_email(value: str, field: str = "email") -> str:
    """The address in canonical form (lower case); Unprocessable when it is not one."""
    try:
        checked = validate_email(value, check_deliverability=False)
    except EmailNotValidError as exc:
        raise Unprocessable(
            f"{field}: {exc}", errors=[{"loc": ["body", field], "msg": str(exc)}]
        ) from None
    return checked.normalized.lower()


def normalize_domain(value: str) -> str:
    """The domain name in canonical form (lower case, IDNA, no trailing dot)."""
    name = value.strip().rstrip(".").lower()
    try:
        ascii_name = name.encode("idna").decode("ascii")
    except UnicodeError:
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
