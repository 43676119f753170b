"""What one message of a bulk send will look like: the list's first contact, rendered with
the variables renderer the send itself uses (engine/templates/variables.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.contacts import lists
from engine.platform.runtime import Principal, Runtime
from engine.templates.variables import contact_values, render, render_subject


@dataclass(frozen=True, slots=True)
class Preview:
    to: str
    subject: str
    html: str | None
    text: str | None


async def first_message(
    rt: Runtime, who: Principal, list_id: str, subject: str, html: str | None, text: str | None
) -> Preview | None:
    """The message the list's first contact would get; None for an empty list."""
    found = await lists.read_list(rt, who, list_id, 0, 1)
    if not found.contacts:
        return None
    contact = found.contacts[0]
    values = contact_values(contact.email, contact.name, contact.metadata)
    return Preview(
        contact.email,
        render_subject(subject, values),
        None if html is None else render(html, values, escape_html=True),
        None if text is None else render(text, values),
    )
