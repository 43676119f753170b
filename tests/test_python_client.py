"""The Python client (clients/python/postroom_client) against the running service: the
async client under Trio, the blocking one in a thread, errors as PostroomError."""

from __future__ import annotations

import pytest
import trio
from postroom_client import AsyncPostroom, Postroom, PostroomError

from tests.harness.dns_server import DnsServer
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.test_sending import message, ready_account, route_mail

MISSING = "00000000-0000-0000-0000-000000000000"


async def test_async_client_sends_once_per_key_reads_and_erases(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "client.example")
    async with AsyncPostroom(service.url, account.api_key) as postroom:
        body = message("ann@client.example")
        first = await postroom.send_email(body, idempotency_key="order-7")
        again = await postroom.send_email(body, idempotency_key="order-7")
        assert first == again and first["status"] in ("queued", "sending", "delivered")
        assert (await postroom.get_email(first["id"]))["subject"] == "Your receipt"
        assert [item["id"] for item in await postroom.list_emails()] == [first["id"]]
        erased = await postroom.erase("ann@client.example")
        assert erased["emails"] == 1
        with pytest.raises(PostroomError) as refused:
            await postroom.send_email({"to": []})
        assert refused.value.status == 422 and refused.value.code == "validation_error"


async def test_blocking_client_raises_the_error_body(service: Service) -> None:
    account = await service.account()

    def use() -> PostroomError:
        with Postroom(service.url, account.api_key) as postroom:
            assert postroom.request("GET", "/v1/webhooks/") == []
            try:
                postroom.get_email(MISSING)
            except PostroomError as exc:
                return exc
        raise AssertionError("no error")

    error = await trio.to_thread.run_sync(use)
    assert error.status == 404 and error.code == "not_found" and error.detail
    with pytest.raises(PostroomError) as unauthorized:
        async with AsyncPostroom(service.url, "pr_wrong") as stranger:
            await stranger.list_emails()
    assert unauthorized.value.status == 401 and unauthorized.value.code == "unauthorized"
