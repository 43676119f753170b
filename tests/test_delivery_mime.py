"""The direct MIME writer against the `email` package: the same bytes for every shape it
writes, and those bytes read back by a mail reader (the stdlib parser) as what was sent."""

from __future__ import annotations

import email
import email.policy
from datetime import datetime, timedelta, timezone
from email.message import EmailMessage
from typing import Any

import dkim as dkimpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.domains.dkim_keys import DkimKey, _generate
from engine.mail.compose import (
    Attachment,
    OutgoingMessage,
    compose,
    compose_directly,
    compose_with_email_package,
)
from engine.mail.dkim import sign
from tests.harness import messages
from tests.harness.messages import dns_for

BOUNDARIES = ("=_" + "a" * 32, "=_" + "b" * 32)
PDF = bytes(range(256)) * 5 + b"\r\n.\r\n"


def make(**changes: Any) -> OutgoingMessage:
    unsubscribable = {
        "list_unsubscribe": "https://postroom.example.net/v1/unsubscribe/t0k3n",
        "tags": ("receipt",),
    }
    return messages.make(**(unsubscribable | changes))


SHAPES: dict[str, dict[str, Any]] = {
    "text only": {},
    "html only": {"text": None, "html": "<p>Thanks for your <b>order</b>.</p>"},
    "text and html": {"html": "<p>Thanks</p>\n"},
    "text with an attachment": {
        "attachments": (Attachment("receipt.pdf", "application/pdf", PDF),)
    },
    "both with attachments": {
        "html": "<p>Thanks</p>",
        "attachments": (
            Attachment("receipt.pdf", "application/PDF", PDF),
            Attachment("", "image/png", b"\x89PNG"),
            Attachment("empty.txt", "text/plain", b""),
        ),
    },
    "attachment needing RFC 2231": {
        "attachments": (Attachment("Überweisung März.pdf", "application/pdf", PDF),)
    },
    "attachment with parameters": {
        "attachments": (Attachment("data.csv", "text/csv; charset=utf-8", b"a,b\r\n"),)
    },
    "attachment of an unusable type": {
        "attachments": (Attachment("x.eml", "message/rfc822", b"From: x\r\n\r\nhi"),)
    },
    "attachment with a long name": {
        "attachments": (Attachment("quarterly report " * 6 + ".pdf", "application/pdf", PDF),)
    },
    "attachment name with quotes": {
        "attachments": (Attachment('the "final" one.pdf', "application/pdf", PDF),)
    },
    "non-ASCII subject": {"subject": "Ihre Bestellung über 30 € ist unterwegs"},
    "long non-ASCII subject": {"subject": "Ünïcödé " * 30},
    "long ASCII subject": {"subject": "Your order " * 20},
    "subject with an encoded-word lookalike": {"subject": "=?utf-8?q?hi?= there"},
    "empty subject": {"subject": ""},
    "subject with odd spacing": {"subject": "  two  spaces\tand a tab "},
    "non-ASCII names": {
        "from_name": "Zoë Ångström",
        "to": (("bob@example.org", "Björk"), ("li@example.org", "李")),
    },
    "names needing quotes": {
        "from_name": "Lovelace, Ada (Countess)",
        "to": (("bob@example.org", "Dr. Bob"), ("x@example.org", 'Say "hi"')),
    },
    "many recipients": {
        "to": tuple((f"reader{i}@example.org", f"Reader {i}") for i in range(12)),
        "cc": tuple((f"cc{i}@example.net", None) for i in range(5)),
    },
    "quoted local part": {"to": (("first last@example.org", None),)},
    "reply-to": {"reply_to": ("help@mail.example.com", "Help desk")},
    "no list-unsubscribe nor tags": {"list_unsubscribe": None, "tags": ()},
    "many tags": {"tags": tuple(f"tag-{i}" for i in range(40))},
    "non-ASCII tag": {"tags": ("café",)},
    "custom headers": {
        "headers": (
            ("X-Campaign", "spring"),
            ("In-Reply-To", "<" + "r" * 90 + "@example.org>"),
            ("X-Long", " ".join(["word"] * 150)),
            ("X-Unicode", "naïve"),
        )
    },
    "long text lines": {"text": ("a" * 100 + "\n") * 3},
    "non-ASCII text": {"text": "Grüße aus Köln\n" * 3},
    "non-ASCII text of many lines": {"text": "Grüße aus Köln\n" * 40},
    "mostly non-ASCII text": {"text": "日本語のテキスト\n" * 12},
    "html of long lines": {"html": "<p>" + "é" * 4000 + "</p>\n"},
    "bare CR and CRLF line ends": {"text": "one\rtwo\r\nthree\nfour", "html": "<p>\r\n</p>"},
    "empty text": {"text": ""},
    "dot lines and trailing spaces": {"text": ".\n..\nend   \n\n\n"},
    "another time zone": {"date": datetime(2024, 5, 1, 9, 0, tzinfo=timezone(timedelta(hours=-7)))},
}


def parse(raw: bytes) -> EmailMessage:
    return email.message_from_bytes(raw, policy=email.policy.default)


@pytest.mark.parametrize("changes", SHAPES.values(), ids=SHAPES.keys())
def test_direct_writer_gives_the_email_packages_bytes(changes: dict[str, Any]) -> None:
    message = make(**changes)
    assert compose_directly(message, BOUNDARIES) == compose_with_email_package(message, BOUNDARIES)


@pytest.mark.parametrize("changes", SHAPES.values(), ids=SHAPES.keys())
def test_composed_message_is_valid_mime_that_reads_back_as_sent(changes: dict[str, Any]) -> None:
    message = make(**changes)
    raw = compose(message)
    assert raw.isascii() and raw.endswith(b"\r\n")
    assert b"\r" not in raw.replace(b"\r\n", b"") and b"\n" not in raw.replace(b"\r\n", b"")
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998
    parsed = parse(raw)
    assert all(not part.defects for part in parsed.walk())
    # Folding may turn runs of white space into one space; the words are the subject's. (The
    # `email` package takes a subject's "=?...?=" for an encoded word, as readers will.)
    if "=?" not in message.subject:
        assert parsed["Subject"].split() == message.subject.split()
    assert parsed["Message-ID"] == message.message_id
    assert parsed["From"].addresses[0].addr_spec == message.from_address
    to = [f"{a.username}@{a.domain}" for a in parsed["To"].addresses]
    assert to == [address for address, _ in message.to]
    for body, kind in ((message.text, "plain"), (message.html, "html")):
        if body is not None:
            part = parsed.get_body(preferencelist=(kind,))
            assert part is not None
            got = part.get_content().replace("\r\n", "\n").replace("\r", "\n")
            assert got.rstrip("\n") == body.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
    files = list(parsed.iter_attachments())
    assert [f.get_content() for f in files if f.get_content_maintype() != "text"] == [
        a.content for a in message.attachments if not a.content_type.startswith("text/")
    ]


@pytest.fixture(scope="module")
def key() -> DkimKey:
    return _generate()


@pytest.mark.parametrize("changes", SHAPES.values(), ids=SHAPES.keys())
def test_every_shape_signed_verifies_with_dkimpy(key: DkimKey, changes: dict[str, Any]) -> None:
    raw = sign(
        compose(make(**changes)),
        domain="mail.example.com",
        selector=key.selector,
        private_key_pem=key.private_pem,
    )
    assert dkimpy.verify(raw, dnsfunc=dns_for(key, "mail.example.com"))


def test_non_ascii_addresses_are_written_by_the_email_package_as_smtputf8() -> None:
    message = make(to=(("zoë@exämple.org", "Zoë"),))
    raw = compose(message)
    assert "To: Zoë <zoë@exämple.org>".encode() in raw


_TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp")), max_size=120
)
_WORDS = st.text(
    st.sampled_from("abcXYZ09 .,;:'\"()<>@[]\\!#=?_-é€"), min_size=1, max_size=90
).filter(lambda s: s.strip() != "" and "\x85" not in s)


@settings(
    max_examples=150, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    subject=_TEXT,
    name=_WORDS,
    filename=_WORDS,
    text=st.text(max_size=300),
    content_type=st.sampled_from(["application/pdf", "Image/PNG", "text/x-a+b", "a/b; x=y"]),
)
def test_direct_writer_agrees_with_the_email_package_on_any_text(
    subject: str, name: str, filename: str, text: str, content_type: str
) -> None:
    message = make(
        subject=subject,
        from_name=name,
        to=(("bob@example.org", name), ("carol@example.org", None)),
        text=text,
        attachments=(Attachment(filename, content_type, b"data"),),
    )
    try:
        expected = compose_with_email_package(message, BOUNDARIES)
    except ValueError:  # header text the composer refuses: the direct writer must refuse too
        with pytest.raises(ValueError):
            compose_directly(message, BOUNDARIES)
        return
    assert compose_directly(message, BOUNDARIES) == expected
