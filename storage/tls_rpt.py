"""SMTP TLS reports the service sends (RFC 8460): a day's delivery sessions counted per
recipient domain, and which days and domains are settled (sent, or nothing to send).

The sessions of a day are counted in one statement from what delivery already records (the
delivered and deferred events, their `policy`, `reason`, `mx_host` and `response`): no work is
added to the delivery path and no index to the event table's hot insert path. The events are
found through the emails' workspace index, for emails created from `SPAN` before the day on:
a recipient is given up 72 hours after it was queued, so later events of older mail are only
those of mail scheduled further ahead (not counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from storage.codec import timestamp, to_json
from storage.tx import Tx

SPAN = timedelta(days=4)  # 72 h of retries, and the day itself
KEEP = timedelta(days=30)  # settled rows kept this long


@dataclass(frozen=True, slots=True)
class Sessions:
    """Recipients of one kind of outcome at one recipient domain on the day."""

    domain: str
    delivered: bool  # delivered (a successful session); else deferred by the TLS policy
    policy: str  # as the event records it: mta-sts, opportunistic, none (more to come)
    mx_host: str | None  # of a delivery
    response: str | None  # of a deferral: why the TLS policy passed over each host
    count: int
    verified: bool = False  # of a delivery: its certificate was verified


def _field(tx: Tx, name: str) -> str:
    """An event metadata field, as text, in the engine's own JSON syntax."""
    if tx.dialect == "postgresql":
        return f"(CAST(v.metadata AS jsonb) ->> '{name}')"
    return f"json_extract(v.metadata, '$.{name}')"


def _verified(tx: Tx) -> str:
    """Whether an event's TLS certificate was verified (metadata `tls.verified`), as 1 or 0."""
    if tx.dialect == "postgresql":
        return (
            "(CASE WHEN CAST(v.metadata AS jsonb) #>> '{tls,verified}' = 'true' THEN 1 ELSE 0 END)"
        )
    return "COALESCE(json_extract(v.metadata, '$.tls.verified'), 0)"


def day_sessions(tx: Tx, day: date) -> list[Sessions]:
    """The delivered recipients and the deferrals by a TLS policy of `day` (UTC), per recipient
    domain, policy and MX host (or reason)."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    end = start + timedelta(days=1)
    policy, reason = _field(tx, "policy"), _field(tx, "reason")
    mx_host, response = _field(tx, "mx_host"), _field(tx, "response")
    rows = tx.all(
        f"SELECT r.domain AS domain, v.event_type AS kind, {policy} AS policy,"
        f" CASE WHEN v.event_type = 'delivered' THEN {mx_host} END AS mx_host,"
        f" CASE WHEN v.event_type = 'deferred' THEN {response} END AS response,"
        f" CASE WHEN v.event_type = 'delivered' THEN {_verified(tx)} ELSE 0 END AS verified,"
        " COUNT(*) AS n"
        " FROM workspaces w"
        " JOIN emails m ON m.workspace_id = w.id AND m.created_at >= :from AND m.created_at < :end"
        " JOIN email_events v ON v.email_id = m.id"
        " JOIN email_recipients r ON r.email_id = v.email_id AND r.address = v.recipient"
        " WHERE v.created_at >= :start AND v.created_at < :end"
        f" AND (v.event_type = 'delivered' OR (v.event_type = 'deferred'"
        f" AND {reason} = 'tls_policy'))"
        " GROUP BY r.domain, v.event_type, 3, 4, 5, 6",
        {
            "from": timestamp(start - SPAN),
            "start": timestamp(start),
            "end": timestamp(end),
        },
    )
    return [
        Sessions(
            domain=str(row["domain"]).lower(),
            delivered=row["kind"] == "delivered",
            policy=str(row["policy"] or "none"),
            mx_host=row["mx_host"],
            verified=bool(row["verified"]),
            response=row["response"],
            count=int(row["n"]),
        )
        for row in rows
    ]


def settled(tx: Tx, day: date) -> set[str]:
    """The recipient domains whose report for `day` is settled."""
    rows = tx.all("SELECT domain FROM tls_rpt_sent WHERE day = :day", {"day": day.isoformat()})
    return {str(row["domain"]) for row in rows}


def settle(
    tx: Tx,
    day: date,
    domain: str,
    report_id: str | None,
    targets: list[str],
    now: datetime,
) -> bool:
    """Mark the domain's report for `day` settled (`report_id` None: nothing to send);
    whether this call did (False: another node, or an earlier run, did first)."""
    done = tx.execute(
        "INSERT INTO tls_rpt_sent (day, domain, report_id, targets, outcomes, sent_at)"
        " VALUES (:day, :domain, :report, :targets, '{}', :now)"
        " ON CONFLICT (day, domain) DO NOTHING",
        {
            "day": day.isoformat(),
            "domain": domain,
            "report": report_id,
            "targets": to_json(targets),
            "now": timestamp(now),
        },
    )
    return done == 1


def record_outcomes(tx: Tx, day: date, domain: str, outcomes: dict[str, str]) -> None:
    """What became of the report at each target (`queued`, `posted 200`, or why not)."""
    tx.execute(
        "UPDATE tls_rpt_sent SET outcomes = :outcomes WHERE day = :day AND domain = :domain",
        {"outcomes": to_json(outcomes), "day": day.isoformat(), "domain": domain},
    )


def finished_days(tx: Tx, since: date) -> set[date]:
    """The days from `since` on all of whose domains are settled (`finish_day`)."""
    rows = tx.all("SELECT day FROM tls_rpt_days WHERE day >= :since", {"since": since.isoformat()})
    return {date.fromisoformat(row["day"]) for row in rows}


def finish_day(tx: Tx, day: date, now: datetime) -> None:
    """Every domain of `day` is settled; rows older than KEEP go."""
    tx.execute(
        "INSERT INTO tls_rpt_days (day, finished_at) VALUES (:day, :now)"
        " ON CONFLICT (day) DO NOTHING",
        {"day": day.isoformat(), "now": timestamp(now)},
    )
    oldest = (now - KEEP).date().isoformat()
    tx.execute("DELETE FROM tls_rpt_sent WHERE day < :oldest", {"oldest": oldest})
    tx.execute("DELETE FROM tls_rpt_days WHERE day < :oldest", {"oldest": oldest})
