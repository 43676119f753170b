"""The MCP door's records: each workspace's policy, and the confirmation tokens of previews.

A token is stored only as its SHA-256 (like API keys), beside the exact action it confirms.
`use_confirmation` marks a token used with a conditional update, so of two confirms racing
on any nodes exactly one wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from storage.codec import from_json, parse_optional_timestamp, parse_timestamp, timestamp, to_json
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class Policy:
    workspace_id: str
    policy: str  # off, read or send
    max_recipients: int
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Confirmation:
    token_hash: str
    workspace_id: str
    user_id: str
    credential: str | None  # who may confirm: the key or session that previewed
    action: str
    payload: dict[str, Any]
    recipients: int
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None


def get_policy(tx: Tx, workspace_id: str) -> Policy | None:
    row = tx.one("SELECT * FROM mcp_policies WHERE workspace_id = :ws", {"ws": workspace_id})
    if row is None:
        return None
    return Policy(
        workspace_id=row["workspace_id"],
        policy=row["policy"],
        max_recipients=int(row["max_recipients"]),
        updated_at=parse_timestamp(row["updated_at"]),
    )


def put_policy(tx: Tx, policy: Policy) -> None:
    tx.execute(
        "INSERT INTO mcp_policies (workspace_id, policy, max_recipients, updated_at)"
        " VALUES (:ws, :policy, :max, :at) ON CONFLICT (workspace_id)"
        " DO UPDATE SET policy = :policy, max_recipients = :max, updated_at = :at",
        {
            "ws": policy.workspace_id,
            "policy": policy.policy,
            "max": policy.max_recipients,
            "at": timestamp(policy.updated_at),
        },
    )


def _confirmation(row: Row) -> Confirmation:
    return Confirmation(
        token_hash=row["token_hash"],
        workspace_id=row["workspace_id"],
        user_id=row["user_id"],
        credential=row["credential"],
        action=row["action"],
        payload=from_json(row["payload"]),
        recipients=int(row["recipients"]),
        created_at=parse_timestamp(row["created_at"]),
        expires_at=parse_timestamp(row["expires_at"]),
        used_at=parse_optional_timestamp(row["used_at"]),
    )


def insert_confirmation(tx: Tx, confirmation: Confirmation) -> None:
    tx.execute(
        "INSERT INTO agent_confirmations (token_hash, workspace_id, user_id, credential, action,"
        " payload, recipients, created_at, expires_at, used_at) VALUES (:hash, :ws, :user,"
        " :credential, :action, :payload, :recipients, :created_at, :expires_at, NULL)",
        {
            "hash": confirmation.token_hash,
            "ws": confirmation.workspace_id,
            "user": confirmation.user_id,
            "credential": confirmation.credential,
            "action": confirmation.action,
            "payload": to_json(confirmation.payload),
            "recipients": confirmation.recipients,
            "created_at": timestamp(confirmation.created_at),
            "expires_at": timestamp(confirmation.expires_at),
        },
    )


def get_confirmation(tx: Tx, token_hash: str) -> Confirmation | None:
    row = tx.one("SELECT * FROM agent_confirmations WHERE token_hash = :hash", {"hash": token_hash})
    return None if row is None else _confirmation(row)


def use_confirmation(tx: Tx, token_hash: str, now: datetime) -> bool:
    """Mark an unused token used; False when it already was."""
    return (
        tx.execute(
            "UPDATE agent_confirmations SET used_at = :now"
            " WHERE token_hash = :hash AND used_at IS NULL",
            {"hash": token_hash, "now": timestamp(now)},
        )
        == 1
    )


def prune_confirmations(tx: Tx, workspace_id: str, expired_before: datetime) -> None:
    """Forget the workspace's tokens (used or not) that expired before `expired_before`."""
    tx.execute(
        "DELETE FROM agent_confirmations WHERE workspace_id = :ws AND expires_at < :before",
        {"ws": workspace_id, "before": timestamp(expired_before)},
    )
