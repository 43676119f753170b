"""Which addresses the service may connect to for a tenant: the private-network rule (SSRF).

Tenants choose where the service connects: webhook and forward URLs, the MX hosts of their
recipients' domains, the addresses they ask `/v1/verify` to probe. Unless
POSTROOM_ALLOW_PRIVATE_TARGETS is on, none of these may reach the operator's own network:
loopback, private, link-local, shared, reserved or multicast space.

An IPv6 address can carry an IPv4 address inside it, and a host that routes such addresses
reaches the IPv4 one: IPv4-mapped (`::ffff:0:0/96`), IPv4-compatible (`::/96`), NAT64
(`64:ff9b::/96`, RFC 6052), 6to4 (`2002::/16`) and Teredo (`2001::/32`, both the server and
the obfuscated client). Each embedded address must pass the rule too. The local-use NAT64
prefix `64:ff9b:1::/48` (RFC 8215) translates into the operator's own network: refused whole.
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")
_COMPATIBLE = ipaddress.ip_network("::/96")


def _embedded_ipv4(ip: IPv6Address) -> list[IPv4Address]:
    """Every IPv4 address an IPv6 address carries, by the translation schemes above."""
    low32 = IPv4Address(int(ip) & 0xFFFF_FFFF)
    found: list[IPv4Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip in _COMPATIBLE or ip in _NAT64:
        found.append(low32)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def _is_public_ipv4(ip: IPv4Address) -> bool:
    return ip.is_global and not ip.is_multicast


def is_public(address: str) -> bool:
    """Whether an IP address (text) may be reached for a tenant with the rule on."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, IPv4Address):
        return _is_public_ipv4(ip)
    if ip.scope_id is not None or ip in _LOCAL_NAT64:
        return False
    if not all(_is_public_ipv4(v4) for v4 in _embedded_ipv4(ip)):
        return False
    return ip.is_global and not ip.is_multicast


def public_only(addresses: list[str] | tuple[str, ...]) -> list[str]:
    """The addresses of a list that pass the rule, in order."""
    return [address for address in addresses if is_public(address)]
