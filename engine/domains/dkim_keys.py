"""DKIM key pairs for sending domains and the TXT record that publishes one: RSA-2048, which
every verifier knows, and Ed25519 (RFC 8463), signed with beside it where a domain asks."""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass

import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

KEY_BITS = 2048


@dataclass(frozen=True, slots=True)
class DkimKey:
    selector: str
    private_pem: str
    public_b64: str  # the `p=` value: base64 of the DER SubjectPublicKeyInfo (RSA) or the
    # raw 32-byte public key (Ed25519, RFC 8463 4.2)


def _generate() -> DkimKey:
    private = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_der = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # A fresh selector per key lets a domain rotate keys without a gap in signing.
    selector = "pr" + secrets.token_hex(4)
    return DkimKey(selector, private_pem, base64.b64encode(public_der).decode())


async def generate() -> DkimKey:
    """A new 2048-bit RSA key pair, made off the event loop (it takes ~50 ms of CPU)."""
    return await trio.to_thread.run_sync(_generate)


def generate_ed25519() -> DkimKey:
    """A new Ed25519 key pair (microseconds of CPU), with a selector of its own."""
    private = ed25519.Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    selector = "pe" + secrets.token_hex(4)
    return DkimKey(selector, private_pem, base64.b64encode(public_raw).decode())


def txt_value(public_b64: str, key_type: str = "rsa") -> str:
    """The DKIM TXT record that publishes a public key (`key_type` rsa or ed25519)."""
    return f"v=DKIM1; k={key_type}; p={public_b64}"


def published_key(record: str) -> str | None:
    """The `p=` value of a DKIM TXT record (whitespace removed), or None if it is not one."""
    tags: dict[str, str] = {}
    for part in record.split(";"):
        name, sep, value = part.partition("=")
        if sep:
            tags[name.strip().lower()] = "".join(value.split())
    if tags.get("v", "DKIM1") != "DKIM1" or "p" not in tags:
        return None
    return tags["p"]
