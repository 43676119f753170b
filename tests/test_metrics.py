"""`/metrics` after real sends: queue depth per destination provider (never a tenant's domain), delivery and webhook outcomes,
the accept and delivery latency histograms, and the SMTP listeners' connections; and the
bearer token that guards it when POSTROOM_METRICS_TOKEN is set."""

from __future__ import annotations

import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from engine.accounts import users as accounts
from engine.delivery import policies, providers
from engine.platform.nodes import NodeKeeper
from postroom import config, metrics
from postroom.service import RunningService, serve
from storage import nodes as stored_nodes
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.metrics import scrape
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink


async def test_metrics_show_depth_outcomes_and_latencies_after_sending(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, https_receiver: HttpsReceiver
) -> None:
    account = await ready_account(service, dns_server)
    hook = {"url": f"{https_receiver.url}/hook", "events": ["email.delivered"]}
    assert (await account.client.post("/v1/webhooks/", json=hook)).status_code == 201
    route_mail(dns_server, "fast.example")
    route_mail(dns_server, "slow.example")

    single = await account.client.post("/v1/emails/", json=message("ann@fast.example"))
    batch = await account.client.post(
        "/v1/emails/batch",
        json=[message("tempfail@slow.example"), message("permfail@fast.example")],
    )
    assert single.status_code == batch.status_code == 202
    delivered = await wait_for_status(account, single.json()["id"])
    deferred_id, bounced_id = (entry["id"] for entry in batch.json())
    await wait_for_status(account, deferred_id, ("deferred",))
    await wait_for_status(account, bounced_id)
    await https_receiver.wait_for_requests(1)
    webhook_delivered = ("postroom_webhook_deliveries_total", (("outcome", "delivered"),))
    outcomes = {("delivered", 1), ("deferred", 1), ("bounced", 1), ("failed", 0)}

    def counted(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> bool:
        return all(
            samples.get(("postroom_deliveries_total", (("outcome", outcome),))) == count
            for outcome, count in outcomes
        )

    # The dispatcher records the 2xx just after the receiver answers; a delivery round counts
    # its outcomes when it ends, just after their statuses were written.
    with trio.fail_after(15):
        while True:
            samples = await scrape(service)
            if samples.get(webhook_delivered) == 1 and counted(samples):
                break
            await trio.sleep(0.05)

    assert delivered["status"] == "delivered"
    depth = {
        labels: value for (name, labels), value in samples.items() if name == "postroom_queue_depth"
    }
    assert depth == {(("destination", "other"), ("status", "deferred")): 1}
    assert samples[("postroom_emails_waiting", (("status", "deferred"),))] == 1
    for outcome, count in outcomes:
        assert samples[("postroom_deliveries_total", (("outcome", outcome),))] == count
    assert samples[("postroom_delivery_latency_seconds_count", ())] == 1
    assert samples[("postroom_delivery_latency_seconds_bucket", (("le", "+Inf"),))] == 1
    assert 0 < samples[("postroom_delivery_latency_seconds_sum", ())] < 15
    for endpoint in ("send", "batch"):
        labels = (("endpoint", endpoint),)
        assert samples[("postroom_api_accept_seconds_count", labels)] == 1
        assert 0 < samples[("postroom_api_accept_seconds_sum", labels)] < 15
    assert samples[("postroom_webhook_deliveries_total", (("outcome", "dead"),))] == 0
    for listener in ("submission", "inbound"):  # the SMTP listeners report their connections
        assert samples[(f"postroom_{listener}_connections_total", ())] == 0


METRICS_TOKEN = "scrape-" + "k3y" * 8


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_metrics_with_a_token_set_answer_only_that_bearer_token(
    nursery: trio.Nursery, database_url: str
) -> None:
    settings = harness.test_settings(database_url, metrics_token=METRICS_TOKEN)
    running: RunningService = await nursery.start(serve, settings)
    try:
        key = (
            await accounts.create_account(
                running.runtime, "ops@example.org", "correct horse battery staple", "free", False
            )
        ).api_key
        async with httpx.AsyncClient(base_url=running.api_url) as client:
            for authorization in (
                None,
                f"Bearer {key}",  # an API key is not the metrics token
                f"Bearer {METRICS_TOKEN}x",
                f"Bearer {METRICS_TOKEN[:-1]}",
                f"Basic {METRICS_TOKEN}",
                METRICS_TOKEN,
            ):
                headers = {} if authorization is None else {"Authorization": authorization}
                refused = await client.get("/metrics", headers=headers)
                assert refused.status_code == 401, authorization
                assert refused.json()["code"] == "unauthorized"
                assert refused.headers["WWW-Authenticate"].startswith("Bearer")
            scraped = await client.get(
                "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
            )
            assert scraped.status_code == 200
            assert "postroom_emails_waiting" in scraped.text
            assert (await client.get("/healthz")).status_code == 200  # health stays open
    finally:
        running.stop()


@pytest.mark.parametrize("token", ["too-short", "sixteen chars or more, with spaces"])
def test_a_guessable_or_unsendable_metrics_token_stops_start_up_without_echoing_it(
    token: str,
) -> None:
    with pytest.raises(config.SettingsError) as refused:
        config.load({"POSTROOM_METRICS_TOKEN": token})
    assert "POSTROOM_METRICS_TOKEN" in str(refused.value)
    assert token not in str(refused.value)


def test_the_workers_figures_add_up_as_one() -> None:
    # What two workers publish with their beats, read back and merged as a scrape does:
    # counters, histograms and summable gauges add up, a gauge of `_AT_MOST` takes the
    # largest, a label set one worker lacks is kept, and `_created` times are dropped.
    def worker(delivered: float, in_flight: dict[str, float], full: int) -> list[Metric]:
        deliveries = CounterMetricFamily("postroom_deliveries", "d", labels=["outcome"])
        deliveries.add_metric(["delivered"], delivered)
        flight = GaugeMetricFamily("postroom_delivery_in_flight", "f", labels=["domain"])
        for domain, count in in_flight.items():
            flight.add_metric([domain], count)
        latency = Histogram("postroom_api_accept_seconds", "a", buckets=(0.1,), registry=None)
        latency.observe(0.05)
        latency.observe(0.5)
        full_gauge = GaugeMetricFamily("postroom_storage_full", "s", value=full)
        return [deliveries, flight, *latency.collect(), full_gauge]

    first = metrics.published(worker(3, {"a.example": 2}, 0))
    second = metrics.published(worker(4, {"a.example": 1, "b.example": 5}, 1))
    assert "_created" not in first
    rendered = CollectorRegistry()
    families = list(metrics.merged([metrics._read(first), metrics._read(second)]))

    class Merged:
        def collect(self) -> list[Metric]:
            return families

    rendered.register(Merged())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(rendered).decode())
        for s in family.samples
    }
    assert samples == {
        ("postroom_deliveries_total", (("outcome", "delivered"),)): 7,
        ("postroom_delivery_in_flight", (("domain", "a.example"),)): 3,
        ("postroom_delivery_in_flight", (("domain", "b.example"),)): 5,
        ("postroom_api_accept_seconds_bucket", (("le", "0.1"),)): 2,
        ("postroom_api_accept_seconds_bucket", (("le", "+Inf"),)): 4,
        ("postroom_api_accept_seconds_count", ()): 4,
        ("postroom_api_accept_seconds_sum", ()): 1.1,
        ("postroom_storage_full", ()): 1,
    }


def test_figures_that_do_not_read_are_left_out_of_a_scrape() -> None:
    for unreadable in ("not json", '{"a": 1}', '[["x", "no such type", "d", []]]', "[[1]]"):
        assert metrics._read(unreadable) == []


async def test_a_fault_reading_the_figures_never_stops_the_heartbeat(service: Service) -> None:
    # Without its beat a node is declared dead and its work freed: the figures are not worth it.
    rt = service.running.runtime
    keeper = NodeKeeper(rt)

    def broken() -> str:
        raise RuntimeError("a statistics() bug")

    keeper.metrics = broken
    before = await rt.db.read(stored_nodes.listed)
    await trio.sleep(0.01)
    await keeper.beat()
    after = await rt.db.read(stored_nodes.listed)
    [(node_before, _)] = [entry for entry in before if entry[0].id == rt.node]
    [(node_after, _)] = [entry for entry in after if entry[0].id == rt.node]
    assert node_after.heartbeat_at > node_before.heartbeat_at
    assert node_after.state == "alive" and keeper.statistics().beats == 1


async def test_one_tenants_recipient_domains_neither_grow_nor_show_in_the_metrics(
    service: Service, dns_server: DnsServer
) -> None:
    """Issue 28, item 9: 2,000 recipient domains once made 2,000 series (13 KB -> 139 KB)."""
    account = await ready_account(service, dns_server, plan="business")
    names = [f"tenant-{i}.example" for i in range(200)]  # fewer than 2,000 proves it as well
    for name in [*names, "gmail.com"]:
        dns_server.fail(name)  # DNS cannot answer: every recipient waits, deferred

    def to(first: int) -> list[dict[str, str]]:
        return [{"email": f"a@{name}"} for name in names[first : first + 50]]

    batch = [
        {**message("ann@gmail.com"), "to": to(100 * e), "cc": to(100 * e + 50)} for e in range(2)
    ]
    batch.append(message("ann@gmail.com"))
    assert (await account.client.post("/v1/emails/batch", json=batch)).status_code == 202
    samples = await scrape(service)

    depth: dict[str, float] = {}
    for (name, labels), value in samples.items():
        if name == "postroom_queue_depth":  # queued, or deferred once DNS failed
            destination = dict(labels)["destination"]
            depth[destination] = depth.get(destination, 0) + value
    assert depth == {"google": 1, "other": 200}  # every recipient is counted...
    response = await service.client().get("/metrics")
    assert "tenant-" not in response.text  # ...and no name of theirs is shown
    assert len(response.content) < 20_000  # 200 domains made ~200 series more


def test_the_destination_vocabulary_is_the_built_in_providers_and_other() -> None:
    builtin = {rule.suffix for rule in policies.BUILTIN}
    assert builtin == {p.mx_suffix for p in providers.PROVIDERS}
    assert providers.label("mx:google.com") == providers.label("GMail.com.") == "google"
    assert providers.label("hotmail.com") == "microsoft"
    for theirs in ("mx:grouped.test", "customer.example", "mx:", ""):
        assert providers.label(theirs) == providers.OTHER
    assert set(providers.LABELS) == {*(p.label for p in providers.PROVIDERS), "other"}
