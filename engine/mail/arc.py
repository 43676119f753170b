"""ARC (RFC 8617) for forwarded mail: the set of ARC headers the service adds, as a
forwarder, to a copy it sends on, so a receiver that trusts us can still see the
authentication results our MX found on arrival (Gmail requires ARC from forwarders).

dkimpy's `arc_sign` makes the set: it reads the `Authentication-Results` field that names
our authserv-id (the MX wrote it on arrival, engine/forwarding/authentication.py) into
ARC-Authentication-Results, signs the message (ARC-Message-Signature) and seals the chain
(ARC-Seal, `cv=none` for the first instance, or the chain's result our MX found). Rules: the
seal is made with the forwarding domain's RSA key and selector (the ones its DKIM DNS
record publishes: ARC is rsa-sha256 only), over the message exactly as it goes out, and
the set is prepended; a message over `MAX_SIZE` is sent without one; a message whose results lack a chain result it needs (dkimpy: "chain
terminated") is sent without a set rather than with a broken one.
"""

from __future__ import annotations

from datetime import datetime

import dkim as dkimpy
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from engine.mail.dkim import load_private_key

# Larger messages are neither verified on arrival nor sealed: dkimpy canonicalises a body
# line by line (~20 ms and several copies per MB), which for the 40 MiB the MX takes would
# spend seconds and break the budget of message memory (engine/platform/message_memory.py).
MAX_SIZE = 2 * 1024 * 1024


def _pkcs1(private_key_pem: str) -> bytes:
    """The RSA key as dkimpy reads it (PKCS#1 PEM); our keys are stored as PKCS#8."""
    key = load_private_key(private_key_pem)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("ARC seals with an RSA key")
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def sealed(
    message: bytes,
    *,
    domain: str,
    selector: str,
    private_key_pem: str,
    authserv_id: str,
    timestamp: datetime,
) -> bytes:
    """`message` (CRLF line ends, at most `MAX_SIZE`: the caller checks) under its next
    ARC set, or unchanged when dkimpy finds no results of ours to carry. Raises ValueError
    for an unusable key or message."""
    try:
        fields = dkimpy.arc_sign(
            message,
            selector.encode(),
            domain.encode(),
            _pkcs1(private_key_pem),
            authserv_id.encode(),
            timestamp=int(timestamp.timestamp()),
        )
    except dkimpy.DKIMException as exc:
        raise ValueError(f"cannot ARC-seal the message: {exc}") from exc
    return b"".join(fields) + message
