"""The MCP door's resources: read-only JSON views of domains, templates and saved searches.

Each is one engine read, allowed under the `read` policy. The lists are fixed URIs and single
items are URI templates, so listing resources reveals nothing of a workspace: its data is
only in what a read returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from engine.domains import registry, spf
from engine.platform.errors import NotFound
from engine.platform.runtime import Principal, Runtime
from engine.sending import email_log
from engine.templates import library as templates
from mcp_door import shapes
from mcp_door.shapes import Json

SCHEME = "postroom://"
MIME_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class Resource:
    uri: str
    name: str
    description: str
    read: Callable[[Runtime, Principal], Awaitable[Json]]


@dataclass(frozen=True, slots=True)
class ItemTemplate:
    """`<collection>/{id}`: one item of a collection."""

    collection: str
    name: str
    description: str
    read: Callable[[Runtime, Principal, str], Awaitable[Json]]

    @property
    def uri_template(self) -> str:
        return f"{self.collection}/{{id}}"


async def _domains(rt: Runtime, who: Principal) -> Json:
    return {
        "domains": [
            shapes.domain(d, rt.smtp_host, spf.recommended(rt), rt.public_url)
            for d in await registry.list_all(rt, who)
        ]
    }


async def _domain(rt: Runtime, who: Principal, domain_id: str) -> Json:
    found = await registry.get(rt, who, domain_id)
    return shapes.domain(found, rt.smtp_host, spf.recommended(rt), rt.public_url)


async def _templates(rt: Runtime, who: Principal) -> Json:
    return {"templates": [shapes.template(t) for t in await templates.list_all(rt, who)]}


async def _template(rt: Runtime, who: Principal, template_id: str) -> Json:
    return shapes.template(await templates.get(rt, who, template_id))


async def _saved_searches(rt: Runtime, who: Principal) -> Json:
    found = await email_log.saved_searches(rt, who)
    return {"searches": [shapes.saved_search(entry) for entry in found]}


RESOURCES = (
    Resource(
        f"{SCHEME}domains",
        "domains",
        "Sending domains, their status and the DNS records to publish, each with its status.",
        _domains,
    ),
    Resource(
        f"{SCHEME}templates",
        "templates",
        "Email templates (Starter plan and above) with their {{variables}}.",
        _templates,
    ),
    Resource(
        f"{SCHEME}saved-searches",
        "saved searches",
        "The user's saved email-log searches; run one with search_emails and its query.",
        _saved_searches,
    ),
)

ITEM_TEMPLATES = (
    ItemTemplate(f"{SCHEME}domains", "domain", "One sending domain by id.", _domain),
    ItemTemplate(f"{SCHEME}templates", "template", "One email template by id.", _template),
)


async def read(rt: Runtime, who: Principal, uri: str) -> Json:
    """What the resource at `uri` holds for `who`; NotFound for any other URI."""
    for resource in RESOURCES:
        if uri == resource.uri:
            return await resource.read(rt, who)
    for item in ITEM_TEMPLATES:
        prefix = f"{item.collection}/"
        if uri.startswith(prefix) and "/" not in uri[len(prefix) :] and len(uri) > len(prefix):
            return await item.read(rt, who, uri[len(prefix) :])
    raise NotFound(f"no resource at {uri}")
