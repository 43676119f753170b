"""The Python client (clients/python/postroom_client) against the running service: the
async client under Trio, the blocking one in a thread, errors as PostroomError; and against
an HTTPS receiver standing in for an API that answers 503: every send carries an
Idempotency-Key and is sent again with the same one."""

from __future__ import annotations

import pytest
import trio
from postroom_client import AsyncPostroom, Postroom, PostroomError

from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpReply, HttpsReceiver
from tests.harness.sending import message, ready_account, route_mail
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

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


UNAVAILABLE = HttpReply(
    503,
    b'{"code": "database_unavailable", "detail": "try again shortly"}',
    headers=(("retry-after", "0"),),
)


async def test_sends_carry_a_key_and_are_sent_again_with_it_after_a_503(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    # The receiver stands in for an API whose database restarts: a 503, then the answer.
    https_receiver.respond_sequence([UNAVAILABLE, HttpReply(202, b'[{"id": "first"}]')])
    tls = tls_ca.client_context()
    async with AsyncPostroom(https_receiver.url, "svc_k_test", verify=tls) as postroom:
        assert await postroom.send_batch([message("ann@client.example")]) == [{"id": "first"}]
        https_receiver.respond_sequence([HttpReply(202, b'{"id": "second"}')])
        await postroom.send_email(message("bob@client.example"))
    first, again, second = https_receiver.requests
    assert first.path == again.path == "/v1/emails/batch" and first.body == again.body
    assert first.headers["idempotency-key"] == again.headers["idempotency-key"]
    assert second.headers["idempotency-key"] not in ("", first.headers["idempotency-key"])


async def test_blocking_client_keeps_the_callers_key_and_gives_up_after_its_retries(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    https_receiver.respond(UNAVAILABLE.status, UNAVAILABLE.body, headers=dict(UNAVAILABLE.headers))

    def send() -> PostroomError:
        with Postroom(
            https_receiver.url, "svc_k_test", retries=2, verify=tls_ca.client_context()
        ) as postroom:
            try:
                postroom.send_email(message("ann@client.example"), idempotency_key="order-8")
            except PostroomError as exc:
                return exc
        raise AssertionError("no error")

    error = await trio.to_thread.run_sync(send)
    assert error.status == 503 and error.code == "database_unavailable"
    keys = [request.headers["idempotency-key"] for request in https_receiver.requests]
    assert keys == ["order-8"] * 3
