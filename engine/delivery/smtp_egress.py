"""The SMTP egress: sends a destination's transfers to its MX hosts over SMTP.

It resolves the destination's MX hosts for each round, then sends the transfers over up to
`Lanes.connections` parallel SMTP connections (as many as the ready queue holds connection
slots for, across every node: storage/destination_slots.py), each reused for message after
message and opportunistically upgraded with STARTTLS (a failed handshake is retried once in
plain text) unless the domain's MTA-STS policy demands verified TLS
(engine/delivery/mta_sts.py: then never plain text, and a host the policy does not allow is
passed over, `tls_policy`) or DANE covers the MX host (engine/delivery/dane.py: TLS matching
its TLSA records or nothing; DANE wins over MTA-STS for the hosts it covers, RFC 8461 2).
A message whose sender set `TLS-Required: No` (RFC 8689 5) that the policies left with no
host is sent once more as if the domain had none (never one submitted with REQUIRETLS).

It alone holds its connections: those still usable after a round are kept for the next one
while one is ready, unless the TLS policies changed meanwhile; when the ready queue gives them
back (`close`) they go to the router's site pool (engine/delivery/site_pool.py), where the next
round of any destination behind the same MX host, from the same source, may take them. Every
attempt's end is reported as a typed outcome to the round's record (engine/delivery/egress.py),
each SMTP transaction's as it ends; before each transaction the record is asked whether one
may start (the node's tenure, a drain, an outage), and a connection sends its next message
only once its last transaction's outcomes are written.

A `Source` (engine/delivery/egress.py) names what the connections are opened from: the EHLO
name and the address they are bound to. `SourcedEgress` holds one `SmtpEgress` per source a
destination's mail leaves from, so connections of different sources are never shared, and a
round never has more connections open than its lanes allow, however many sources it uses.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections import deque
from dataclasses import replace
from functools import partial

import trio

from engine.delivery import dane, mta_sts, mx
from engine.delivery.classify import (
    DnsFailure,
    NoMailService,
    Outcome,
    PrivateTargets,
    Replied,
    SessionRefused,
    Unreachable,
)
from engine.delivery.egress import Lanes, Record, Source, Transfer
from engine.delivery.site_pool import Posture, SitePool, quit_session
from engine.platform import dns as lookups
from engine.platform import outbound_http
from engine.platform.runtime import Runtime
from engine.smtp.errors import PermanentFailure, SmtpError, TlsFailure
from engine.smtp.session import SmtpSession, connect

log = logging.getLogger("postroom.delivery")


def opportunistic_tls() -> ssl.SSLContext:
    """STARTTLS as MTAs use it between each other: encrypt when offered, verify nothing.
    (No CA store is loaded: nothing is verified, and loading it costs ~45 ms per queue.)"""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class SmtpEgress:
    """The SMTP egress of one destination domain, from one source."""

    def __init__(
        self, rt: Runtime, domain: str, tls: ssl.SSLContext, source: Source, sites: SitePool
    ) -> None:
        self._rt = rt
        self.domain = domain
        self._tls = tls
        self._source = source
        self._sites = sites
        self._policies = mta_sts.Policies(rt, domain)
        self._policy: mta_sts.Policy | None = None  # the domain's MTA-STS policy this round
        self._dane: dane.Hosts = {}  # the MX hosts DANE covers this round
        # Sessions kept from one round to the next, and the messages each has carried.
        self._sessions: list[SmtpSession] = []
        self._uses: dict[int, int] = {}

    async def send(self, transfers: list[Transfer], record: Record, lanes: Lanes) -> None:
        """Hand the transfers to `lanes.connections` parallel sessions with the domain's MX,
        each carrying at most `lanes.per_connection` of them. Stopping, the transfers no
        connection started are left as they are: not an attempt. Raises a database outage
        (from the MTA-STS policy's lookup) before anything is sent."""
        rt = self._rt
        failure: Outcome
        try:
            targets = await mx.targets(
                rt.resolver, self.domain, allow_private=rt.allow_private_targets
            )
        except mx.NoMailService as exc:
            failure = NoMailService(str(exc))
        except lookups.TemporaryDnsError as exc:
            failure = DnsFailure(str(exc))
        except mx.PrivateTargets as exc:
            failure = PrivateTargets(str(exc))
        else:
            policy = await self._policies.current()
            covered = await dane.lookup(rt, targets)  # nothing asked with POSTROOM_DNSSEC off
            if policy != self._policy or covered != self._dane:
                self.close()  # kept ones were opened under another policy: for whom it fits
            self._policy, self._dane = policy, covered
            transfers, failure = await self._spread(targets, transfers, record, lanes)
            if record.stopping():
                return
            if isinstance(failure, Unreachable) and failure.tls_policy:
                # RFC 8689 5: mail whose sender set `TLS-Required: No` goes all the same, as
                # if the domain had no TLS policy (never one sent with REQUIRETLS).
                unbound = [
                    t
                    for t in transfers
                    if not t.email.requiretls and t.message.asks_no_tls_policy()
                ]
                if unbound:
                    transfers = [t for t in transfers if all(t is not u for u in unbound)]
                    await self._send_without_policy(targets, unbound, record, lanes)
        for transfer in transfers:
            for recipient in transfer.recipients:
                record.settle(transfer.email, recipient, failure)

    async def _spread(
        self, targets: list[mx.MxTarget], transfers: list[Transfer], record: Record, lanes: Lanes
    ) -> tuple[list[Transfer], Outcome]:
        """Send `transfers` over up to `lanes.connections` connections under the current TLS
        policies; those no connection could take, and why."""
        queue = deque(transfers)
        problems: list[Outcome] = []
        async with trio.open_nursery() as nursery:
            for _ in range(min(lanes.connections, len(transfers))):
                nursery.start_soon(
                    self._connection, targets, queue, record, problems, lanes.per_connection
                )
        failure = _worst(problems)
        if isinstance(failure, Unreachable) and failure.policy is None:
            applied = "opportunistic" if self._policy is None else "mta-sts"
            failure = replace(failure, policy=applied)
        return list(queue), failure

    async def _send_without_policy(
        self, targets: list[mx.MxTarget], transfers: list[Transfer], record: Record, lanes: Lanes
    ) -> None:
        """Send `transfers` with opportunistic TLS, ignoring the domain's MTA-STS policy and
        DANE, on connections of their own: those kept under the policy go to the site pool
        first, and these go there after (their posture says how they were opened), so none
        is ever reused under a policy it was not opened for."""
        policy, covered = self._policy, self._dane
        self.close()
        self._policy, self._dane = None, {}
        try:
            left, failure = await self._spread(targets, transfers, record, lanes)
        finally:
            self.close()
            self._policy, self._dane = policy, covered
        if record.stopping():
            return
        for transfer in left:
            for recipient in transfer.recipients:
                record.settle(transfer.email, recipient, failure)

    async def _connection(
        self,
        targets: list[mx.MxTarget],
        queue: deque[Transfer],
        record: Record,
        problems: list[Outcome],
        per_connection: int | None,
    ) -> None:
        """One SMTP connection, reused for transfer after transfer until the queue is empty
        (a new one after every `per_connection` transfers); one kept from the round before if
        there is one, else a new one. Before each transfer it asks the record whether one may
        start, and after it reports its outcomes (written while it goes on)."""
        session, sent, reused = await self._session(targets)
        if not isinstance(session, SmtpSession):
            problems.append(session)
            return
        mine = 0  # the record's mark of this connection's last transaction
        try:
            while queue:
                if not await record.may_start():
                    return  # the rest is left: for after the stop or outage, or another node
                if per_connection is not None and sent >= per_connection:
                    await quit_session(session)
                    reused, sent = False, 0
                    session = await self._open(targets)
                    if not isinstance(session, SmtpSession):
                        problems.append(session)
                        return
                transfer = queue.popleft()
                addresses = [r.address for r in transfer.recipients]
                try:
                    message = transfer.message
                    data = message.for_hop("SMTPUTF8" in session.extensions)
                    result = await session.send(
                        message.envelope_from,
                        addresses,
                        data,
                        # The message goes only once this connection's last outcome is written.
                        before_message=partial(record.recorded, mine),
                        requiretls=transfer.email.requiretls,  # RFC 8689: verified TLS only
                    )
                except SmtpError as exc:
                    if reused:
                        # A kept connection the server dropped while it waited: the
                        # transfer goes on a new one.
                        queue.appendleft(transfer)
                        await quit_session(session)
                        reused, sent = False, 0
                        session = await self._open(targets)
                        if not isinstance(session, SmtpSession):
                            problems.append(session)
                            return
                        continue
                    # The connection broke: this transfer waits for the next attempt; the
                    # other connections go on with the rest. A 421 that closed it is kept, for
                    # classify to read (a rate limit is a destination incident).
                    broke = Unreachable(str(exc), exc.reply, policy=session.peer.policy)
                    for recipient in transfer.recipients:
                        record.settle(transfer.email, recipient, broke)
                    return
                reused = False
                sent += 1
                peer = session.peer
                replies = [result.outcome_for(r.address) for r in transfer.recipients]
                mine = record.transaction(
                    transfer, [Replied(r, r is result.mail_reply, peer) for r in replies]
                )
        finally:
            if isinstance(session, SmtpSession):
                if session.usable:
                    self._sessions.append(session)
                    self._uses[id(session)] = sent
                else:
                    await quit_session(session)

    async def _session(self, targets: list[mx.MxTarget]) -> tuple[SmtpSession | Outcome, int, bool]:
        """A session for this round's next connection, the transactions it has carried, and
        whether it was kept (the server may have dropped it since): one this egress kept from
        its last round, else an idle one of the site pool to one of the MX hosts (opened from
        this source the way this round would open it), else a new one (or why none could be
        had)."""
        if self._sessions:
            session = self._sessions.pop()
            return session, self._uses.pop(id(session), 0), True
        idle = self._sites.take(self._source, self._postures(targets))
        if idle is not None:
            return *idle, True
        return await self._open(targets), 0, False

    def _postures(self, targets: list[mx.MxTarget]) -> list[tuple[str, Posture]]:
        """The MX hosts whose idle connections this round may take, in MX order, each with
        the TLS postures `_open` could give a new connection to it (none for a host it would
        pass over). Under an MTA-STS policy in testing mode a connection whose certificate did
        not verify (or to a host the policy does not list) is what the delivery went on with:
        it is taken too, after a verified one, so each round does not fail its verification
        and open another."""
        policy, wanted = self._policy, []
        for target in targets:
            covered = self._dane.get(target.host)
            if covered is not None:
                if not isinstance(covered, str):
                    wanted.append((target.host, Posture("dane", True)))
            elif policy is None:
                wanted.append((target.host, Posture("opportunistic", False)))
            else:
                if policy.allows(target.host):
                    wanted.append((target.host, Posture("mta-sts", True)))
                if not policy.enforced:
                    wanted.append((target.host, Posture("mta-sts", False)))
        return wanted

    async def _open(self, targets: list[mx.MxTarget]) -> SmtpSession | Outcome:
        """A session with the first MX host that answers, or why none did.

        Without an MTA-STS policy, a failed TLS handshake is tried once more with the same
        host in plain text (opportunistic TLS, as Postfix's `may` level). Under a policy, a
        host it lists is asked for TLS with its certificate verified for the MX name; in
        `enforce` mode a host it does not list, a failed or refused STARTTLS or an invalid
        certificate passes over the host (`tls_policy`), and in `testing` mode the delivery
        goes on as opportunistic TLS would. A host DANE covers is spoken to only as
        `_open_under_dane` says, whatever the MTA-STS policy. A host refusing the session for
        good is passed over for the next one.
        """
        problems: list[Outcome] = []
        rt, policy = self._rt, self._policy
        enforced = policy is not None and policy.enforced
        applied = "opportunistic" if policy is None else "mta-sts"
        # For hosts a policy lists; loaded only then (the CA store costs ~45 ms of CPU).
        verifying = None if policy is None else outbound_http.tls_context(rt.extra_ca_file)
        for target in targets:
            covered = self._dane.get(target.host)
            if covered is not None:
                opened = await self._open_under_dane(target, covered)
                if isinstance(opened, SmtpSession):
                    return opened
                problems += opened
                continue
            listed = policy is not None and policy.allows(target.host)
            if enforced and not listed:
                unlisted = f"{target.host} is not listed by the MTA-STS policy of {self.domain}"
                problems.append(_refused_by_policy(unlisted, "mta-sts"))
                continue
            for address in self._reachable(target, problems):
                where = f"{target.host} [{address}]"
                tls: ssl.SSLContext | None = verifying if listed else self._tls
                while True:
                    try:
                        session = await connect(
                            address,
                            rt.delivery_port,
                            helo_name=self._source.ehlo_name,
                            local_address=self._source.bind_address,
                            tls=tls,
                            mx_host=target.host,
                            policy=applied,
                        )
                    except TlsFailure as exc:
                        if enforced:
                            problems.append(_refused_by_policy(f"{where}: {exc}", "mta-sts"))
                            break
                        if tls is None:
                            problems.append(Unreachable(f"{where}: {exc}", exc.reply))
                            break
                        if tls is verifying:  # testing mode: noted, and delivered anyway
                            log.info("MTA-STS (testing) check failed with %s: %s", where, exc)
                            tls = self._tls
                            continue
                        log.info("TLS failed with %s, trying again in plain text: %s", where, exc)
                        tls = None
                        continue
                    except SmtpError as exc:
                        problems.append(_failed(where, exc))
                        break
                    if enforced and not session.tls_active:
                        await quit_session(session)
                        problems.append(_refused_by_policy(f"{where} did not start TLS", "mta-sts"))
                        break
                    return session
        return _worst(problems)

    async def _open_under_dane(
        self, target: mx.MxTarget, covered: tuple[dane.Tlsa, ...] | str
    ) -> SmtpSession | list[Outcome]:
        """A session with a host DANE covers, over TLS whose certificates its TLSA records
        accept (`covered`; a string: why the host is passed over), or why there is none. No
        TLS, no match or a failed lookup pass the host over (`tls_policy`), never plain text
        (RFC 7672 2.2)."""
        if isinstance(covered, str):
            return [_refused_by_policy(covered, "dane")]
        rt = self._rt
        problems: list[Outcome] = []

        def check(chain: list[bytes]) -> str | None:
            return dane.check(covered, chain, target.host, rt.clock.now())

        for address in self._reachable(target, problems):
            where = f"{target.host} [{address}]"
            try:
                # The egress's context verifies nothing itself: `check` does, after the handshake.
                session = await connect(
                    address,
                    rt.delivery_port,
                    helo_name=self._source.ehlo_name,
                    local_address=self._source.bind_address,
                    tls=self._tls,
                    mx_host=target.host,
                    policy="dane",
                    check=check,
                )
            except TlsFailure as exc:
                problems.append(_refused_by_policy(f"{where}: {exc}", "dane"))
                continue
            except SmtpError as exc:
                problems.append(_failed(where, exc))
                continue
            if not session.tls_active:
                await quit_session(session)
                problems.append(_refused_by_policy(f"{where} did not start TLS", "dane"))
                continue
            return session
        return problems

    def _reachable(self, target: mx.MxTarget, problems: list[Outcome]) -> list[str]:
        """The host's addresses of the family of the source's bind address (all of them for
        the default source): a socket bound to an IPv6 address cannot reach an IPv4 one, nor
        the reverse. A host with none of them is noted in `problems` as unreachable."""
        bound = self._source.bind_address
        if bound is None:
            return list(target.addresses)
        family = ipaddress.ip_address(bound).version
        reachable = [a for a in target.addresses if ipaddress.ip_address(a).version == family]
        if not reachable:
            problems.append(
                Unreachable(
                    f"{target.host} has no IPv{family} address, and egress source"
                    f" {self._source.ehlo_name} [{bound}] sends over IPv{family} only"
                )
            )
        return reachable

    async def quit_kept(self) -> None:
        """End the sessions kept for a next round, with QUIT."""
        sessions, self._sessions = self._sessions, []
        self._uses.clear()
        for session in sessions:
            await quit_session(session)

    def close(self) -> None:
        """Give the sessions kept for a next round to the site pool (their outcomes are
        written: the ready queue closes only then)."""
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            self._sites.put(self._source, session, self._uses.pop(id(session), 0))
        self._uses.clear()

    async def abandon(self) -> None:
        """Stopping: close the kept sessions without waiting on QUIT (at most a second)."""
        sessions, self._sessions = self._sessions, []
        self._uses.clear()
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            for session in sessions:
                await session.aclose()


def _failed(where: str, exc: SmtpError) -> Outcome:
    """A host that could not be had: it refused the session (5xx greeting or EHLO), or it
    could not be reached or answered 4xx."""
    if isinstance(exc, PermanentFailure):
        return SessionRefused(f"{where}: {exc}", exc.reply)
    return Unreachable(f"{where}: {exc}", exc.reply)


def _refused_by_policy(detail: str, policy: str) -> Unreachable:
    """A host passed over because the TLS `policy` (mta-sts, dane) forbids the session."""
    return Unreachable(f"tls_policy: {detail}", policy=policy, tls_policy=True)


def _worst(problems: list[Outcome]) -> Outcome:
    """What the recipients of transfers no connection could take are told: a refusal only
    when every host refused us for good, else the reasons none could be reached (and whether
    the TLS policy passed over any of them, and which: the first that did)."""
    if problems and all(isinstance(p, SessionRefused) for p in problems):
        return problems[0]
    reasons = [p.detail for p in problems if isinstance(p, Unreachable | SessionRefused)]
    passed_over = [p for p in problems if isinstance(p, Unreachable) and p.tls_policy]
    detail = "; ".join(dict.fromkeys(reasons)) or "no MX host to try"
    policy = passed_over[0].policy if passed_over else None
    return Unreachable(detail, policy=policy, tls_policy=bool(passed_over))


class SourcedEgress:
    """The SMTP egress of one destination: one `SmtpEgress` per egress source, made when mail
    first leaves from it; a round's connections are dealt out among the sources it uses."""

    def __init__(
        self, rt: Runtime, domain: str, tls: ssl.SSLContext, default: Source, sites: SitePool
    ) -> None:
        self._rt = rt
        self.domain = domain
        self._tls = tls
        self._default = default
        self._sites = sites
        self._egresses: dict[Source, SmtpEgress] = {}

    async def send(self, transfers: list[Transfer], record: Record, lanes: Lanes) -> None:
        """Send each source's transfers over connections of its own, never more connections
        at once than `lanes.connections`."""
        by_source: dict[Source, list[Transfer]] = {}
        for transfer in transfers:
            by_source.setdefault(transfer.source or self._default, []).append(transfer)
        if len(by_source) == 1:  # the usual round: one source, no task of its own
            [(source, batch)] = by_source.items()
            await self._egress(source).send(batch, record, lanes)
            return
        if len(by_source) > lanes.connections:
            # More sources than connections: one connection each, as many sources at a time
            # as there are connections (the others wait for one to finish).
            one = replace(lanes, connections=1)
            turns = trio.CapacityLimiter(lanes.connections)

            async def in_turn(source: Source, batch: list[Transfer]) -> None:
                async with turns:
                    egress = self._egress(source)
                    await egress.send(batch, record, one)
                    await egress.quit_kept()  # ended before the next source's opens

            async with trio.open_nursery() as nursery:
                for source, batch in by_source.items():
                    nursery.start_soon(in_turn, source, batch)
            return
        shares = _shares(lanes.connections, [len(batch) for batch in by_source.values()])
        async with trio.open_nursery() as nursery:
            for (source, batch), connections in zip(by_source.items(), shares, strict=True):
                share = replace(lanes, connections=connections)
                nursery.start_soon(self._egress(source).send, batch, record, share)

    def _egress(self, source: Source) -> SmtpEgress:
        egress = self._egresses.get(source)
        if egress is None:
            egress = SmtpEgress(self._rt, self.domain, self._tls, source, self._sites)
            self._egresses[source] = egress
        return egress

    def close(self) -> None:
        """Give the connections kept for a next round to the site pool."""
        for egress in self._egresses.values():
            egress.close()

    async def abandon(self) -> None:
        for egress in self._egresses.values():
            await egress.abandon()


def _shares(connections: int, sizes: list[int]) -> list[int]:
    """The connections each source's batch opens when there are no more sources than
    connections: `connections` dealt out in turn, each at least one (a source never waits
    for another's), none more than it has transfers."""
    counts = [1] * len(sizes)
    spare = connections - len(sizes)
    while spare > 0 and any(c < n for c, n in zip(counts, sizes, strict=True)):
        for i, n in enumerate(sizes):
            if spare > 0 and counts[i] < n:
                counts[i] += 1
                spare -= 1
    return counts
