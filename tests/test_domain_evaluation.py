"""SPF evaluated and DMARC parsed by the domain checks, through the real service's domain API
and the loopback DNS server: what authorises the service, what receivers reject and why, what
to add to a record already there, and the bulk-sender verdicts beside "can send"."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from engine.domains import dmarc, spf, tls_rpt
from postroom import config
from postroom.service import serve
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.domains import create_domain, publish, record, verify
from tests.harness.service import SMTP_HOST, Account, Service

OTHERS = "198.51.100.0/24"  # another provider's addresses (a documentation range)


def the_service_is_at(dns_server: DnsServer, address: str = "127.0.0.1") -> None:
    """Publish the service host's address, as the operator does: it is what it sends from."""
    dns_server.set(SMTP_HOST, "A", [address])


@pytest.fixture
async def account(service: Service, dns_server: DnsServer) -> Account:
    """An account on a service whose host's address is published."""
    the_service_is_at(dns_server)
    return await service.account()


def rule(domain: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(r for r in domain["compliance"]["rules"] if r["rule"] == name)
    return found


async def checked_spf(
    account: Account, dns_server: DnsServer, name: str, *records: str
) -> dict[str, Any]:
    """Register `name`, publish `records` as its TXT records, verify; its SPF record entry."""
    domain = await create_domain(account, name)
    dns_server.set(name, "TXT", list(records))
    return record(await verify(account, domain), "spf")


async def republished_spf(account: Account, dns_server: DnsServer, text: str) -> dict[str, Any]:
    """Replace the one domain's SPF record with `text` and verify; its SPF record entry."""
    domain = (await account.client.get("/v1/domains/")).json()[0]
    dns_server.set(domain["name"], "TXT", [text])
    return record(await verify(account, domain), "spf")


async def test_ip4_of_the_service_and_an_include_chain_reaching_it_authorise_it(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account("business")
    the_service_is_at(dns_server)
    direct = await checked_spf(account, dns_server, "direct.example", "v=spf1 ip4:127.0.0.1 -all")
    assert direct["status"] == "verified", direct
    assert "127.0.0.1" in direct["detail"]
    assert direct["suggested_value"] is None

    # include -> include -> a:<the service host>, two levels down.
    dns_server.set(
        "_spf.relay.example", "TXT", [f"v=spf1 ip4:{OTHERS} include:_s.relay.example -all"]
    )
    dns_server.set("_s.relay.example", "TXT", [f"v=spf1 a:{SMTP_HOST} -all"])
    chained = await checked_spf(
        account, dns_server, "chained.example", "v=spf1 include:_spf.relay.example -all"
    )
    assert chained["status"] == "verified", chained

    # The same chain without the service at its end: it does not authorise it.
    dns_server.set("_s.relay.example", "TXT", ["v=spf1 ip4:10.9.8.7 -all"])
    elsewhere = await checked_spf(
        account, dns_server, "other.example", "v=spf1 include:_spf.relay.example -all"
    )
    assert elsewhere["status"] == "missing"
    assert "does not authorise 127.0.0.1" in elsewhere["detail"]
    assert "(the result is fail)" in elsewhere["detail"]


async def test_the_include_the_service_recommends_authorises_its_sending_addresses(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    clock: trio.testing.MockClock,
) -> None:
    settings = harness.test_settings(
        database_url, dns_server, spf_include="_spf.postroom.test", sending_addresses="127.0.0.2"
    )
    service = harness.Service(await nursery.start(serve, settings), clock)
    try:
        account = await service.account()
        domain = await create_domain(account, "included.example")
        recommended = record(domain, "spf")
        assert recommended["value"] == "v=spf1 include:_spf.postroom.test ~all"
        # The operator's record lists the sending address (not the host's A record: none here).
        dns_server.set("_spf.postroom.test", "TXT", ["v=spf1 ip4:127.0.0.2 -all"])
        publish(dns_server, recommended)
        spf_record = record(await verify(account, domain), "spf")
        assert spf_record["status"] == "verified", spf_record
        assert spf_record["detail"] == "the SPF record authorises 127.0.0.2"
    finally:
        await service.aclose()
        service.running.stop()


async def test_two_spf_records_are_a_permanent_error_with_one_merged_record_to_publish(
    account: Account, dns_server: DnsServer
) -> None:
    dns_server.set("_spf.mailer.example", "TXT", [f"v=spf1 ip4:{OTHERS} -all"])
    found = await checked_spf(
        account,
        dns_server,
        "example.com",
        "v=spf1 include:_spf.mailer.example ~all",
        f"v=spf1 a:{SMTP_HOST} -all",  # the service's own record, added as a second one
    )
    assert found["status"] == "invalid"
    assert "more than one SPF record" in found["detail"]
    assert found["suggested_value"] == (f"v=spf1 include:_spf.mailer.example a:{SMTP_HOST} ~all")

    # Publishing the merged record alone makes it verified.
    merged = await republished_spf(account, dns_server, found["suggested_value"])
    assert merged["status"] == "verified"


async def test_more_than_ten_lookups_is_a_permanent_error(
    account: Account, dns_server: DnsServer
) -> None:
    # Eleven includes, each one lookup, each a record of its own.
    for level in range(1, 12):
        dns_server.set(
            f"l{level}.chain.example", "TXT", [f"v=spf1 include:l{level + 1}.chain.example"]
        )
    dns_server.set("l12.chain.example", "TXT", ["v=spf1 ip4:127.0.0.1"])
    found = await checked_spf(
        account, dns_server, "example.com", "v=spf1 include:l1.chain.example -all"
    )
    assert found["status"] == "invalid", found
    assert "more than 10 DNS lookups" in found["detail"]

    # Ten includes are within the limit, and the end of the chain authorises the service.
    within = await republished_spf(account, dns_server, "v=spf1 include:l3.chain.example -all")
    assert within["status"] == "verified"


async def test_plus_all_lets_anyone_send_and_is_a_failure(
    account: Account, dns_server: DnsServer
) -> None:
    found = await checked_spf(account, dns_server, "example.com", f"v=spf1 a:{SMTP_HOST} +all")
    assert found["status"] == "invalid"
    assert "lets every host on the internet send" in found["detail"]
    assert found["suggested_value"] == f"v=spf1 a:{SMTP_HOST} ~all"
    domain = (await account.client.get("/v1/domains/")).json()[0]
    assert rule(domain, "spf")["status"] == "fail"


async def test_guidance_adds_the_service_to_an_existing_record_instead_of_replacing_it(
    account: Account, dns_server: DnsServer
) -> None:
    dns_server.set("_spf.google.com", "TXT", [f"v=spf1 ip4:{OTHERS} ~all"])
    found = await checked_spf(
        account, dns_server, "example.com", "v=spf1 include:_spf.google.com ~all"
    )
    merged = f"v=spf1 include:_spf.google.com a:{SMTP_HOST} ~all"
    assert found["status"] == "missing"
    assert f"add a:{SMTP_HOST} before ~all, giving {merged}" in found["detail"]
    assert found["suggested_value"] == merged
    # The record given for a domain with none stays what it was.
    assert found["value"] == f"v=spf1 a:{SMTP_HOST} ~all"

    spf_record = await republished_spf(account, dns_server, merged)
    assert (spf_record["status"], spf_record["suggested_value"]) == ("verified", None)


async def test_dns_that_cannot_answer_leaves_spf_and_dmarc_pending_saying_so(
    account: Account, dns_server: DnsServer
) -> None:
    domain = await create_domain(account)
    dns_server.fail("example.com")
    dns_server.fail("_dmarc.example.com")
    checked = await verify(account, domain)
    spf_record, dmarc_record = record(checked, "spf"), record(checked, "dmarc")
    assert (spf_record["status"], dmarc_record["status"]) == ("pending", "pending")
    assert spf_record["detail"].startswith("DNS could not answer: ")
    assert "example.com" in spf_record["detail"]
    assert rule(checked, "spf")["status"] == "pending"


async def test_no_dmarc_record_can_send_but_does_not_meet_the_bulk_sender_rules(
    account: Account, dns_server: DnsServer
) -> None:
    domain = await create_domain(account)
    publish(dns_server, record(domain, "dkim"), record(domain, "spf"))

    checked = await verify(account, domain)
    assert checked["status"] == "verified"
    assert record(checked, "dmarc")["status"] == "missing"
    compliance = checked["compliance"]
    assert (compliance["can_send"], compliance["bulk_sender_ready"]) == (True, False)
    assert compliance["dmarc"] is None
    assert rule(checked, "dmarc")["status"] == "fail"
    assert "no DMARC record at _dmarc.example.com" in rule(checked, "dmarc")["reason"]
    assert rule(checked, "spf")["status"] == "pass"
    assert rule(checked, "dkim")["status"] == "pass"
    # The test service's links are http, and no bounce domain is set.
    assert rule(checked, "unsubscribe_https")["status"] == "fail"
    assert rule(checked, "bounce_domain")["status"] == "fail"


async def test_dmarc_p_none_with_rua_is_parsed_and_passes_aligned(
    account: Account, dns_server: DnsServer
) -> None:
    domain = await create_domain(account)
    publish(dns_server, record(domain, "dkim"), record(domain, "spf"))
    dns_server.set(
        "_dmarc.example.com",
        "TXT",
        [
            "v=DMARC1; p=none; sp=quarantine; adkim=s; rua=mailto:dmarc@example.com,mailto:a@b.example"
        ],
    )

    checked = await verify(account, domain)
    assert record(checked, "dmarc")["status"] == "verified"
    assert checked["compliance"]["dmarc"] == {
        "host": "_dmarc.example.com",
        "inherited": False,
        "policy": "none",
        "subdomain_policy": "quarantine",
        "adkim": "s",
        "aspf": "r",
        "pct": 100,
        "rua": ["mailto:dmarc@example.com", "mailto:a@b.example"],
        "ruf": [],
    }
    verdict = rule(checked, "dmarc")
    assert verdict["status"] == "pass"
    assert "aligned through DKIM and SPF" in verdict["reason"]
    assert "mailto:dmarc@example.com" in record(checked, "dmarc")["detail"]


async def test_the_tls_reporting_record_is_guidance_checked_like_dmarc(
    account: Account, dns_server: DnsServer
) -> None:
    domain = await create_domain(account)
    guided = record(domain, "tls_rpt")
    assert (guided["type"], guided["host"], guided["required"], guided["status"]) == (
        "TXT",
        "_smtp._tls.example.com",
        False,
        "pending",
    )
    # To the inbound MX's tls-rpt@ (engine/forwarding/tls_reports.py), as DMARC's go to dmarc@.
    assert guided["value"] == "v=TLSRPTv1; rua=mailto:tls-rpt@example.com"
    publish(dns_server, record(domain, "dkim"), record(domain, "spf"))
    checked = await verify(account, domain)
    assert checked["status"] == "verified"  # not required
    assert record(checked, "tls_rpt")["status"] == "missing"
    assert (
        "no TLS reporting record at _smtp._tls.example.com"
        in (record(checked, "tls_rpt")["detail"])
    )

    publish(dns_server, guided)
    found = record(await verify(account, domain), "tls_rpt")
    assert (found["status"], found["suggested_value"]) == ("verified", None)
    assert found["detail"] == "reports go to mailto:tls-rpt@example.com"

    # Reports that go elsewhere only: ours added to what is there.
    dns_server.set(
        "_smtp._tls.example.com", "TXT", ["v=TLSRPTv1; rua=mailto:tls@elsewhere.example"]
    )
    found = record(await verify(account, domain), "tls_rpt")
    assert found["status"] == "verified"
    assert found["suggested_value"] == (
        "v=TLSRPTv1; rua=mailto:tls@elsewhere.example,mailto:tls-rpt@example.com"
    )
    for broken, why in [
        (["v=TLSRPTv1; rua=mailto:a@b.example", "v=TLSRPTv1; rua=mailto:c@d.example"], "2 TLS"),
        (["v=TLSRPTv1; ruf=mailto:a@b.example"], "names no rua"),
    ]:
        dns_server.set("_smtp._tls.example.com", "TXT", broken)
        found = record(await verify(account, domain), "tls_rpt")
        assert found["status"] == "invalid" and why in found["detail"], found


def test_tls_reporting_records_are_read_as_rfc_8460_says() -> None:
    assert tls_rpt.parse("v=TLSRPTv1;rua=mailto:a@b.example, https://r.example/x; x=1") == [
        "mailto:a@b.example",
        "https://r.example/x",
    ]
    assert tls_rpt.ours(["v=spf1 -all", "v=TLSRPTv1; rua=mailto:a@b.example"]) is not None
    assert tls_rpt.ours(["v=TLSRPTv1x; rua=mailto:a@b.example"]) is None
    for bad in ["v=TLSRPTv2; rua=mailto:a@b.example", "v=TLSRPTv1; rua=ftp://x.example"]:
        with pytest.raises(tls_rpt.InvalidRecord):
            tls_rpt.parse(bad)


async def test_dmarc_of_a_parent_applies_its_subdomain_policy_and_a_broken_one_says_why(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account("business")
    dns_server.set("_dmarc.example.com", "TXT", ["v=DMARC1; p=reject; sp=none"])
    sub = await create_domain(account, "mail.example.com")
    inherited = await verify(account, sub)
    assert record(inherited, "dmarc")["status"] == "verified"
    policy = inherited["compliance"]["dmarc"]
    assert (policy["host"], policy["inherited"], policy["subdomain_policy"]) == (
        "_dmarc.example.com",
        True,
        "none",
    )
    # Not yet aligned: the domain's DKIM record is not published.
    assert rule(inherited, "dmarc")["status"] == "fail"

    dns_server.set("_dmarc.broken.example", "TXT", ["v=DMARC1; p=monitor"])
    broken = await verify(account, await create_domain(account, "broken.example"))
    dmarc_record = record(broken, "dmarc")
    assert dmarc_record["status"] == "invalid"
    assert "p=monitor is not one of none, quarantine, reject" in dmarc_record["detail"]
    assert rule(broken, "dmarc")["status"] == "fail"


def test_merging_keeps_every_term_once_and_puts_the_service_before_all() -> None:
    assert (
        spf.merged(["v=spf1 mx include:_spf.google.com -all"], "a:mx.postroom.test")
        == "v=spf1 mx include:_spf.google.com a:mx.postroom.test -all"
    )
    # Two records: one, the first `all` kept; a redirect is dropped beside an `all`.
    assert (
        spf.merged(
            ["v=spf1 ip4:198.51.100.1 ~all", "v=spf1 IP4:198.51.100.1 mx redirect=x.example"],
            "include:_spf.postroom.test",
        )
        == "v=spf1 ip4:198.51.100.1 mx include:_spf.postroom.test ~all"
    )
    # Already there: nothing added; no `all`: the redirect stays.
    assert (
        spf.merged(["v=spf1 a:mx.postroom.test redirect=_spf.example"], "a:mx.postroom.test")
        == "v=spf1 a:mx.postroom.test redirect=_spf.example"
    )


def test_dmarc_records_receivers_discard_are_invalid() -> None:
    cases = {
        "v=DMARC1": "no policy",
        "v=DMARC1 p=none": "not a tag=value pair",
        "p=none; v=DMARC1": "must begin with v=DMARC1",
        "v=DMARC1; p=none; pct=150": "pct=150",
        "v=DMARC1; p=none; rua=dmarc@example.com": "rua must list URIs",
        "v=DMARC1; p=none; p=reject": "appears twice",
        "v=DMARC1; p=none; aspf=x": "aspf=x",
    }
    for text, reason in cases.items():
        try:
            dmarc.parse(text, "_dmarc.example.com")
        except dmarc.InvalidRecord as exc:
            assert reason in str(exc), (text, str(exc))
        else:
            raise AssertionError(f"{text!r} parsed")
    # A bad p with a usable rua is read as none (RFC 7489 section 6.6.3); unknown tags ignored.
    lenient = dmarc.parse("v=DMARC1; p=bogus; rua=mailto:r@example.com; xyz=1", "_dmarc.x")
    assert (lenient.policy, lenient.rua) == ("none", ["mailto:r@example.com"])


def test_sending_addresses_and_the_spf_include_are_settings_checked_at_start() -> None:
    env = {
        "POSTROOM_SENDING_ADDRESSES": "192.0.2.7, 2001:DB8::7",
        "POSTROOM_SPF_INCLUDE": "_spf.Mail.example.",
    }
    settings = config.load(env)
    assert settings.sending_addresses == ("192.0.2.7", "2001:db8::7")
    assert settings.spf_include == "_spf.mail.example"
    for name, value in (("SENDING_ADDRESSES", "mail.example.com"), ("SPF_INCLUDE", "not a name")):
        with pytest.raises(config.SettingsError, match=f"POSTROOM_{name}: expected"):
            config.load({f"POSTROOM_{name}": value})
