"""How mail is doing, counted in the database: per sending domain, tag or broadcast, the
recipients each event reached, with opens and clicks split by who made them (human or
machine, as recorded by engine/sending/tracking.py).

One GROUP BY per figure set. Emails are found through their workspace index by creation time
(or through the broadcast index), then each one's events through the events' email index, so
the event table's hot insert path gains no index. A recipient counts once per event type and
audience however often it opened or clicked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from storage.codec import timestamp
from storage.tx import Tx

Grouping = Literal["domain", "tag", "broadcast"]
COUNTED = ("delivered", "bounced", "failed", "complained", "opened", "clicked")
# A recipient counts as sent once its mail had an outcome (a bounce after delivery, from a
# DSN, counts once): the denominator of the delivery and bounce rates.
SETTLED = ("delivered", "bounced", "failed")
# (group, event type, audience or "") -> recipients
Counts = dict[tuple[str, str, str], int]


def _audience(tx: Tx) -> str:
    if tx.dialect == "postgresql":
        return "COALESCE(e.metadata::json ->> 'audience', '')"
    return "COALESCE(json_extract(e.metadata, '$.audience'), '')"


def _tags(tx: Tx) -> str:
    """A row per tag of the email `m`, its value in `t.value`."""
    if tx.dialect == "postgresql":
        return "CROSS JOIN LATERAL json_array_elements_text(m.tags::json) AS t(value)"
    return "CROSS JOIN json_each(m.tags) AS t"


def _counts(tx: Tx, key: str, joins: str, where: str, params: dict[str, str]) -> Counts:
    def kinds(names: tuple[str, ...]) -> str:
        return ", ".join(f"'{name}'" for name in names)

    source = (
        f" FROM emails m {joins} JOIN email_events e ON e.email_id = m.id WHERE {where}"
        " AND e.event_type IN "
    )
    recipients = "COUNT(DISTINCT e.email_id || ' ' || COALESCE(e.recipient, '')) AS n"
    rows = tx.all(
        f"SELECT {key} AS grp, e.event_type AS kind, {_audience(tx)} AS audience, {recipients}"
        f"{source}({kinds(COUNTED)}) GROUP BY 1, 2, 3",
        params,
    )
    counts = {
        (str(row["grp"]), str(row["kind"]), str(row["audience"])): int(row["n"]) for row in rows
    }
    settled = tx.all(
        f"SELECT {key} AS grp, {recipients}{source}({kinds(SETTLED)}) GROUP BY 1", params
    )
    counts.update({(str(row["grp"]), "sent", ""): int(row["n"]) for row in settled})
    return counts


def grouped(tx: Tx, workspace_id: str, by: Grouping, since: datetime, until: datetime) -> Counts:
    """Recipients reached per group, event type and audience, for the workspace's emails
    created in [since, until)."""
    joins, key = {
        "domain": ("JOIN domains d ON d.id = m.domain_id", "d.name"),
        "tag": (_tags(tx), "t.value"),
        "broadcast": ("", "m.broadcast_id"),
    }[by]
    where = "m.workspace_id = :ws AND m.created_at >= :since AND m.created_at < :until"
    if by == "broadcast":
        where += " AND m.broadcast_id IS NOT NULL"
    params = {"ws": workspace_id, "since": timestamp(since), "until": timestamp(until)}
    return _counts(tx, key, joins, where, params)


def of_broadcast(tx: Tx, broadcast_id: str) -> Counts:
    """Recipients reached per event type and audience by one broadcast's emails (all of one
    workspace: the caller checks it is the asker's). Found through the broadcast index alone:
    a workspace's own index would walk all its mail."""
    return _counts(tx, "m.broadcast_id", "", "m.broadcast_id = :b", {"b": broadcast_id})


def broadcast_names(tx: Tx, workspace_id: str, broadcast_ids: list[str]) -> dict[str, str]:
    """The names (subjects as written) of the workspace's broadcasts among `broadcast_ids`."""
    if not broadcast_ids:
        return {}
    marks = ", ".join(f":b{i}" for i in range(len(broadcast_ids)))
    params = {f"b{i}": b for i, b in enumerate(broadcast_ids)} | {"ws": workspace_id}
    rows = tx.all(
        f"SELECT id, subject FROM broadcasts WHERE workspace_id = :ws AND id IN ({marks})",
        params,
    )
    return {str(row["id"]): str(row["subject"]) for row in rows}
