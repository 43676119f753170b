"""Opening the engine over a database: migrations, the master key, and the `Runtime`.

Apart from the service (`postroom.service`), so that CLI commands which only need the engine
(`accounts create`, `set-plan`) start without loading the HTTP and SMTP front doors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import secrets

from engine.platform import nodes
from engine.platform.clock import Clock
from engine.platform.dns import make_resolver
from engine.platform.key_cache import KeyCache
from engine.platform.runtime import Runtime
from engine.platform.settings import ComplaintLimits
from engine.platform.wakeups import WakeupHub
from postroom import master_key
from postroom.config import Settings
from storage import accounts, migrations
from storage.database import Database


async def open_runtime(db: Database, settings: Settings) -> Runtime:
    """Migrate the database, give it the master key (sealing what is in clear), and assemble
    the engine runtime over it."""
    await db.transaction(migrations.apply_pending)
    await master_key.install(db, settings)
    secret_key = settings.secret_key
    if secret_key is None:
        secret_key = await db.write(accounts.secret, "secret_key", secrets.token_urlsafe(48))
    key_cache = KeyCache()
    rt = Runtime(
        db=db,
        clock=Clock(),
        resolver=make_resolver(settings.dns_servers, dnssec=settings.dnssec),
        dnssec=settings.dnssec,
        spool_dir=settings.spool_dir.absolute(),
        secret_key=secret_key,
        smtp_host=settings.smtp_host,
        smtp_port=settings.smtp_port,
        public_url=settings.public_url,
        key_cache=key_cache,
        wakeups=WakeupHub(key_cache),
        delivery_port=settings.delivery_port,
        mta_sts_port=settings.mta_sts_port,
        extra_ca_file=settings.extra_ca_file,
        allow_private_targets=settings.allow_private_targets,
        system_from=settings.system_from,
        node=nodes.new_node_id(),
        domain_transfers=settings.domain_transfers,
        sandbox=settings.sandbox,
        delivery_caps=settings.delivery_caps,
        sending_addresses=settings.sending_addresses,
        spf_include=settings.spf_include,
        complaint_limits=ComplaintLimits(min_deliveries=settings.complaint_min_deliveries),
    )
    db.on_commit(rt.wakeups.deliver, rt.node)
    return rt


def settle_heap() -> None:
    """Once a service process has started: what starting it made (modules, the app and its
    routes, some 135,000 objects) lives as long as the process, so take it out of the
    collector's sight. Each full collection walked all of it, pausing every request for
    50-80 ms: the p99 at half load went from 40-80 ms to 7 ms. Garbage is collected first,
    so nothing dead is kept for ever. Only for a process that is a service; not in tests,
    which start many services in one process."""
    gc.collect()
    gc.freeze()


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks from 256 KiB up get pages of their own, given back to the system when freed.
LARGE_BLOCK = 256 * 1024


def return_large_blocks() -> None:
    """Make every large block (a message, its copies) memory of its own that goes back to
    the system when freed. glibc raises its threshold for that after each such block is
    freed (up to 32 MiB), so after a few large messages their successors come from the heap,
    which is never given back: 8 messages of 34 MiB left a worker 500 MiB larger for good.
    A fixed threshold turns that off (issue 28). Nothing on another C library."""
    path = ctypes.util.find_library("c")
    if path is None:
        return
    libc = ctypes.CDLL(path)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return
    mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK)
    mallopt(_M_TRIM_THRESHOLD, 2 * LARGE_BLOCK)


def trim_heap() -> None:
    """Give the pages of freed memory in every malloc arena back to the system (each thread
    that worked on a large message has an arena of its own, trimmed only at its top).
    Called when the message memory budget falls idle after a large message; a few ms."""
    path = ctypes.util.find_library("c")
    trim = None if path is None else getattr(ctypes.CDLL(path), "malloc_trim", None)
    if trim is not None:
        trim(0)
