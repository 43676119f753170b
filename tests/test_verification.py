"""Address verification: each of the four results, and that no message is ever sent."""

from __future__ import annotations

from typing import Any

from trio.testing import MockClock

from tests.harness.dns_server import DnsServer
from tests.harness.sandbox import sandbox_account
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink


async def _verify(account: Account, email: str) -> dict[str, Any]:
    response = await account.client.post("/v1/verify", json={"email": email})
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


async def test_the_four_results(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await service.account()
    dns_server.set("dest.example", "MX", ["10 mx.dest.example."])
    dns_server.set("mx.dest.example", "A", ["127.0.0.1"])

    valid = await _verify(account, "Ann@Dest.example")
    assert valid == {
        "email": "ann@dest.example",
        "result": "valid",
        "reason": valid["reason"],
        "mx_found": True,
        "mx_host": "mx.dest.example",
    }
    assert (await _verify(account, "permfail@dest.example"))["result"] == "invalid"
    assert (await _verify(account, "tempfail@dest.example"))["result"] == "risky"

    dns_server.set("dark.example", "MX", ["10 mx.dark.example."])
    dns_server.set("mx.dark.example", "A", ["127.0.0.2"])  # nothing listens there
    unknown = await _verify(account, "x@dark.example")
    assert unknown["result"] == "unknown" and unknown["mx_host"] == "mx.dark.example"

    # Never DATA, never a message.
    assert smtp_sink.messages == []
    assert not any(line.upper().startswith("DATA") for line in smtp_sink.transcript)
    assert any(line.upper().startswith("RCPT") for line in smtp_sink.transcript)


async def test_invalid_without_asking_any_server(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await service.account()
    dns_server.set("nomail.example", "MX", ["0 ."])
    for address, mx_found in (
        ("not-an-address", False),
        ("a@nomail.example", False),
        ("a@nowhere.example", False),
    ):
        result = await _verify(account, address)
        assert result["result"] == "invalid", address
        assert result["mx_found"] is mx_found and result["mx_host"] is None
    assert smtp_sink.connections == 0


async def test_domain_without_mx_is_probed_at_its_address(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await service.account()
    dns_server.set("plain.example", "A", ["127.0.0.1"])
    result = await _verify(account, "p@plain.example")
    assert result["result"] == "valid"
    assert result["mx_found"] is False and result["mx_host"] == "plain.example"


async def test_missing_email_is_422(service: Service) -> None:
    account = await service.account()
    for body in ({}, {"email": ""}, {"email": 5}):
        response = await account.client.post("/v1/verify", json=body)
        assert response.status_code == 422
    assert (
        await service.client().post("/v1/verify", json={"email": "a@b.example"})
    ).status_code == 401


async def test_each_workspace_may_verify_thirty_addresses_a_minute(
    service: Service, clock: MockClock
) -> None:
    account, other = await service.account(), await service.account()
    for _ in range(30):
        answered = await account.client.post("/v1/verify", json={"email": "not an address"})
        assert answered.status_code == 200
    refused = await account.client.post("/v1/verify", json={"email": "not an address"})
    assert refused.status_code == 429
    assert refused.json()["code"] == "rate_limited"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert (await other.client.post("/v1/verify", json={"email": "x"})).status_code == 200
    clock.jump(61)
    assert (await account.client.post("/v1/verify", json={"email": "x"})).status_code == 200


async def test_a_sandboxed_workspace_is_answered_by_the_sandbox_without_leaving_the_machine(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    """The sandbox's scripts answer the probe: no DNS lookup, no connection (a probe would
    reach the sink here), the same four results and the same limit."""
    account = await sandbox_account(service)
    dns_server.set("dest.example", "MX", ["10 mx.dest.example."])
    dns_server.set("mx.dest.example", "A", ["127.0.0.1"])
    asked_before = len(dns_server.queries)

    valid = await _verify(account, "Ann@Dest.example")
    assert valid["result"] == "valid" and valid["email"] == "ann@dest.example"
    assert valid["mx_found"] is True and valid["mx_host"] == "sandbox.invalid"
    assert (await _verify(account, "bounce@dest.example"))["result"] == "invalid"
    assert (await _verify(account, "defer3-then-deliver@dest.example"))["result"] == "risky"
    assert (await _verify(account, "not-an-address"))["result"] == "invalid"

    assert smtp_sink.connections == 0
    assert [q.name for q in dns_server.queries[asked_before:] if "dest.example" in q.name] == []
    answers = [
        (await account.client.post("/v1/verify", json={"email": "x@dest.example"})).status_code
        for _ in range(30)
    ]
    assert answers[-1] == 429  # 30 a minute, the four above included
