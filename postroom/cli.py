"""The `postroom` command: serve, migrate, list the nodes, check health, manage accounts,
and send a day's TLS reports.

Errors are one line naming what to fix (a setting, an existing account), with exit status 2
for bad settings or arguments and 1 for anything else; never a traceback for an operator's
mistake. Once `serve` runs, that line is its last log record (JSON by default), as a log
collector expects; before the settings are read, and for the other commands, it is plain text.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime
from functools import partial
from pathlib import Path
from typing import Any, get_args

import psycopg
import trio

from engine import plans
from engine.accounts import users as accounts
from engine.mail import link_security
from engine.platform.errors import EngineError
from engine.platform.nodes import Role
from engine.platform.supervisor import DatabaseGone
from engine.reports import tls_sender
from postroom import config, health, logs, workers
from postroom.startup import open_runtime, return_large_blocks, settle_heap, trim_heap
from storage import migrations, nodes
from storage.database import open_database

log = logging.getLogger("postroom")


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argument type: a whole number of at least `minimum`."""

    def whole(text: str) -> int:
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {minimum}")
        return int(text)

    return whole


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="postroom", description="Self-hosted email delivery.")
    parser.add_argument("--config", type=Path, help="TOML file of settings (env vars win)")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the API, relays and delivery engine")
    serve.add_argument(
        "--workers",
        type=_at_least(1),
        default=None,
        metavar="N",
        help="processes sharing the ports, each a node of its own (default: one per core)",
    )
    serve.add_argument(
        "--delivery-workers",
        type=_at_least(0),
        default=None,
        metavar="M",
        help="of the N workers, how many deliver (and run the background actors) while the"
        " others take mail; 0: every worker does both (default: half of N, rounded down)",
    )
    # Set by `--workers N` on the processes it starts; not for people.
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--role", choices=get_args(Role), default="all", help=argparse.SUPPRESS)
    serve.add_argument("--instance", help=argparse.SUPPRESS)  # the supervisor's, for /metrics
    commands.add_parser("migrate", help="apply database migrations")
    commands.add_parser("nodes", help="list the nodes sharing the database and what each holds")
    commands.add_parser(
        "health", help="ask the running service's /healthz (exit 0 when it answers 200)"
    )
    mcp = commands.add_parser("mcp", help="the MCP door for a local client, on stdin/stdout")
    mcp.add_argument(
        "--stdio",
        action="store_true",
        required=True,
        help="bridge stdin/stdout to a running service's /mcp with POSTROOM_API_KEY",
    )
    mcp.add_argument("--url", help="the service's MCP door (default: POSTROOM_PUBLIC_URL/mcp)")
    account = commands.add_parser("accounts", help="manage accounts").add_subparsers(
        dest="action", required=True
    )
    create = account.add_parser("create", help="create a user, workspace and first API key")
    create.add_argument("--email", required=True)
    create.add_argument("--password", required=True)
    create.add_argument("--plan", choices=plans.PLAN_NAMES, default="free")
    create.add_argument("--admin", action="store_true", help="platform administrator")
    set_plan = account.add_parser("set-plan", help="change the plan of a user's workspaces")
    set_plan.add_argument("--email", required=True)
    set_plan.add_argument("--plan", choices=plans.PLAN_NAMES, required=True)
    reports = commands.add_parser("reports", help="send reports").add_subparsers(
        dest="report", required=True
    )
    tls = reports.add_parser(
        "tls", help="send a day's SMTP TLS reports (RFC 8460) not sent yet, at once"
    )
    tls.add_argument("--day", required=True, type=_day, metavar="YYYY-MM-DD", help="a UTC day")
    return parser


def _day(text: str) -> date:
    """An argument type: a day written YYYY-MM-DD."""
    try:
        return tls_sender.parse_day(text)
    except EngineError as exc:
        raise argparse.ArgumentTypeError(exc.detail) from None


def _tls_reports(settings: config.Settings, day: date) -> int:
    """Send the day's TLS reports not sent yet: progress on stderr, the figures on stdout."""
    try:
        tls_sender.check_day(day, datetime.now(UTC).date())
    except EngineError as exc:
        print(f"postroom: {exc.detail}", file=sys.stderr)
        return 2

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    done = trio.run(_with_runtime, settings, lambda rt: tls_sender.send_day(rt, day, progress))
    print(
        json.dumps(
            {
                "day": day.isoformat(),
                "domains": done.domains,
                "sent": done.sent,
                "without_record": done.without_record,
                "already_sent": done.already,
                "left_for_later": done.unsure,
            }
        )
    )
    return 0


async def _serve(
    settings: config.Settings, reuse_port: bool, role: Role, instance: str | None
) -> None:
    # Here, not at the top: the other commands start without the HTTP and SMTP front doors.
    from postroom.service import serve

    return_large_blocks()

    async with trio.open_nursery() as nursery:
        service = await nursery.start(
            partial(serve, settings, reuse_port=reuse_port, role=role, instance=instance)
        )
        service.runtime.message_memory.on_idle = trim_heap
        settle_heap()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                log.info("%s, stopping", name, extra={"signal": name})
                service.stop()
                break


async def _with_runtime(settings: config.Settings, action: Callable[..., Awaitable[Any]]) -> Any:
    async with open_database(settings.database_url) as db:
        rt = await open_runtime(db, settings)
        return await action(rt)


async def _nodes(settings: config.Settings) -> str:
    async with open_database(settings.database_url) as db:
        await db.transaction(migrations.apply_pending)
        listed = await db.read(nodes.listed)
    now = datetime.now(UTC)
    lines = [f"{'NODE':<40} {'ROLE':<8} {'STATE':<8} {'STARTED':<20} {'LAST BEAT':>10}  HOLDS"]
    for node, held in listed:
        beat = f"{(now - node.heartbeat_at).total_seconds():.0f} s ago"
        holds = ", ".join(f"{table} {count}" for table, count in sorted(held.counts.items()))
        started = node.started_at.strftime("%Y-%m-%d %H:%M:%S")
        lines.append(
            f"{node.id:<40} {node.role:<8} {node.state:<8} {started:<20} {beat:>10}  {holds or '-'}"
        )
    return "\n".join(lines) if listed else "no node has run against this database yet"


async def _migrate(settings: config.Settings) -> list[int]:
    async with open_database(settings.database_url) as db:
        return await db.transaction(migrations.apply_pending)


def _mcp_stdio(args: argparse.Namespace, settings: config.Settings) -> int:
    # The key, not the database: the bridge can do only what the workspace's policy allows.
    api_key = os.environ.get("POSTROOM_API_KEY", "").strip()
    if not api_key:
        print("postroom: set POSTROOM_API_KEY to the API key the agent acts with", file=sys.stderr)
        return 2
    from mcp_door import stdio  # here: the other commands start without the SDK

    trio.run(stdio.serve, args.url or settings.public_url.rstrip("/") + "/mcp", api_key)
    return 0


def _run(args: argparse.Namespace, settings: config.Settings) -> int:
    if args.command == "serve":
        # Once, by the process the operator started (not by each of its workers).
        warning = link_security.http_warning(settings.public_url, sandbox=settings.sandbox)
        if warning is not None and args.instance is None:
            log.warning("%s", warning)
        count = workers.default_workers() if args.workers is None else args.workers
        try:
            roles = workers.roles(count, args.delivery_workers)
        except ValueError as exc:
            print(f"postroom: {exc}", file=sys.stderr)
            return 2
        if count > 1:
            return workers.run(settings, roles, args.config)
        trio.run(_serve, settings, args.reuse_port, args.role, args.instance)
    elif args.command == "nodes":
        print(trio.run(_nodes, settings))
    elif args.command == "health":
        return health.probe(settings)
    elif args.command == "mcp":
        return _mcp_stdio(args, settings)
    elif args.command == "reports":
        return _tls_reports(settings, args.day)
    elif args.command == "migrate":
        applied = trio.run(_migrate, settings)
        print(f"applied migrations: {applied}" if applied else "schema is up to date")
    elif args.action == "create":
        created = trio.run(
            _with_runtime,
            settings,
            lambda rt: accounts.create_account(
                rt, args.email, args.password, args.plan, args.admin
            ),
        )
        print(
            json.dumps(
                {
                    "user_id": created.user_id,
                    "workspace_id": created.workspace_id,
                    "email": created.email,
                    "plan": created.plan,
                    "api_key": created.api_key,
                }
            )
        )
    else:
        changed = trio.run(
            _with_runtime, settings, lambda rt: accounts.set_plan(rt, args.email, args.plan)
        )
        print(json.dumps({"email": args.email, "plan": args.plan, "workspaces": changed}))
    return 0


def _leaves(exc: BaseException) -> list[BaseException]:
    # Trio nurseries wrap a failure in exception groups, however deep it was raised.
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _operator_error(exc: BaseException) -> str | None:
    """One line for a failure the operator can fix; None for anything else (a bug)."""
    leaves = _leaves(exc)
    if len(leaves) != 1:
        return None
    leaf = leaves[0]
    if isinstance(leaf, EngineError):
        return leaf.detail
    if isinstance(leaf, DatabaseGone):
        return str(leaf)
    if isinstance(leaf, sqlite3.Error | psycopg.Error):
        return f"cannot use the database: {leaf}; check POSTROOM_DATABASE_URL"
    if isinstance(leaf, OSError):
        return f"{leaf}; check POSTROOM_DATABASE_URL and the listen addresses"
    return None


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        settings = config.load(file=args.config)
    except config.SettingsError as exc:
        print(f"postroom: {exc}", file=sys.stderr)
        sys.exit(2)
    logs.configure(settings.log_format)
    try:
        code = _run(args, settings)
    except Exception as exc:
        message = _operator_error(exc)
        if message is None:
            raise
        line = " ".join(message.split())
        if args.command == "serve":
            # A service's stderr is its log: the line it stops with is a record like the
            # others (JSON unless POSTROOM_LOG_FORMAT=text), so a collector parses it too.
            log.error("%s", line, extra={"exit_status": 1})
        else:
            print(f"postroom: {line}", file=sys.stderr)
        code = 1
    sys.exit(code)
