"""The visible unsubscribe link of mail that offers one: `{{unsubscribe_url}}` and the
footer (issue 30; Gmail and Yahoo want a visible link beside the one-click header). Pure.

Rules:
- In an email that carries unsubscribe (engine/suppressions/scopes.py), `{{unsubscribe_url}}`
  (spaces inside the braces allowed) in the text and html parts becomes the recipient's own
  link. Template and bulk rendering leave the variable for this (engine/templates/variables.py).
- Each part that does not place the variable gets the workspace's footer, when its footer is
  on: the text footer after a blank line, the html footer before `</body>` (at the end when
  there is none). A part that places the link itself gets none: the link is never there twice.
- A workspace's footer has a text and an html wording, each of which must place
  `{{unsubscribe_url}}` once at least; no stored footer means `DEFAULT`.
- A subject may not place it (`subject_problem`): only the parts are filled, so every
  recipient would read the braces. Sends, templates and broadcasts refuse it (422).
"""

from __future__ import annotations

import html as html_text
import re
from dataclasses import dataclass

UNSUBSCRIBE_URL = "unsubscribe_url"
VARIABLE = re.compile(r"\{\{\s*unsubscribe_url\s*\}\}")
MAX_FOOTER = 2_000  # characters of each wording
_BODY_END = re.compile(r"</body\s*>", re.IGNORECASE)


def subject_problem(subject: str | None) -> str | None:
    """Why a subject may not go out as it is, or None."""
    if subject and VARIABLE.search(subject):
        return "{{unsubscribe_url}} is filled in the body only: the subject would show the braces"
    return None


@dataclass(frozen=True, slots=True)
class Footer:
    enabled: bool
    text: str
    html: str


DEFAULT = Footer(
    enabled=True,
    text="Unsubscribe from these emails: {{unsubscribe_url}}",
    html=(
        '<p style="font-size:12px;color:#6b6b6b">Don\'t want these emails?'
        ' <a href="{{unsubscribe_url}}">Unsubscribe</a>.</p>'
    ),
)


def wording_problem(wording: str) -> str | None:
    """Why a footer wording is refused, or None."""
    if not VARIABLE.search(wording):
        return "must contain {{unsubscribe_url}}"
    if len(wording) > MAX_FOOTER:
        return f"must be at most {MAX_FOOTER} characters"
    return None


def _fill(part: str, url: str) -> str:
    return VARIABLE.sub(lambda _: url, part)


def personal_text(text: str | None, url: str, footer: Footer) -> str | None:
    """A text part with the recipient's link placed, or the footer added."""
    if text is None:
        return None
    if VARIABLE.search(text) or not footer.enabled:
        return _fill(text, url)
    return f"{text.rstrip()}\n\n{_fill(footer.text, url)}\n"


def personal_html(html: str | None, url: str, footer: Footer) -> str | None:
    """An html part with the recipient's link placed (escaped as an attribute value and as
    text alike), or the footer added before `</body>`."""
    if html is None:
        return None
    escaped = html_text.escape(url)
    if VARIABLE.search(html) or not footer.enabled:
        return _fill(html, escaped)
    added = _fill(footer.html, escaped)
    ends = list(_BODY_END.finditer(html))
    if not ends:
        return html + added
    at = ends[-1].start()
    return html[:at] + added + html[at:]
