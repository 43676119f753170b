"""Template variables: `{{name}}` placeholders, found and filled in (pure functions).

One renderer serves templates and bulk sends. Rules:
- A placeholder is `{{` name `}}`; spaces inside the braces are ignored, and a name is any
  text without braces or line breaks (CSV headers such as `First Name` are valid names).
- Substitution is a single pass: a value that itself contains `{{x}}` is not expanded again.
  An unknown variable renders as the empty string. Values are HTML-escaped in HTML bodies,
  and have line breaks (any control character) folded into spaces in subjects.
- `{{unsubscribe_url}}` is filled at delivery, with each recipient's own link
  (engine/mail/unsubscribe_footer.py): rendering leaves it as it is, whatever the values say.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

from engine.mail.compose import CONTROL
from engine.mail.unsubscribe_footer import UNSUBSCRIBE_URL

_CONTROL_RUN = re.compile(CONTROL.pattern + "+")  # folded into one space

PLACEHOLDER = re.compile(r"\{\{\s*([^{}\r\n]+?)\s*\}\}")
# Filled per recipient when the message is built, not when the body is rendered.
AT_DELIVERY = frozenset({UNSUBSCRIBE_URL})
# What may not appear in a header line (as engine/mail/compose.py refuses it).


def extract(*texts: str | None) -> list[str]:
    """The variable names used in the texts: each once, sorted."""
    return sorted({m.group(1) for text in texts if text for m in PLACEHOLDER.finditer(text)})


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render(template: str, values: Mapping[str, Any], *, escape_html: bool = False) -> str:
    """The template with every placeholder replaced by its value (empty when unknown)."""
    if "{{" not in template:
        return template

    def fill(match: re.Match[str]) -> str:
        if match.group(1) in AT_DELIVERY:
            return match.group(0)
        value = _text(values.get(match.group(1)))
        return html.escape(value) if escape_html else value

    return PLACEHOLDER.sub(fill, template)


def render_subject(template: str, values: Mapping[str, Any]) -> str:
    """A subject line: line breaks and other control characters folded into single spaces."""
    return _CONTROL_RUN.sub(" ", render(template, values))


def header_safe(text: str | None) -> str | None:
    """A display name fit for a header: control characters and runs of spaces folded into
    single spaces, trimmed; None when nothing is left."""
    if text is None:
        return None
    return " ".join(_CONTROL_RUN.sub(" ", text).split()) or None


def contact_values(
    email: str, name: str | None, metadata: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The variables of one contact: its metadata, then `email` and `name` (these win)."""
    values: dict[str, Any] = dict(metadata or {})
    values["email"] = email
    values["name"] = name or ""
    return values
