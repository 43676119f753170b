"""The header fields that mark a broadcast as list mail for receivers' feedback loops and
filters. Pure: values from ids, no I/O.

- `Feedback-ID` (Gmail's feedback loop): `<broadcast>:<workspace>:<sender id>`, colon
  separated identifiers, the last (Gmail's mandatory SenderId) the same for all of a
  sender's mail, so Gmail's complaint figures come per campaign and per sender. DKIM signs
  it (engine/mail/dkim.py), as Gmail requires.
- `List-Id` (RFC 2919): `<contact list id>.<sending domain>`, stable for the list, in the
  namespace of the domain that sends it.
"""

from __future__ import annotations


def feedback_id(broadcast_id: str, workspace_id: str, sender_id: str) -> str:
    """The Feedback-ID value of a broadcast's mail."""
    return f"{broadcast_id}:{workspace_id}:{sender_id}"


def list_id(contact_list_id: str, sending_domain: str) -> str:
    """The List-Id value of mail to a contact list (a dot-atom in angle brackets)."""
    return f"<{contact_list_id}.{sending_domain.lower()}>"


def for_broadcast(
    broadcast_id: str, workspace_id: str, sender_id: str, contact_list_id: str, sending_domain: str
) -> dict[str, str]:
    """The list header fields of one broadcast's mail."""
    return {
        "Feedback-ID": feedback_id(broadcast_id, workspace_id, sender_id),
        "List-Id": list_id(contact_list_id, sending_domain),
    }
