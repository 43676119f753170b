"""SMTP TLS reports sent (RFC 8460, issue 31): a day's deliveries to real peers on loopback
(a sink whose certificate matches one MX name and not another, MTA-STS policies served over
HTTPS), then `postroom reports tls --day` in a child process: the report mailed to a
`mailto:` rua through the service's own delivery and POSTed to an `https:` one, once however
often the day is run, and none for a domain without `_smtp._tls`.

The service runs on the day before today (its clock anchored at yesterday noon, UTC), so the
day it delivered on is over for the command, which runs on the real clock."""

from __future__ import annotations

import email
import email.policy
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from email.message import EmailMessage
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from engine.platform.clock import Clock
from engine.reports import tls_rpt, tls_sender
from postroom import cli, startup
from storage.tls_rpt import Sessions
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.sending import message, ready_account, route_mail, wait_for_email
from tests.harness.service import REPO, Service
from tests.harness.smtp_sink import ReceivedMessage, SmtpSink
from tests.harness.tls import TlsAuthority

YESTERDAY = datetime.now(UTC).date() - timedelta(days=1)
GOOD = "customer.example"  # MTA-STS enforce; the sink's certificate names its MX
BAD = "strict.example"  # MTA-STS enforce; the certificate does not name its MX
PLAIN = "plain.example"  # no policy, no _smtp._tls record: no report
REPORTS = "reports.example"  # where the mailto: rua points


@pytest.fixture(autouse=True)
def on_yesterday(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's clock reads yesterday noon (UTC) when it starts, and runs on from there."""
    noon = datetime.combine(YESTERDAY, time(12), tzinfo=UTC)
    monkeypatch.setattr(startup, "Clock", partial(Clock, noon))


def _policy(mx: str) -> str:
    return f"version: STSv1\r\nmode: enforce\r\nmx: {mx}\r\nmax_age: 86400\r\n"


async def _peers(
    nursery: trio.Nursery, dns: DnsServer, tls_ca: TlsAuthority
) -> tuple[SmtpSink, HttpsReceiver]:
    """The sink (certificate for mx.customer.example only) and the MTA-STS policy server;
    the recipient domains routed to them."""
    context = tls_ca.server_context()
    tls_ca.ca.issue_cert(f"mx.{GOOD}").configure_cert(context)
    sink = SmtpSink(context)
    await nursery.start(sink.run)
    policy_context = tls_ca.server_context()
    tls_ca.ca.issue_cert(*(f"mta-sts.{d}" for d in (GOOD, BAD))).configure_cert(policy_context)
    policies = HttpsReceiver(policy_context)
    await nursery.start(policies.run)
    for domain in (GOOD, BAD, PLAIN, REPORTS):
        route_mail(dns, domain)
    for domain in (GOOD, BAD):
        dns.set(f"_mta-sts.{domain}", "TXT", ["v=STSv1; id=1"])
        dns.set(f"mta-sts.{domain}", "A", ["127.0.0.1"])
    # Both domains' policies list their own MX (one file: the server answers every fetch).
    policies.respond(200, _policy(f"mx.{GOOD}") + f"mx: mx.{BAD}\r\n")
    return sink, policies


def _settings(
    sink: SmtpSink, policies: HttpsReceiver, tls_ca: TlsAuthority, tmp: Path
) -> dict[str, str]:
    """The settings the service and the command share (as POSTROOM_ variables)."""
    return {
        "delivery_port": str(sink.port),
        "mta_sts_port": str(policies.port),
        "extra_ca_file": str(tls_ca.ca_file),  # trusts the MX, the policy and the receiver
        "secret_key_file": str(tmp / "secret.key"),
    }


def _cli_env(database_url: str, dns: DnsServer, settings: dict[str, str]) -> dict[str, str]:
    """The environment of the command: the service's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_")}
    env |= {
        "POSTROOM_DATABASE_URL": database_url,
        "POSTROOM_SMTP_HOST": harness.SMTP_HOST,
        "POSTROOM_PUBLIC_URL": harness.PUBLIC_URL,
        "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",
        "POSTROOM_DNS_SERVERS": dns.nameserver,
        "POSTROOM_LOG_FORMAT": "text",
    }
    env |= {"POSTROOM_" + k.upper(): v for k, v in settings.items()}
    return env


async def _reports_tls(env: dict[str, str], day: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "postroom", "reports", "tls", "--day", day]
    run = partial(
        subprocess.run, command, env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    return await trio.to_thread.run_sync(run)


async def _deliver_all(service: Service, dns: DnsServer) -> list[dict[str, Any]]:
    """Two deliveries to GOOD over verified TLS, one deferral by the policy at BAD, one
    opportunistic delivery to PLAIN; the emails' details."""
    account = await ready_account(service, dns)
    wanted = [
        (f"a@{GOOD}", "delivered"),
        (f"b@{GOOD}", "delivered"),
        (f"c@{BAD}", "deferred"),
        (f"d@{PLAIN}", "delivered"),
    ]
    done = []
    for to, status in wanted:
        sent = (await account.client.post("/v1/emails/", json=message(to))).json()
        done.append(await wait_for_email(account, sent["id"], _status_is(status)))
    return done


def _status_is(status: str) -> Callable[[dict[str, Any]], bool]:
    return lambda email: bool(email["status"] == status)


def _events(emails: list[dict[str, Any]], kind: str, domain: str) -> list[dict[str, Any]]:
    return [
        e
        for m in emails
        for e in m["events"]
        if e["event_type"] == kind and e["recipient"].endswith("@" + domain)
    ]


def _report_of(received: ReceivedMessage) -> tuple[EmailMessage, dict[str, Any], str]:
    """The report mail, its JSON report, and its attachment's file name."""
    parsed = email.message_from_bytes(received.data, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    [attachment] = [p for p in parsed.iter_attachments()]
    assert attachment.get_content_type() == tls_rpt.CONTENT_TYPE
    report = json.loads(gzip.decompress(attachment.get_content()))
    return parsed, report, str(attachment.get_filename())


async def test_reports_are_mailed_to_a_mailto_rua_with_what_delivery_recorded_once(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    tls_ca: TlsAuthority,
    clock: trio.testing.MockClock,
    tmp_path: Path,
) -> None:
    sink, policies = await _peers(nursery, dns_server, tls_ca)
    receiver = HttpsReceiver(tls_ca.server_context())
    await nursery.start(receiver.run)
    posted_to = f"{receiver.url}/tlsrpt"
    mailed_to = f"mailto:tls@{REPORTS}"
    dns_server.set(f"_smtp._tls.{GOOD}", "TXT", [f"v=TLSRPTv1;rua={mailed_to},{posted_to}"])
    dns_server.set(f"_smtp._tls.{BAD}", "TXT", [f"v=TLSRPTv1; rua={mailed_to}", "v=spf1 -all"])
    settings = _settings(sink, policies, tls_ca, tmp_path)
    config = harness.test_settings(database_url, dns_server, **settings)
    async with harness.started(nursery, config, clock) as service:
        emails = await _deliver_all(service, dns_server)
        env = _cli_env(database_url, dns_server, settings)
        ran = await _reports_tls(env, YESTERDAY.isoformat())
        assert ran.returncode == 0, ran.stderr
        figures = json.loads(ran.stdout)
        assert figures["sent"] == 2 and figures["without_record"] == 1, ran.stdout
        assert f"{GOOD}: report" in ran.stderr and f"{BAD}: report" in ran.stderr  # progress
        # The mail was queued on the command's (real) clock: the service catches up with it
        # (its retry of the deferral falls on today, outside the report), and hears of it
        # (SQLite has no NOTIFY).
        behind = datetime.now(UTC) - service.running.runtime.clock.now()
        clock.jump(behind.total_seconds() + 60)
        service.running.runtime.wakeups.deliver([f"mail:{REPORTS}"])
        arrived = await sink.wait_for_messages(len(sink.messages) + 2)
        mailed = [m for m in arrived if m.rcpt_to == (f"tls@{REPORTS}",)]
        assert len(mailed) == 2

        reports = {}
        for received in mailed:
            mail, report, filename = _report_of(received)
            domain = str(mail["TLS-Report-Domain"])
            reports[domain] = report
            submitter = str(mail["TLS-Report-Submitter"])
            assert submitter == harness.SMTP_HOST  # the domain of POSTROOM_SYSTEM_FROM
            assert mail.get_content_type() == "multipart/report"
            assert mail.get_param("report-type") == "tlsrpt"
            assert str(mail["Subject"]) == (
                f"Report Domain: {domain} Submitter: {submitter} Report-ID: <{report['report-id']}>"
            )
            assert "DKIM-Signature" in mail  # signed as the service's own mail is
            start = int(datetime.combine(YESTERDAY, time(0), tzinfo=UTC).timestamp())
            assert filename == f"{submitter}!{domain}!{start}!{start + 86399}.json.gz"
            assert report["date-range"] == {
                "start-datetime": f"{YESTERDAY}T00:00:00Z",
                "end-datetime": f"{YESTERDAY}T23:59:59Z",
            }
            assert report["contact-info"] == f"postroom@{harness.SMTP_HOST}"
        assert set(reports) == {GOOD, BAD}  # none for the domain without _smtp._tls

        # The https: rua of GOOD has the same report, POSTed.
        [posted] = await receiver.wait_for_requests(1)
        assert posted.method == "POST" and posted.path == "/tlsrpt"
        assert posted.headers["content-type"] == "application/tlsrpt+gzip"
        assert json.loads(gzip.decompress(posted.body)) == reports[GOOD]
        assert f"{posted_to}: posted 200" in ran.stderr or posted_to in ran.stderr

        [good] = reports[GOOD]["policies"]
        assert good["policy"]["policy-type"] == "sts"
        assert good["policy"]["policy-domain"] == GOOD
        assert f"mx: mx.{GOOD}" in good["policy"]["policy-string"]
        assert good["summary"] == {
            "total-successful-session-count": len(_events(emails, "delivered", GOOD)),
            "total-failure-session-count": 0,
        }
        assert good["summary"]["total-successful-session-count"] == 2
        [bad] = reports[BAD]["policies"]
        deferred = _events(emails, "deferred", BAD)
        assert deferred and all(e["metadata"]["reason"] == "tls_policy" for e in deferred)
        assert bad["summary"] == {
            "total-successful-session-count": 0,
            "total-failure-session-count": len(deferred),
        }
        [detail] = bad["failure-details"]
        assert detail["result-type"] == "certificate-host-mismatch"
        assert detail["receiving-mx-hostname"] == f"mx.{BAD}"
        assert detail["failed-session-count"] == len(deferred)

        # The same day again: everything is settled, nothing is sent.
        again = await _reports_tls(env, YESTERDAY.isoformat())
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout) | {"day": None} == {
            "day": None,
            "domains": 3,
            "sent": 0,
            "without_record": 0,
            "already_sent": 3,
            "left_for_later": 0,
        }
        service.running.runtime.wakeups.deliver([f"mail:{REPORTS}"])
        await service.settled()
        assert len([m for m in sink.messages if m.rcpt_to == (f"tls@{REPORTS}",)]) == 2
        assert len(receiver.requests) == 1


@pytest.mark.parametrize("days_later", [1, 3], ids=["next-day", "after-a-2-day-outage"])
async def test_the_daily_actor_reports_each_day_over_once(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    tls_ca: TlsAuthority,
    clock: trio.testing.MockClock,
    tmp_path: Path,
    days_later: int,
) -> None:
    """The day's report goes at the actor's first round of the next day, or, when no round
    ran for days (the service was stopped), at the first round after: once either way."""
    sink, policies = await _peers(nursery, dns_server, tls_ca)
    dns_server.set(f"_smtp._tls.{GOOD}", "TXT", [f"v=TLSRPTv1; rua=mailto:tls@{REPORTS}"])
    config = harness.test_settings(
        database_url, dns_server, **_settings(sink, policies, tls_ca, tmp_path)
    )
    async with harness.started(nursery, config, clock) as service:
        account = await ready_account(service, dns_server)
        sent = (await account.client.post("/v1/emails/", json=message(f"a@{GOOD}"))).json()
        await wait_for_email(account, sent["id"], _status_is("delivered"))
        before = len(sink.messages)
        clock.jump(days_later * 24 * 3600)  # the actor's next (hourly) round reports it
        arrived = await sink.wait_for_messages(before + 1, timeout=15)
        [received] = [m for m in arrived if m.rcpt_to == (f"tls@{REPORTS}",)]
        _, report, _ = _report_of(received)
        [policy] = report["policies"]
        assert policy["summary"]["total-successful-session-count"] == 1
        assert report["date-range"]["start-datetime"] == f"{YESTERDAY}T00:00:00Z"
        again = await tls_sender.send_day(service.running.runtime, YESTERDAY)
        assert (again.sent, again.already) == (0, 1)


def test_the_command_refuses_a_bad_day_or_one_not_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["reports", "tls", "--day", "2026-13-01"])
    assert exited.value.code == 2
    assert "'2026-13-01' is not a day written YYYY-MM-DD" in capsys.readouterr().err
    # In a child process: the day is checked before the database is opened.
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_")}
    env["POSTROOM_DATABASE_URL"] = f"sqlite:///{tmp_path / 'p.db'}"
    today = datetime.now(UTC).date().isoformat()
    command = [sys.executable, "-m", "postroom", "reports", "tls", "--day", today]
    ran = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2, ran.stderr
    assert (
        ran.stderr.strip()
        == f"postroom: {today} is not over yet (UTC): a report covers a whole day"
    )
    assert not (tmp_path / "p.db").exists()


def test_failed_sessions_are_read_from_what_the_policy_said() -> None:
    response = (
        "tls_policy: mx1.example [192.0.2.1]: TLS handshake with mx1.example: [SSL:"
        " CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate has expired; "
        "tls_policy: mx2.example is not listed by the MTA-STS policy of example; "
        "tls_policy: mx3.example [192.0.2.3] did not start TLS"
    )
    assert [(f.result_type, f.mx_host, f.mx_address) for f in tls_rpt.failures(response)] == [
        ("certificate-expired", "mx1.example", "192.0.2.1"),
        ("validation-failure", "mx2.example", None),
        ("starttls-not-supported", "mx3.example", "192.0.2.3"),
    ]


def test_policies_are_reported_by_their_rfc_type_and_unknown_ones_left_out() -> None:
    day = YESTERDAY
    sessions = [
        Sessions("x.example", True, "opportunistic", "mx.x.example", None, 4),
        Sessions("x.example", True, "none", "mx.x.example", None, 1),
        Sessions("x.example", True, "dane", "mx.x.example", None, 2),
        Sessions("x.example", True, "quantum", "mx.x.example", None, 9),  # not known here
    ]
    report = tls_rpt.build("x.example", day, sessions, None, "mx.postroom.test", "a@b.example")
    assert report is not None
    summaries = {
        p["policy"]["policy-type"]: p["summary"]["total-successful-session-count"]
        for p in report.document["policies"]
    }
    assert summaries == {"no-policy-found": 5, "tlsa": 2}
    only_unknown = [Sessions("x.example", True, "quantum", None, None, 1)]
    assert tls_rpt.build("x.example", day, only_unknown, None, "s.example", "a@b.example") is None


def test_a_delivery_a_testing_policy_let_through_unverified_is_reported_as_a_failure() -> None:
    # MTA-STS `testing` delivers when the certificate check fails; RFC 8460 wants it reported.
    sessions = [
        Sessions("t.example", True, "mta-sts", "mx.t.example", None, 3, verified=True),
        Sessions("t.example", True, "mta-sts", "mx.t.example", None, 2, verified=False),
    ]
    report = tls_rpt.build("t.example", YESTERDAY, sessions, None, "s.example", "a@b.example")
    assert report is not None
    [policy] = report.document["policies"]
    assert policy["summary"] == {
        "total-successful-session-count": 3,
        "total-failure-session-count": 2,
    }
    assert policy["failure-details"] == [
        {
            "result-type": "validation-failure",
            "receiving-mx-hostname": "mx.t.example",
            "failed-session-count": 2,
        }
    ]
