"""RFC 5322 address lists (From, Sender) read strictly, to decide who a message says it is from.

Lenient parsers guess at malformed input, and two programs guessing differently disagree on
the author: `email.utils.getaddresses` reads `a@ours <b@theirs>` as two addresses, the
`email.headerregistry` parser as one (`a@ours`), a mail program may show `b@theirs`. A check
that reads one address while the recipient sees another is no check. So this reads only the
grammar of RFC 5322 3.4 (with comments anywhere CFWS may be, quoted strings, a display name
of words and dots, groups as RFC 6854 allows them in From) and answers None for anything
else: such a header is refused, never guessed at. An encoded word (RFC 2047) is a word of a
display name, never an address.
"""

from __future__ import annotations

import re

# One token at a position: folding white space, a quoted string (with quoted pairs), a
# domain literal, an atom (RFC 6532 allows UTF-8 in it), or a special. Comments nest, so
# `_skip_comment` reads them.
_TOKEN = re.compile(
    r"""(?P<space>[ \t]+)
    |(?P<quoted>"(?:[^"\\\r\n]|\\[^\r\n])*")
    |(?P<literal>\[[^\[\]\\\r\n]*\])
    |(?P<atom>[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~\u0080-\U0010ffff]+)
    |(?P<special>[<>:;@,.])""",
    re.VERBOSE,
)

Token = tuple[str, str]  # (kind, text): kind is "quoted", "literal", "atom" or the special


def _skip_comment(value: str, start: int) -> int | None:
    """The position after the comment opening at `start`; None if it never closes."""
    depth = 0
    i = start
    while i < len(value):
        char = value[i]
        if char == "\\":
            i += 1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _tokens(value: str) -> list[Token] | None:
    """The tokens of `value` without white space and comments; None on a stray character."""
    tokens: list[Token] = []
    i = 0
    while i < len(value):
        if value[i] == "(":
            end = _skip_comment(value, i)
            if end is None:
                return None
            i = end
            continue
        match = _TOKEN.match(value, i)
        if match is None:
            return None
        kind = match.lastgroup
        if kind == "special":
            tokens.append((match[0], match[0]))
        elif kind != "space":
            tokens.append((str(kind), match[0]))
        i = match.end()
    return tokens


class _Parser:
    """Recursive descent over the tokens; each method returns None when the grammar fails."""

    def __init__(self, tokens: list[Token]) -> None:
        self._tokens = tokens
        self._at = 0

    def _peek(self) -> str | None:
        return self._tokens[self._at][0] if self._at < len(self._tokens) else None

    def _take(self, kind: str) -> bool:
        if self._peek() != kind:
            return False
        self._at += 1
        return True

    def address_list(self) -> list[str] | None:
        found: list[str] = []
        while True:
            members = self._address()
            if members is None:
                return None
            found += members
            if self._peek() is None:
                return found
            if not self._take(","):
                return None

    def _address(self) -> list[str] | None:
        """A mailbox (one address) or a group (its members, perhaps none)."""
        start = self._at
        words = self._words()
        if self._peek() == ":":
            if not words:
                return None
            self._at += 1
            return self._group_rest()
        self._at = start
        mailbox = self._mailbox()
        return None if mailbox is None else [mailbox]

    def _group_rest(self) -> list[str] | None:
        members: list[str] = []
        if self._take(";"):
            return members
        while True:
            mailbox = self._mailbox()
            if mailbox is None:
                return None
            members.append(mailbox)
            if self._take(";"):
                return members
            if not self._take(","):
                return None

    def _mailbox(self) -> str | None:
        """name-addr (`[display name] <addr-spec>`) or a bare addr-spec."""
        start = self._at
        self._words()
        if self._take("<"):
            address = self._addr_spec()
            return address if address is not None and self._take(">") else None
        self._at = start
        return self._addr_spec()

    def _words(self) -> list[str]:
        """A display name: words and dots (obs-phrase), perhaps none."""
        words: list[str] = []
        while self._peek() in ("atom", "quoted", "."):
            words.append(self._tokens[self._at][1])
            self._at += 1
        return words

    def _addr_spec(self) -> str | None:
        local = self._dotted(("atom", "quoted"))
        if local is None or not self._take("@"):
            return None
        if self._peek() == "literal":
            domain: str | None = self._tokens[self._at][1]
            self._at += 1
        else:
            domain = self._dotted(("atom",))
        return None if domain is None else f"{local}@{domain}"

    def _dotted(self, kinds: tuple[str, ...]) -> str | None:
        """word *("." word), each word of `kinds`, joined as written."""
        parts: list[str] = []
        while True:
            if self._peek() not in kinds:
                return None
            parts.append(self._tokens[self._at][1])
            self._at += 1
            if not self._take("."):
                return ".".join(parts)


def addresses(value: str) -> list[str] | None:
    """The addresses (addr-specs, as written) of an unfolded address-list field value, a
    group's members included, in order; None when the value is not an address list."""
    tokens = _tokens(value)
    if not tokens:
        return None
    return _Parser(tokens).address_list()
