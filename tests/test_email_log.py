"""The email log's filters beyond search words: source and creation range, the total in
`X-Total-Count`, a stable order for emails stored in one commit, and the CSV export."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta

from trio.testing import MockClock

from engine.sending import email_log
from storage import emails
from tests.harness.dns_server import DnsServer
from tests.harness.sending import message, ready_account
from tests.harness.service import Account, Service


async def _listed(account: Account, **params: str | int) -> tuple[list[str], int]:
    response = await account.client.get("/v1/emails/", params=params)
    assert response.status_code == 200, response.text
    return [e["id"] for e in response.json()], int(response.headers["X-Total-Count"])


async def test_source_and_range_filters_count_and_a_batch_pages_in_a_stable_order(
    service: Service, dns_server: DnsServer, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    single = (await account.client.post("/v1/emails/", json=message("one@list.example"))).json()
    stored = (await account.client.get(f"/v1/emails/{single['id']}")).json()
    middle = datetime.fromisoformat(stored["created_at"]) + timedelta(minutes=30)
    clock.jump(3600)
    batch = [message(f"b{i}@list.example") for i in range(7)]
    sent = await account.client.post("/v1/emails/batch", json=batch)
    batch_ids = [e["id"] for e in sent.json()]

    # One commit, one created_at: the id decides, so pages neither repeat nor skip an email.
    every, total = await _listed(account, limit=100)
    assert total == 8 and every[-1] == single["id"]
    assert every[:7] == sorted(batch_ids, reverse=True)
    paged = []
    for page in range(4):
        ids, total = await _listed(account, limit=2, page=page)
        assert total == 8
        paged += ids
    assert paged == every

    assert await _listed(account, source="batch") == (every[:7], 7)
    assert await _listed(account, source="api") == ([single["id"]], 1)
    assert await _listed(account, source="mcp") == ([], 0)
    later, total = await _listed(account, created_from=middle.isoformat())
    assert set(later) == set(batch_ids) and total == 7
    # A time without a zone is UTC.
    naive = middle.replace(tzinfo=None).isoformat()
    assert await _listed(account, created_before=naive) == ([single["id"]], 1)
    searched = await account.client.get(
        "/v1/emails/search", params={"q": "b3", "source": "batch", "limit": 1}
    )
    assert [e["to_addresses"] for e in searched.json()] == [["b3@list.example"]]
    assert searched.headers["X-Total-Count"] == "1"

    refusals = (
        ({"source": "fax"}, "source"),
        ({"created_from": "yesterday"}, "created_from"),
        (
            {"created_from": middle.isoformat(), "created_before": middle.isoformat()},
            "created_before",
        ),
    )
    for params, field in refusals:
        refused = await account.client.get("/v1/emails/", params=params)
        assert refused.status_code == 422, params
        assert field in str(refused.json())


async def test_csv_export_streams_the_filtered_log_with_cells_safe_for_spreadsheets(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    risky = message("x@list.example", subject='=HYPERLINK("http://evil.example","open")')
    risky_id = (await account.client.post("/v1/emails/", json=risky)).json()["id"]
    await account.client.post("/v1/emails/batch", json=[message("y@list.example", tags=["-1"])])

    response = await account.client.get("/v1/emails/export", params={"source": "api"})
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in response.headers["Content-Disposition"]
    assert response.headers["X-Total-Count"] == "1"
    assert int(response.headers["X-Row-Limit"]) == 50_000
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [r["id"] for r in rows] == [risky_id]
    assert rows[0]["subject"] == '\'=HYPERLINK("http://evil.example","open")'
    assert rows[0]["source"] == "api" and rows[0]["to"] == "x@list.example"

    everything = await account.client.get("/v1/emails/export")
    rows = list(csv.DictReader(io.StringIO(everything.text)))
    assert [r["source"] for r in rows] == ["batch", "api"]
    assert rows[0]["tags"] == "'-1"
    refused = await account.client.get("/v1/emails/export", params={"page": 1})
    assert refused.status_code == 422


async def test_the_export_reads_past_each_page_by_time_and_id_without_a_gap(
    service: Service, dns_server: DnsServer, clock: MockClock
) -> None:
    """The export's pages (storage `search_after`) start past the last row read: across a
    batch stored in one commit, and across emails a second apart, every email once."""
    account = await ready_account(service, dns_server)
    await account.client.post("/v1/emails/", json=message("first@list.example"))
    clock.jump(1)
    batch = [message(f"b{i}@list.example") for i in range(7)]
    assert (await account.client.post("/v1/emails/batch", json=batch)).status_code == 202
    clock.jump(1)
    await account.client.post("/v1/emails/", json=message("last@list.example"))
    every, _ = await _listed(account, limit=100)
    db, wanted = service.running.runtime.db, email_log.parse_query("")
    read: list[str] = []
    after = None
    while True:
        found = await db.read(emails.search_after, account.workspace_id, wanted, after, 3)
        read += [e.id for e in found]
        if len(found) < 3:
            break
        after = (found[-1].created_at, found[-1].id)
    assert read == every and len(read) == 9


async def test_a_time_past_the_calendar_once_in_utc_is_refused_at_its_field(
    service: Service,
) -> None:
    """Year 9999 at UTC-23 (or year 1 at UTC+23) is no time in UTC, which every filter and
    `send_at` is compared in: a 422 naming the field, not a 500."""
    account = await service.account()
    for path, name in (
        ("/v1/emails/", "created_from"),
        ("/v1/emails/search", "created_before"),
        ("/v1/emails/export", "created_from"),
        ("/v1/emails/updates", "since"),
    ):
        for when in ("9999-12-31T23:59:59-23:00", "0001-01-01T00:00:00+23:00"):
            answer = await account.client.get(path, params={name: when})
            assert answer.status_code == 422, (path, answer.text)
            assert answer.json()["errors"][0]["loc"] == ["query", name]
    sent = await account.client.post(
        "/v1/emails/", json=message("a@b.example", send_at="9999-12-31T23:59:59-23:00")
    )
    assert sent.status_code == 422, sent.text
