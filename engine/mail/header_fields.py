"""Header fields of outgoing messages: the rules for header text and how each field is folded.

Shared by the two writers of engine/mail/compose.py (the direct MIME writer and the stdlib
`email` package), so both refuse the same input and fold the same way.

Rules:
- Nothing a caller passes can add a header line: line breaks and control characters in any
  header text are refused (`header_text_problem` is that one rule; the send checks of
  engine/sending/intake.py apply it too, so the API answers 422 before anything is queued),
  and custom headers may not replace the headers Postroom owns (`validate_custom_headers`).
- A field is folded by the `email` package's header classes (`fold_field`) unless it is
  plain enough to be written as one line, which is what those classes write for it.
- An RFC 2047 encoded word is at most 75 characters (section 2). The package fills a
  folded line with its encoded words up to 78 columns, so a continuation line holds a word of
  76; a field where that happens is folded again at `ENCODED_FOLD_AT` (`BoundedWordsPolicy`).
- Non-ASCII text and address fields with a non-ASCII display name are encoded here
  (`encoded_text`, `encoded_addresses`): the package, folding such text, can drop a space
  that falls between two of its encoded words, or leave it between them, where a reader
  drops it (RFC 2047 6.2).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping, Sequence
from email.headerregistry import Address, BaseHeader, Group, HeaderRegistry
from email.policy import EmailPolicy, Policy
from typing import Any

Mailbox = tuple[str, str | None]
"""An address and its optional display name: ("ada@example.com", "Ada Lovelace")."""

TAGS_HEADER = "X-Postroom-Tags"

# Set by compose, by DKIM signing or by the MTAs on the way; a custom header may not replace
# (or duplicate) one of these. Lower case.
STRUCTURAL_HEADERS = frozenset(
    name.lower()
    for name in (
        "From",
        "To",
        "Cc",
        "Bcc",
        "Subject",
        "Date",
        "Message-ID",
        "MIME-Version",
        "Content-Type",
        "Content-Transfer-Encoding",
        "Content-Disposition",
        "DKIM-Signature",
        "Return-Path",
        "Received",
        "Sender",
        "Reply-To",
        "List-Unsubscribe",
        "List-Unsubscribe-Post",
        TAGS_HEADER,
    )
)

MAX_LINE = 998  # RFC 5322 2.1.1, excluding the CRLF
FOLD_AT = 78  # RFC 5322 2.1.1's "SHOULD" line length, where a header folds if it can
MAX_ENCODED_WORD = 75  # RFC 2047 2
# A continuation line's folding space, then an encoded word that fills the rest: 75.
ENCODED_FOLD_AT = MAX_ENCODED_WORD + 1
_ENCODED_WORD = re.compile(r"=\?[^?\s]+\?[BbQq]\?[^?\s]*\?=")


class HeaderClasses(HeaderRegistry):
    """The stdlib registry builds a new class for every header it parses (~12 us, a tenth
    of composing a message); this builds one per kind of header and reuses it."""

    def __init__(self, *, use_default_map: bool = True) -> None:
        super().__init__(use_default_map=use_default_map)
        self._built: dict[object, type[BaseHeader]] = {}

    def __getitem__(self, name: str) -> type[BaseHeader]:
        kind = self.registry.get(name.lower(), self.default_class)
        built = self._built.get(kind)
        if built is None:
            built = self._built[kind] = super().__getitem__(name)
        return built


def longest_encoded_word(folded: str) -> int:
    """The length of the longest RFC 2047 encoded word in folded header text (0: none)."""
    if "=?" not in folded:
        return 0
    return max((len(word) for word in _ENCODED_WORD.findall(folded)), default=0)


class BoundedWordsPolicy(EmailPolicy):
    """The package's policy, but a field whose folding makes an encoded word longer than
    `MAX_ENCODED_WORD` is folded again at `ENCODED_FOLD_AT` columns (what the generator
    writes, for the messages the package writes; `fold_field` does the same)."""

    def fold(self, name: str, value: Any) -> str:
        folded = str(super().fold(name, value))
        if longest_encoded_word(folded) <= MAX_ENCODED_WORD:
            return folded
        return str(EmailPolicy.fold(self.clone(max_line_length=ENCODED_FOLD_AT), name, value))

    def fold_binary(self, name: str, value: Any) -> bytes:
        folded = super().fold_binary(name, value)
        if longest_encoded_word(folded.decode("ascii", "replace")) <= MAX_ENCODED_WORD:
            return folded
        narrow = self.clone(max_line_length=ENCODED_FOLD_AT)
        return bytes(EmailPolicy.fold_binary(narrow, name, value))


# The stdlib's SMTP and SMTPUTF8 policies, with encoded words bounded. cte_type="7bit":
# bodies are encoded so the message needs no 8BITMIME from the next hop.
ASCII_POLICY = BoundedWordsPolicy(linesep="\r\n", cte_type="7bit", header_factory=HeaderClasses())
UTF8_POLICY = ASCII_POLICY.clone(utf8=True)
UNSTRUCTURED = HeaderClasses(use_default_map=False)

_FIELD_NAME = re.compile(r"[\x21-\x39\x3b-\x7e]+")  # RFC 5322 ftext: printable ASCII but ':'
_LINE_BREAK = re.compile(r"[\r\n]")
# C0 and C1 controls (but TAB) and the Unicode line separators, which `str.splitlines` and
# some mail readers treat as line ends.
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
MESSAGE_ID = re.compile(r"<[\x21-\x3b\x3d\x3f-\x7e]+@[\x21-\x3b\x3d\x3f-\x7e]+>")
URL = re.compile(r"[\x21-\x3b\x3d\x3f-\x7e]+")  # printable ASCII but '<' and '>'


def header_text_problem(value: str) -> str | None:
    """What makes text unfit for a header line, or None when it is fit.

    A line break (CR, LF) would end the line and start a header of the caller's; any other
    control character (but TAB, RFC 5322 whitespace) is refused with it, since some mail
    readers also treat those as line ends.
    """
    if _LINE_BREAK.search(value):
        return "contains a line break (CR or LF)"
    if CONTROL.search(value):
        return "contains a control character"
    return None


def validate_custom_headers(headers: Mapping[str, str]) -> list[str]:
    """What is wrong with a send request's custom headers, one sentence each; empty if fine."""
    return custom_header_problems(headers.items())


def custom_header_problems(headers: Iterable[tuple[str, str]]) -> list[str]:
    problems: list[str] = []
    for name, value in headers:
        if not _FIELD_NAME.fullmatch(name):
            problems.append(
                f"{name!r} is not a valid header name (printable ASCII, no spaces or colons)"
            )
            continue
        if name.lower() in STRUCTURAL_HEADERS:
            problems.append(f"header {name!r} is set by Postroom and cannot be overridden")
        problem = header_text_problem(value)
        if problem is not None:
            problems.append(f"header {name!r} {problem}")
        elif len(value) > MAX_LINE:
            problems.append(f"header {name!r} is longer than {MAX_LINE} characters")
        elif value.isascii() and _longest_line(VerbatimHeader(name, value)) > MAX_LINE:
            problems.append(
                f"header {name!r} has a word too long to fit a {MAX_LINE}-character line"
            )
    return problems


class VerbatimHeader(str):
    """An ASCII header written as given, folded only at its spaces, never RFC 2047-encoded.

    The email package encodes any word too long for a 78-column line as an encoded-word,
    which breaks structured headers (a long List-Unsubscribe URL, In-Reply-To, References).
    This follows its header-object protocol (a `name` and `fold(policy=...)`, see
    `EmailPolicy.header_store_parse`), so a message stores and writes it unchanged.
    """

    name: str

    def __new__(cls, name: str, value: str) -> VerbatimHeader:
        header = super().__new__(cls, value)
        header.name = name
        return header

    def fold(self, *, policy: Policy) -> str:
        first, *words = self.split(" ")
        # The first word stays beside the name: a value starting on a continuation line
        # would read back with a leading space.
        lines = [f"{self.name}: {first}"]
        for word in words:
            # Fold before a space (which starts the continuation line) when the line would
            # pass 78 columns, unless that leaves a line of only whitespace or the word is too
            # long for any line of 78 and still fits this one.
            joined = len(lines[-1]) + 1 + len(word)
            if (
                joined <= FOLD_AT
                or not lines[-1].strip()
                or (1 + len(word) > FOLD_AT and joined <= MAX_LINE)
            ):
                lines[-1] += " " + word
            else:
                lines.append(" " + word)
        return policy.linesep.join(lines) + policy.linesep


def _longest_line(header: VerbatimHeader) -> int:
    return max(len(line) for line in header.fold(policy=ASCII_POLICY).split("\r\n"))


def header_text(what: str, value: str) -> str:
    problem = header_text_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {problem}")
    return value


def address(what: str, mailbox: Mailbox) -> Address:
    email, name = mailbox
    username, at, domain = header_text(what, email).rpartition("@")
    if not username or not at or not domain or " " in domain:
        raise ValueError(f"{what}: {email!r} is not an email address")
    # username/domain rather than addr_spec: no reparsing, and a local part that needs
    # quoting is quoted.
    return Address(header_text(what, name or ""), username=username, domain=domain)


# What the `email` package writes as given, on one line, when the field fits in FOLD_AT
# columns: printable ASCII words one space apart; no "=?", which its parser would read as
# an RFC 2047 encoded word. Display names and addresses must also need no quoting.
_PLAIN_TEXT = re.compile(r"[\x21-\x7e]+(?: [\x21-\x7e]+)*")
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_PLAIN_NAME = re.compile(rf"{_ATEXT}(?: {_ATEXT})*")
_DOT_ATOM = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*")


def fold_field(name: str, value: Any, policy: EmailPolicy[Any] = ASCII_POLICY) -> str:
    """A header field exactly as the `email` package writes it: folded, ending in CRLF.

    `value` is what a message would be given (text, an `Address` or a list of them, a
    datetime, a `VerbatimHeader`); this is the generator's own `policy.fold` of the header
    object that assignment would store.
    """
    if isinstance(value, VerbatimHeader):
        return value.fold(policy=policy)
    header = policy.header_factory(name, value)
    folded = str(header.fold(policy=policy))
    if longest_encoded_word(folded) <= MAX_ENCODED_WORD:
        return folded
    return str(header.fold(policy=policy.clone(max_line_length=ENCODED_FOLD_AT)))


def text_field(name: str, value: str) -> str:
    """Unstructured text (Subject), as `fold_field` writes it, without parsing plain text."""
    line = f"{name}: {value}"
    if len(line) <= FOLD_AT and "=?" not in value and _PLAIN_TEXT.fullmatch(value):
        return line + "\r\n"
    return fold_field(name, value)


def address_field(name: str, value: Address | list[Address]) -> str:
    """An address field (From, To, Cc, Reply-To), as `fold_field` writes it, without
    parsing plain addresses."""
    rendered = []
    for item in value if isinstance(value, list) else [value]:
        plain = _DOT_ATOM.fullmatch(item.username) and _DOT_ATOM.fullmatch(item.domain)
        shown = item.display_name
        if not plain or (shown and ("=?" in shown or not _PLAIN_NAME.fullmatch(shown))):
            return fold_field(name, value)
        spec = f"{item.username}@{item.domain}"
        rendered.append(f"{shown} <{spec}>" if shown else spec)
    line = f"{name}: {', '.join(rendered)}"
    if len(line) <= FOLD_AT:
        return line + "\r\n"
    return fold_field(name, value)


# What a "Q" encoded word in a phrase may hold as itself (RFC 2047 5(3)); "=" and "_" have a
# meaning in Q, and the space is written "_".
_Q_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!*+-/")
_ENCODED_PREFIX = len("=?utf-8?q?")


def _q(data: bytes) -> str:
    return "".join(chr(b) if b in _Q_PLAIN else "_" if b == 0x20 else f"={b:02X}" for b in data)


def _b(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encoded_words(text: str, first: int = MAX_ENCODED_WORD) -> list[str]:
    """`text` as RFC 2047 encoded words of UTF-8: each at most `MAX_ENCODED_WORD`
    characters, the first at most `first`, split only between characters (each word decodes
    on its own, section 5); "Q" or "B", whichever is shorter for the whole text. Fit for a
    phrase (a display name) and for unstructured text alike."""
    data = text.encode("utf-8")
    plain = sum(b in _Q_PLAIN or b == 0x20 for b in data)
    use_q = plain + 3 * (len(data) - plain) <= 4 * -(-len(data) // 3)
    encode, kind = (_q, "q") if use_q else (_b, "b")
    words: list[str] = []
    chunk = b""
    room = max(first, _ENCODED_PREFIX + 2 + 12)  # room for one character, at least
    for char in text:
        longer = chunk + char.encode("utf-8")
        if chunk and _ENCODED_PREFIX + len(encode(longer)) + 2 > room:
            words.append(f"=?utf-8?{kind}?{encode(chunk)}?=")
            chunk, room = char.encode("utf-8"), MAX_ENCODED_WORD
        else:
            chunk = longer
    words.append(f"=?utf-8?{kind}?{encode(chunk)}?=")
    return words


def encoded_text(name: str, value: str) -> VerbatimHeader:
    """Unstructured text (Subject, custom fields) as encoded words, folded between them:
    every character of `value`, its spaces included, is inside a word."""
    return VerbatimHeader(name, " ".join(encoded_words(value, FOLD_AT - len(name) - 2)))


def encoded_addresses(name: str, items: Sequence[Address | Group]) -> VerbatimHeader:
    """An address field in ASCII: display names with non-ASCII text as encoded words
    (`encoded_words`), the rest as the package writes them; folded only between words, so
    no line passes 78 columns and every encoded word stays whole."""
    first = FOLD_AT - len(name) - len(": ")
    rendered: list[str] = []

    def phrase(text: str) -> str:
        return " ".join(encoded_words(text, first if not rendered else MAX_ENCODED_WORD))

    def mailbox(box: Address) -> str:
        if box.display_name and not box.display_name.isascii():
            return f"{phrase(box.display_name)} <{box.addr_spec}>"
        return str(box)

    for item in items:
        if not isinstance(item, Group):
            rendered.append(mailbox(item))
        elif item.display_name is None:  # the package's form of a plain mailbox list
            rendered.extend(mailbox(box) for box in item.addresses)
        else:
            shown = item.display_name
            label = str(Group(shown, [])).removesuffix(":;") if shown.isascii() else phrase(shown)
            boxes = ", ".join(mailbox(box) for box in item.addresses)
            rendered.append(f"{label}: {boxes};" if boxes else f"{label}:;")
    return VerbatimHeader(name, ", ".join(rendered))
