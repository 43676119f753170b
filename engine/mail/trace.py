"""The `Received:` field a server of ours prepends to a message it accepts (RFC 5321 4.4).

    Received: from <helo> (<confirmed rDNS> [<address>])
            by <our host> (Postroom) with <ESMTPSA> id <id>
            for <recipient>; <date>

Pure: the caller brings the facts (the relay looks the client's name up). The client's
HELO name is its own claim, kept only when it is a plain domain or address literal (a
comment or `;` in it would change the field's meaning); the recipient is named only when
there is one, so a copy never discloses the other (possibly Bcc) recipients.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime

_HELO = re.compile(r"[A-Za-z0-9._-]{1,253}|\[[A-Za-z0-9.:]{1,60}\]")


@dataclass(frozen=True, slots=True)
class Arrival:
    """What a server knows of how a message came in."""

    helo: str
    address: str  # the client's IP address
    name: str | None  # its forward-confirmed reverse DNS name, if any
    protocol: str  # RFC 3848: ESMTP, ESMTPS, ESMTPSA, ...


def trace_id() -> str:
    """A short id naming one accepted message in the servers' logs and its `Received:`."""
    return secrets.token_hex(6).upper()


def _literal(address: str) -> str:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped
        return f"[{mapped}]" if mapped is not None else f"[IPv6:{ip.compressed}]"
    return f"[{ip}]"


def received_field(
    arrival: Arrival, by_host: str, message_id: str, recipients: list[str], when: datetime
) -> bytes:
    """The folded `Received:` field, CRLF-terminated, ready to prepend."""
    helo = arrival.helo if _HELO.fullmatch(arrival.helo) else "unknown"
    tcp_info = _literal(arrival.address)
    if arrival.name is not None:
        tcp_info = f"{arrival.name} {tcp_info}"
    lines = [
        f"Received: from {helo} ({tcp_info})",
        f"\tby {by_host} (Postroom) with {arrival.protocol} id {message_id}",
    ]
    if len(recipients) == 1:
        lines.append(f"\tfor <{recipients[0]}>; {format_datetime(when)}")
    else:
        lines[-1] += f"; {format_datetime(when)}"
    return ("\r\n".join(lines) + "\r\n").encode("utf-8")
