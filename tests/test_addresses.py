"""The fast path of address normalisation agrees with email_validator, which it skips for
addresses of the common shape (engine/addresses.py `_plain`)."""

from __future__ import annotations

import pytest
from email_validator import EmailNotValidError, validate_email
from hypothesis import given
from hypothesis import strategies as st

from engine.addresses import _plain, normalize_email
from engine.platform.errors import Unprocessable
from tests.harness.fuzz import bounded


def _full(value: str) -> str | None:
    """What the full check makes of an address: its canonical form, or None if refused."""
    try:
        checked = validate_email(value, check_deliverability=False)
    except EmailNotValidError:
        return None
    return f"{checked.local_part}@{checked.ascii_domain}".lower()


# Near the shape, and across its edges: dots, hyphens, case, digits, a few other characters.
_PIECE = st.one_of(
    st.text(alphabet="aZ9._+-", min_size=1, max_size=12),
    st.text(alphabet="aZ9._+-xn-@K\u212a\u00e9! ", min_size=0, max_size=12),
)
_TLD = st.sampled_from(["com", "io", "Test", "local", "c", "123", "x1", "arpa", "ORG"])


# Shaped like an address, with every edge of the fast path's shape in reach.
_SHAPED = st.from_regex(
    r"[a-zA-Z0-9._+-]{1,66}@([a-zA-Z0-9-]{1,64}\.){1,3}(com|[a-zA-Z0-9-]{1,4})", fullmatch=True
)


@bounded(2000)
@given(address=st.one_of(_SHAPED, st.builds("{}@{}.{}".format, _PIECE, _PIECE, _TLD)))
def test_every_address_the_fast_path_takes_is_valid_and_canonical_as_in_full(
    address: str,
) -> None:
    plain = _plain(address)
    if plain is not None:
        assert plain == _full(address), address


@pytest.mark.parametrize(
    "address",
    [
        "Ann.Lee+news@Example.COM",
        "a_b-c@mail.shop-1.example.org",
        "x" * 64 + "@example.com",
        "a@" + ".".join(["b" * 63] * 3) + ".com",
    ],
)
def test_common_addresses_take_the_fast_path(address: str) -> None:
    assert _plain(address) == _full(address) == normalize_email(address)


@pytest.mark.parametrize(
    "address",
    [
        "x" * 65 + "@example.com",  # local part over 64
        "a..b@example.com",
        "a@example.test",  # special-use name
        "a@-example.com",
        "a@example",  # no dot
        "ann@ex--ample.com",  # IDNA's reserved places
        "\u212aim@example.com",  # KELVIN SIGN, which lower-cases to ASCII
    ],
)
def test_other_addresses_get_the_full_check(address: str) -> None:
    assert _plain(address) is None
    if _full(address) is None:
        with pytest.raises(Unprocessable):
            normalize_email(address)
    else:
        assert normalize_email(address) == _full(address)
