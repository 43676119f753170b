"""What a sandbox test key may do through `/v1`: one table, checked once per request.

A test key (`svc_k_test_…`, engine/sandbox/keys.py) lives in an application's test
configuration, so it acts only inside the sandbox: it sends (captured, never delivered) and
shapes what that mail is made of. What would outlive the sandbox or reach outside it is
refused with 403 `test_key_forbidden`: credentials and access (API keys, test keys, SMTP
credentials, sandbox mode, the MCP policy), standing ways out (webhooks and their signing
secrets, inbound forwards, BIMI's public logo), delivery policies and ramps, retention and
erasure, domain transfers, deleting a domain (its key, maybe published in DNS, is gone for
good) and platform administration.

The table names what a test key MAY change, not what it may not: a route added later is
refused to test keys until someone decides it belongs in the sandbox. Reads are open but for
those that show a secret or span the platform. The other doors need no table: the console
takes no API keys, the relay takes SMTP credentials, and every MCP tool stays within this one.
"""

from __future__ import annotations

from engine.platform.errors import Forbidden

# Endpoints (blueprint.function) a test key may call with an unsafe method.
SANDBOX_CHANGES = frozenset(
    {
        "emails.send",
        "emails.send_batch",
        "emails.validate",
        "emails.cancel",
        "emails.send_now",
        "emails.retry",
        "emails.replace_saved_searches",
        "queue.act",
        "templates.create",
        "templates.update",
        "templates.delete",
        "templates.duplicate",
        "contacts.create",
        "contacts.update",
        "contacts.delete",
        "contacts.add_contact",
        "contacts.remove_contact",
        "contacts.upload",
        "contacts.send",
        "domains.create",
        "domains.update",
        "domains.verify",  # in the sandbox: the sandbox's mark, valid only there
        "sandbox.mark_verified",
        "senders.create",
        "senders.delete",
        "suppressions.add",
        "suppressions.remove",
        "verify.verify",
        "webhooks.replay",
        "webhooks.replay_matching",
    }
)
# Reads a test key may not make: endpoints that show a secret (a webhook's signing secret
# would let its holder forge the workspace's webhooks long after the sandbox) ...
SECRET_READS = frozenset({"webhooks.list_webhooks"})
# ... and blueprints about the whole platform rather than the workspace.
PLATFORM_BLUEPRINTS = frozenset({"admin", "egress", "nodes"})


def may(endpoint: str, changes: bool) -> bool:
    """Whether a test key may call `endpoint`; `changes`: with an unsafe method."""
    if changes:
        return endpoint in SANDBOX_CHANGES
    blueprint, _, _ = endpoint.partition(".")
    return endpoint not in SECRET_READS and blueprint not in PLATFORM_BLUEPRINTS


def refuse_outside_sandbox(endpoint: str, changes: bool) -> None:
    """Forbidden `test_key_forbidden` when a test key may not call `endpoint`."""
    if not may(endpoint, changes):
        raise Forbidden(
            "a test key acts only inside the sandbox: use a full API key or the console for this",
            code="test_key_forbidden",
        )
