"""What engine functions need from the running service, passed explicitly.

One `Runtime` is built at start-up by the composition root (`postroom.service`) and handed
to every front door; engine functions take it as their first argument instead of reaching
for globals, so tests can build one against any database and clock.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import dns.asyncresolver

from engine.platform.clock import Clock
from engine.platform.faults import FaultLog
from engine.platform.key_cache import KeyCache
from engine.platform.message_memory import MessageMemory
from engine.platform.password_hashing import PasswordHashing
from engine.platform.settings import Caps, ComplaintLimits
from engine.platform.tenure import Tenure
from engine.platform.tls_counts import TlsDeliveries
from engine.platform.wakeups import WakeupHub
from storage.database import Database
from storage.idempotency import Unsettled


@dataclass(frozen=True, slots=True)
class Runtime:
    db: Database
    clock: Clock
    resolver: dns.asyncresolver.Resolver
    secret_key: str
    smtp_host: str
    public_url: str
    key_cache: KeyCache
    # Tells this node's actors (and, through the database, every node's) of new work.
    wakeups: WakeupHub
    delivery_port: int
    allow_private_targets: bool
    system_from: str
    # This process's node id (engine/platform/nodes.py): what its leases are held under.
    node: str
    # POSTROOM_DOMAIN_TRANSFERS: off leaves the transfer endpoints out of the API (404).
    domain_transfers: bool = True
    # Items that made an actor raise, and actor restarts (engine/platform/faults.py), for /metrics.
    faults: FaultLog = field(default_factory=FaultLog)
    # Argon2 work, on threads of its own so logins never hold up storage's threads.
    passwords: PasswordHashing = field(default_factory=PasswordHashing)
    # POSTROOM_SMTP_PORT: the relay's port, with smtp_host what SMTP credentials are told to dial.
    smtp_port: int = 587
    # POSTROOM_SANDBOX: new workspaces start in sandbox mode (engine/sandbox).
    sandbox: bool = False
    # POSTROOM_DELIVERY_MAX_*: operator-wide caps on every destination policy.
    delivery_caps: Caps = field(default_factory=Caps)
    # Idempotency claims whose request ended in a database outage, settled by the next beat.
    unsettled_claims: Unsettled = field(default_factory=Unsettled)
    # The bytes of message data this process holds in memory at once, all work together.
    message_memory: MessageMemory = field(default_factory=MessageMemory)
    # How long this node may trust its leases (engine/platform/tenure.py): asked before each SMTP
    # transaction, moved by the node's heartbeat.
    tenure: Tenure = field(default_factory=Tenure)
    # POSTROOM_SENDING_ADDRESSES (empty: the addresses of smtp_host) and POSTROOM_SPF_INCLUDE:
    # what domains' SPF records are evaluated for and told to add (engine/domains/spf.py).
    sending_addresses: tuple[str, ...] = ()
    spf_include: str | None = None
    # POSTROOM_COMPLAINT_MIN_DELIVERIES: the complaint-rate guard's limits.
    complaint_limits: ComplaintLimits = field(default_factory=ComplaintLimits)
    # POSTROOM_EXTRA_CA_FILE: a CA trusted besides the system's by verified outbound TLS.
    extra_ca_file: Path | None = None
    # POSTROOM_MTA_STS_PORT (tests only): the port MTA-STS policies are fetched from.
    mta_sts_port: int = 443
    # POSTROOM_DNSSEC: the resolver's AD bit is trusted and DANE enforced (delivery/dane.py).
    dnssec: bool = False
    # POSTROOM_SPOOL_DIR: where a stop during an outage saves the delivery outcomes it kept
    # (engine/delivery/kept_journal.py); None: nowhere (they are lost with the process).
    spool_dir: Path | None = None
    # Delivered recipients by TLS policy and outcome (engine/delivery/mta_sts.py), /metrics.
    tls_deliveries: TlsDeliveries = field(default_factory=TlsDeliveries)

    @property
    def usage_shard(self) -> int:
        """The monthly-volume shard this node counts in (storage/emails.py `count_sent`)."""
        return zlib.crc32(self.node.encode())


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is acting: a user, in one workspace, through a key or a session."""

    user_id: str
    user_email: str
    workspace_id: str
    plan: str
    api_key_id: str | None = None
    session_id: str | None = None
    # A sandbox test key (engine/sandbox/keys.py): acts only inside the sandbox.
    test_key: bool = False
    # The caller's role in the workspace (engine/accounts/roles.py); `api_key` for a key.
    role: str = "owner"

    @property
    def credential(self) -> str:
        """The credential acting, `key:<id>` or `session:<id>`: what a grant made to this
        caller (a confirmation token, an MCP session id) is bound to, so that it dies with
        the key or the login session."""
        if self.api_key_id is not None:
            return f"key:{self.api_key_id}"
        return f"session:{self.session_id}"
