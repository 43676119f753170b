"""The fixed vocabulary of destinations that figures shared by every tenant are labelled with.

`/metrics` is read by the operator, and its label sets must not grow with what tenants send:
one tenant's 2,000 recipient domains would make 2,000 series per metric and name them all to
whoever scrapes. So a recipient domain, or a destination key (`mx:<suffix>`, as delivery
counts connections), is labelled with the mailbox provider behind it, out of the providers
the built-in delivery policies know (engine/delivery/policies.py `BUILTIN`), or `other`.
Pure: known consumer domains and MX suffixes only, no DNS at scrape time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Provider:
    label: str
    mx_suffix: str  # as the built-in policy matches it, without `*.`
    domains: frozenset[str]  # its own consumer domains, known without asking DNS


PROVIDERS: tuple[Provider, ...] = (
    Provider("google", "google.com", frozenset({"gmail.com", "googlemail.com", "google.com"})),
    Provider(
        "microsoft",
        "outlook.com",
        frozenset({"outlook.com", "hotmail.com", "live.com", "msn.com", "hotmail.co.uk"}),
    ),
    Provider(
        "yahoo",
        "yahoodns.net",
        frozenset({"yahoo.com", "ymail.com", "aol.com", "yahoo.co.uk", "yahoo.fr", "aim.com"}),
    ),
    Provider("apple", "icloud.com", frozenset({"icloud.com", "me.com", "mac.com"})),
    Provider("gmx", "gmx.net", frozenset({"gmx.net", "gmx.de", "gmx.com", "web.de"})),
)
OTHER = "other"
LABELS: tuple[str, ...] = (*(p.label for p in PROVIDERS), OTHER)

_BY_DOMAIN = {domain: p.label for p in PROVIDERS for domain in p.domains}
_BY_SUFFIX = {p.mx_suffix: p.label for p in PROVIDERS}


def label(destination: str) -> str:
    """The provider label of a recipient domain or a destination key; `other` for anything
    outside the vocabulary (a tenant's own MX group included: its name is theirs)."""
    name = destination.strip().lower().rstrip(".")
    if name.startswith("mx:"):
        return _BY_SUFFIX.get(name[3:], OTHER)
    return _BY_DOMAIN.get(name, OTHER)
