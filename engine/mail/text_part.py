"""The text/plain alternative of mail sent with HTML only.

Mail without a text part reads badly in plain-text clients and scores with spam filters
(SpamAssassin's MIME_HTML_ONLY), so delivery writes one from the HTML. inscriptis
(Apache-2.0, pure Python over lxml) lays the HTML out as text the way a browser would lay it
out on screen: blocks, lists and tables in place, each link's target after its text, so a
link still works in the text part. Pure: no I/O.
"""

from __future__ import annotations

from inscriptis import get_text
from inscriptis.model.config import ParserConfig
from lxml.etree import LxmlError

_CONFIG = ParserConfig(display_links=True)


def from_html(html: str) -> str | None:
    """The text of an HTML body, or None when it holds no text (an image alone) or does not
    parse: the message then goes out as HTML only rather than with an empty text part."""
    try:
        text = get_text(html, _CONFIG)
    except (LxmlError, ValueError):
        return None
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    return "\n".join(lines) + "\n" if any(lines) else None
