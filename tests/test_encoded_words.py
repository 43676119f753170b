"""RFC 2047 encoded words in the headers Postroom writes: every subject and display name, in
any script and of any length, reads back the same with the `email` package, and no encoded
word is longer than 75 characters (section 2), whichever writer wrote it: the direct one,
the `email` package (engine/mail/compose.py), or the downgrade of a UTF-8 header
(engine/mail/international.py)."""

from __future__ import annotations

import dataclasses
import email
import email.policy
import re
from email.header import decode_header, make_header

from hypothesis import given
from hypothesis import strategies as st

from engine.mail.compose import compose, compose_with_email_package
from engine.mail.header_fields import FOLD_AT, MAX_ENCODED_WORD
from engine.mail.international import downgrade
from tests.harness.fuzz import bounded
from tests.harness.messages import make

_ENCODED_WORD = re.compile(rb"=\?[^?\s]+\?[BbQq]\?[^?\s]*\?=")

# Words of one script each, and words mixing them: Latin with accents, CJK, emoji (some
# outside the BMP, some joined with ZWJ), and plain ASCII, including RFC 2047's own
# specials ("=?", "?=", "_") that must not be read back as encoding.
_LATIN = st.text(alphabet="abcdeéèêëàâçîïôöùûüœæßÉÀÇ", min_size=1, max_size=14)
_CJK = st.text(alphabet="会議日本語のテキスト中文한국어漢字", min_size=1, max_size=30)
_EMOJI = st.lists(
    st.sampled_from(
        ["\U0001f600", "\U0001f389", "\u2764\ufe0f", "\U0001f468\u200d\U0001f4bb", "✉"]
    ),
    min_size=1,
    max_size=12,
).map("".join)
_ASCII = st.text(alphabet="abcXYZ019=?_.,:;!'\"()<>@-", min_size=1, max_size=20)
# Display names: the same words without RFC 5322's specials (which would be quoted).
_NAME_WORD = st.one_of(_LATIN, _CJK, _EMOJI, st.text(alphabet="abcXYZ019=?_-", min_size=1))
NAME = st.lists(_NAME_WORD, min_size=1, max_size=30).map(" ".join)
_WORD = st.one_of(
    _LATIN, _CJK, _EMOJI, _ASCII, st.text(min_size=1, max_size=8).filter(str.isprintable)
)
TEXT = st.lists(_WORD, min_size=1, max_size=40).map(" ".join).filter(lambda t: t.strip() == t)


def _checked(raw: bytes) -> email.message.EmailMessage:
    """The message parsed back, once its header is checked: ASCII, every line at most 78
    characters (but one that holds a single ASCII word no fold can break, RFC 5322 2.1.1),
    every encoded word at most 75."""
    header = raw.split(b"\r\n\r\n")[0]
    assert header.isascii()
    for line in header.split(b"\r\n"):
        words = line.split(b": ", 1)[-1].split()
        assert len(line) <= FOLD_AT or (len(words) == 1 and b"=?" not in line), header
    words = _ENCODED_WORD.findall(header)
    assert all(len(word) <= MAX_ENCODED_WORD for word in words), words
    return email.message_from_bytes(raw, policy=email.policy.default)


def _mailbox(raw: bytes, field: str) -> str:
    """An address field decoded as RFC 2047 6.2 says: the space between two adjacent
    encoded words is not text. (The `email` package's parser keeps it in a display name,
    though it drops it in unstructured text; its legacy decoder follows the RFC.)"""
    legacy = email.message_from_bytes(raw, policy=email.policy.compat32)
    unfolded = re.sub(r"\r?\n(?=[ \t])", "", legacy[field])  # RFC 5322 2.2.3
    return str(make_header(decode_header(unfolded))).strip()  # leading FWS is not text


@bounded(400)
@given(subject=TEXT, name=NAME)
def test_subjects_and_names_read_back_the_same_with_bounded_encoded_words(
    subject: str, name: str
) -> None:
    message = make(subject=subject, from_name=name, to=(("bob@example.org", name),))
    for raw in (compose(message), compose_with_email_package(message, ("=_a", "=_b"))):
        assert _checked(raw)["subject"] == subject
        assert _mailbox(raw, "From") == f"{name} <ada@mail.example.com>"
        assert _mailbox(raw, "To") == f"{name} <bob@example.org>"


@bounded(200)
@given(subject=TEXT, name=NAME)
def test_a_downgraded_utf8_header_reads_back_the_same(subject: str, name: str) -> None:
    utf8 = (
        f"From: {name} <ada@mail.example.com>\r\nTo: bob@example.org\r\n"
        f"Subject: {subject}\r\nX-Note: {subject}\r\n\r\nBody.\r\n"
    ).encode()
    raw = downgrade(utf8)
    parsed = _checked(raw)
    assert parsed["subject"] == parsed["x-note"] == subject
    assert _mailbox(raw, "From") == f"{name} <ada@mail.example.com>"


def test_the_longest_subjects_of_each_script_fold_within_bounds() -> None:
    for piece in ("é", "会", "\U0001f600", "a", "é a "):
        for length in range(1, 400, 7):
            subject = (piece * length).strip()
            parsed = _checked(compose(dataclasses.replace(make(), subject=subject)))
            assert parsed["subject"] == subject
