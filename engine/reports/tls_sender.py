"""Sending the SMTP TLS reports of a day (RFC 8460): to each recipient domain the service
delivered to (or tried to) that publishes `_smtp._tls` with a `rua`.

Rule: a day's report for a domain goes out once, whoever runs the day (the daily actor on
any node, or `postroom reports tls --day`) and however often. Before anything is sent the
domain is settled for the day (storage/tls_rpt.py): for a `mailto:` rua in the same unit of
work that stores the report mail (system mail, from POSTROOM_SYSTEM_FROM through normal
delivery, DKIM-signed: engine/transfers/notices.py), so both commit or neither; an `https:`
rua is POSTed after, once, through the client for user-chosen URLs (private networks refused
unless POSTROOM_ALLOW_PRIVATE_TARGETS), and a failed POST is recorded, not tried again. A
domain whose record DNS could not read is left for the next run of the day.

The daily actor reports every `INTERVAL`, by one node at a time (the leadership
`tls_reports`), each day (UTC) over within the last `CATCH_UP` days that is not finished,
oldest first: the day before, and those a service stopped (or every node down) for days did
not report. A day all of whose domains were settled is not looked at again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, timedelta
from urllib.parse import unquote, urlsplit

import trio

from engine.addresses import normalize_email
from engine.domains import tls_rpt as record
from engine.mail.addresses import message_id
from engine.platform import dns, faults, nodes, outbound_http
from engine.platform.errors import EngineError, Unprocessable
from engine.platform.runtime import Runtime
from engine.reports import tls_rpt
from engine.reports.tls_rpt import Report
from engine.sending import intake
from engine.sending.intake import Mailbox, NewEmail
from engine.transfers import notices
from engine.transfers.notices import SystemSender
from storage import mta_sts
from storage import tls_rpt as stored
from storage.tls_rpt import Sessions
from storage.tx import Tx

INTERVAL = timedelta(hours=1)
CATCH_UP = 7  # days back the actor still reports a day not finished (a week's outage)
MAX_TARGETS = 5  # rua URIs of one domain served; a domain chooses them, not the operator
POST_WITHIN = 30.0  # seconds for one POST
LOOKUPS = 16  # `_smtp._tls` records looked up at once
TAG = "tls-report"

log = logging.getLogger("postroom.reports")

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class DayResult:
    day: date
    domains: int  # recipient domains with sessions that day
    sent: int  # reports sent (or handed to delivery) now
    without_record: int  # domains that take no reports
    already: int  # settled by an earlier run
    unsure: int  # DNS could not tell: left for the next run


def check_day(day: date, today: date) -> None:
    """Unprocessable unless `day` is over and still within what is kept of the reports sent."""
    if day >= today:
        raise Unprocessable(f"{day} is not over yet (UTC): a report covers a whole day")
    if day < today - stored.KEEP + timedelta(days=1):
        raise Unprocessable(
            f"{day} is more than {stored.KEEP.days} days ago: what was sent then is no longer"
            " kept, so it could be sent twice"
        )


def parse_day(text: str) -> date:
    """A day written YYYY-MM-DD; Unprocessable saying so otherwise."""
    try:
        if len(text) != 10:
            raise ValueError(text)
        return date.fromisoformat(text)
    except ValueError:
        raise Unprocessable(f"--day {text!r} is not a day written YYYY-MM-DD") from None


def _targets(uris: list[str]) -> tuple[list[str], list[str]]:
    """The mailto: addresses and https: URLs of a rua that can be served."""
    mailto, https = [], []
    for uri in uris[:MAX_TARGETS]:
        if uri.lower().startswith("mailto:"):
            address = unquote(urlsplit(uri).path)
            try:
                mailto.append(normalize_email(address))
            except Unprocessable:
                log.info("TLS report rua %s is no usable address", uri[:100])
        elif outbound_http.url_problem(uri) is None:
            https.append(uri)
        else:
            log.info("TLS report rua %s is no usable URL", uri[:100])
    return mailto, https


async def _ruas(rt: Runtime, domains: list[str]) -> list[list[str] | dns.TemporaryDnsError]:
    """Each domain's rua (or why DNS could not tell), `LOOKUPS` looked up at a time."""
    found: list[list[str] | dns.TemporaryDnsError] = [[] for _ in domains]
    limiter = trio.CapacityLimiter(LOOKUPS)

    async def look_up(index: int) -> None:
        async with limiter:
            try:
                found[index] = await record.rua(rt, domains[index])
            except dns.TemporaryDnsError as exc:
                found[index] = exc

    async with trio.open_nursery() as nursery:
        for index in range(len(domains)):
            nursery.start_soon(look_up, index)
    return found


async def send_day(rt: Runtime, day: date, progress: Progress | None = None) -> DayResult:
    """Send the reports of `day` not sent yet; what was done. Unprocessable for a day not
    over, or older than what is kept of the reports sent (`check_day`)."""
    say = progress or (lambda _: None)
    check_day(day, rt.clock.now().astimezone(UTC).date())
    sessions = await rt.db.read(stored.day_sessions, day)
    by_domain: dict[str, list[Sessions]] = {}
    for each in sessions:
        by_domain.setdefault(each.domain, []).append(each)
    settled = await rt.db.read(stored.settled, day)
    say(f"{day}: {len(by_domain)} recipient domains, {len(settled & set(by_domain))} done before")
    sender: SystemSender | None = None
    sent = without = unsure = 0
    pending = sorted(set(by_domain) - settled)
    for domain, uris in zip(pending, await _ruas(rt, pending), strict=True):
        if isinstance(uris, dns.TemporaryDnsError):
            unsure += 1
            say(f"{domain}: DNS could not answer ({uris}); left for the next run")
            continue
        mailto, https = _targets(uris)
        report = None
        if mailto or https:
            sender = sender or await notices.system_sender(rt)
            # The policy as cached now: the one that applied that day unless it changed since.
            cached = await rt.db.read(mta_sts.get, domain)
            report = tls_rpt.build(
                domain, day, by_domain[domain], cached, sender.domain_name, sender.from_address
            )
        if sender is None or report is None:  # no rua, or only policies not known here
            await rt.db.write(stored.settle, day, domain, None, [], rt.clock.now())
            without += 1
            continue
        try:
            if await _send(rt, sender, report, day, mailto, https, say):
                sent += 1
        except Exception as exc:  # this domain's fault: the others go on
            if not faults.blames_item(exc):
                raise
            rt.faults.item_fault("tls_reports", f"report for {domain} on {day}", exc)
            unsure += 1
    result = DayResult(day, len(by_domain), sent, without, len(settled & set(by_domain)), unsure)
    if not unsure:
        await rt.db.write(stored.finish_day, day, rt.clock.now())
    return result


async def _send(
    rt: Runtime,
    sender: SystemSender,
    report: Report,
    day: date,
    mailto: list[str],
    https: list[str],
    say: Progress,
) -> bool:
    """Settle the domain and send its report; False when another run settled it first."""
    now = rt.clock.now()
    mails = []
    for address in mailto:
        msgid = message_id(sender.domain_name)
        raw = tls_rpt.mail(report, sender.from_address, notices.SYSTEM_NAME, address, msgid, now)
        mails.append(
            NewEmail(
                workspace_id=sender.workspace_id,
                domain_id=sender.domain_id,
                domain_name=sender.domain_name,
                from_email=sender.from_address,
                from_name=notices.SYSTEM_NAME,
                to=(Mailbox(address),),
                subject=report.subject,
                source="system",
                tags=(TAG,),
                raw=raw,
                message_id=msgid,
                envelope=(address,),
            )
        )
    targets = [f"mailto:{a}" for a in mailto] + https

    def settle_and_queue(tx: Tx) -> bool:
        if not stored.settle(tx, day, report.domain, report.report_id, targets, now):
            return False
        if mails:  # the report mail commits with the mark that it was sent
            intake.store(tx, mails, now, volume_shard=None)
        return True

    if not await rt.db.write(settle_and_queue):
        return False
    outcomes = {f"mailto:{a}": "queued" for a in mailto}
    if https:
        client = outbound_http.client(rt, outbound_http.tls_context(rt.extra_ca_file))
        headers = {"Content-Type": tls_rpt.CONTENT_TYPE}
        try:
            for url in https:
                answer = await outbound_http.post(client, url, report.gzipped, headers, POST_WITHIN)
                outcomes[url] = (
                    f"posted {answer.status}"
                    if answer.ok
                    else f"failed: {answer.status or ''} {answer.text[:200]}".replace("  ", " ")
                )
        finally:
            await client.aclose()
    await rt.db.write(stored.record_outcomes, day, report.domain, outcomes)
    say(f"{report.domain}: report {report.report_id} to {', '.join(sorted(outcomes))}")
    for target, outcome in sorted(outcomes.items()):
        log.info("TLS report for %s on %s to %s: %s", report.domain, day, target, outcome)
    return True


@dataclass(frozen=True, slots=True)
class TlsReporterStatistics:
    rounds: int
    sent: int


class TlsReporter:
    """The actor that sends the reports of the days over (see the module's header)."""

    name = "tls_reports"

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._rounds = 0
        self._sent = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._rt.clock.sleep_until(self._rt.clock.now() + INTERVAL)
            if await nodes.lead(self._rt, self.name):
                await self.report()

    async def report(self) -> None:
        """One round: the reports of each of the last `CATCH_UP` days not finished yet,
        oldest first."""
        rt = self._rt
        today = rt.clock.now().astimezone(UTC).date()
        days = [today - timedelta(days=back) for back in range(CATCH_UP, 0, -1)]
        finished = await rt.db.read(stored.finished_days, days[0])
        due = [day for day in days if day not in finished]
        if due:
            self._rounds += 1  # a round that had days to report (the metric counts rounds)
        for day in due:
            if not await self._report_day(day):
                return

    async def _report_day(self, day: date) -> bool:
        """Send `day`'s reports; False when the service cannot send any now (no system
        sender): the later days would say the same, next round tries again."""
        rt = self._rt
        try:
            done = await send_day(rt, day)
        except EngineError as exc:
            log.info("TLS reports of %s not sent: %s", day, exc.detail)
            return False
        except Exception as exc:  # the day's fault: tried again next round
            if not faults.blames_item(exc):
                raise
            rt.faults.item_fault(self.name, f"day {day}", exc)
            return True
        self._sent += done.sent
        return True

    def statistics(self) -> TlsReporterStatistics:
        return TlsReporterStatistics(self._rounds, self._sent)
