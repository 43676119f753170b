"""Which suppressions block which mail: the scope of an unsubscribe (issue 30).

Mail that offers an unsubscribe (every broadcast, and an email whose sender asked for one
with `"unsubscribe": true`) is subscribed mail, "marketing" in the bulk-sender rules. An
unsubscribe, from any such email's link, header or mailto: address, suppresses the address
for all of the workspace's subscribed mail, whatever list or email it came from: receivers
hold the sender to the person's word, not to one list. Mail that offers no unsubscribe
(receipts, password resets, the relay's and forwards' mail) is not blocked by it. Every
other reason (a hard bounce, a complaint, a manual entry, an erasure) blocks all mail.
"""

from __future__ import annotations

from collections.abc import Mapping

from storage.suppressions import NARROW

# Reasons that block only subscribed mail.
SUBSCRIBED_MAIL_ONLY = frozenset({NARROW})


def blocks(reason: str, *, subscribed: bool) -> bool:
    """Whether an address suppressed for `reason` is not sent this mail."""
    return subscribed or reason not in SUBSCRIBED_MAIL_ONLY


def blocking(suppressed: Mapping[str, str], *, subscribed: bool) -> dict[str, str]:
    """Those of the suppressed addresses (address: reason) that block this mail."""
    return {
        address: reason
        for address, reason in suppressed.items()
        if blocks(reason, subscribed=subscribed)
    }
