"""Email address and domain name syntax, checked without the network."""

from __future__ import annotations

import re

import idna
from email_validator import SPECIAL_USE_DOMAIN_NAMES, EmailNotValidError, validate_email

from engine.platform.errors import Unprocessable

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")

# The shape nearly every address has, lower-cased: a dot-atom of letters, digits and `._+-`
# (no dot first, last or doubled), on a name of LDH labels under an alphabetic top-level
# label. email_validator accepts each of these unchanged but for case; it is skipped for
# them because it costs more than all the rest of accepting an email in a batch.
_PLAIN = re.compile(
    r"[a-z0-9_+-](?:[a-z0-9._+-]{0,62}[a-z0-9_+-])?@(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+"
    r"([a-z]{2,63})",
    re.ASCII,
)
_SPECIAL_USE = frozenset(SPECIAL_USE_DOMAIN_NAMES)


def _plain(value: str) -> str | None:
    """The canonical form of an address of the common shape, or None to check it in full."""
    if not value.isascii() or len(value) > 254:
        return None
    low = value.lower()
    match = _PLAIN.fullmatch(low)
    # `--` (IDNA's reserved third and fourth places, xn-- labels) and `..` go the long way.
    if match is None or ".." in low or "--" in low or match[1] in _SPECIAL_USE:
        return None
    return low


def normalize_email(value: str, field: str = "email") -> str:
    """The address in canonical form (lower case, IDNA domain); Unprocessable when invalid.

    The domain is kept in its ASCII (A-label) form, as domain names are, so an address on
    an internationalised domain matches that domain however it was spelled.
    """
    if (plain := _plain(value)) is not None:
        return plain
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
