"""Templates: reusable subject and bodies with `{{variable}}` placeholders, per workspace."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from storage.codec import from_json, parse_timestamp, timestamp, to_json
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class Template:
    id: str
    workspace_id: str
    name: str
    subject: str
    html_body: str
    text_body: str
    blocks_json: dict[str, Any] | None
    variables: list[str]
    created_at: datetime
    updated_at: datetime


def _template(row: Row) -> Template:
    return Template(
        id=row["id"],
        workspace_id=row["workspace_id"],
        name=row["name"],
        subject=row["subject"],
        html_body=row["html_body"],
        text_body=row["text_body"],
        blocks_json=from_json(row["blocks_json"]),
        variables=from_json(row["variables"]),
        created_at=parse_timestamp(row["created_at"]),
        updated_at=parse_timestamp(row["updated_at"]),
    )


def _params(template: Template) -> dict[str, Any]:
    return {
        "id": template.id,
        "ws": template.workspace_id,
        "name": template.name,
        "subject": template.subject,
        "html_body": template.html_body,
        "text_body": template.text_body,
        "blocks_json": None if template.blocks_json is None else to_json(template.blocks_json),
        "variables": to_json(template.variables),
        "created_at": timestamp(template.created_at),
        "updated_at": timestamp(template.updated_at),
    }


def insert(tx: Tx, template: Template) -> None:
    tx.execute(
        "INSERT INTO templates (id, workspace_id, name, subject, html_body, text_body,"
        " blocks_json, variables, created_at, updated_at) VALUES (:id, :ws, :name, :subject,"
        " :html_body, :text_body, :blocks_json, :variables, :created_at, :updated_at)",
        _params(template),
    )


def update(tx: Tx, template: Template) -> None:
    tx.execute(
        "UPDATE templates SET name = :name, subject = :subject, html_body = :html_body,"
        " text_body = :text_body, blocks_json = :blocks_json, variables = :variables,"
        " updated_at = :updated_at WHERE workspace_id = :ws AND id = :id",
        _params(template),
    )


def count(tx: Tx, workspace_id: str) -> int:
    return int(
        tx.value("SELECT COUNT(*) FROM templates WHERE workspace_id = :ws", {"ws": workspace_id})
    )


def get(tx: Tx, workspace_id: str, template_id: str) -> Template | None:
    row = tx.one(
        "SELECT * FROM templates WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": template_id},
    )
    return None if row is None else _template(row)


def list_all(tx: Tx, workspace_id: str) -> list[Template]:
    """The workspace's templates, most recently updated first."""
    rows = tx.all(
        "SELECT * FROM templates WHERE workspace_id = :ws ORDER BY updated_at DESC, id DESC",
        {"ws": workspace_id},
    )
    return [_template(row) for row in rows]


def delete(tx: Tx, workspace_id: str, template_id: str) -> None:
    tx.execute(
        "DELETE FROM templates WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": template_id},
    )
