"""Bounded fuzz runs against the running service (issue 14): the URLs of webhooks and
forwards, and every field of a send request that becomes part of a header line.

Every answer is 2xx or a 4xx with the error body, never a 5xx, and each door applies the same
rule: a URL is saved exactly when `engine.platform.outbound_http.url_problem` accepts it, and a send
body is accepted by send and by batch exactly when validate finds it valid. What was accepted
then goes out: every saved webhook's test delivery ends as a recorded attempt, every accepted
email is delivered without a header line its fields did not name, and no actor faults. SVG
uploads are fuzzed in tests/test_bimi_svg.py, every operation of the OpenAPI document in
tests/test_schemathesis.py.
"""

from __future__ import annotations

import copy
import email
import email.policy
import ipaddress
import itertools
import json
import socket
from typing import Any

import httpx
import trio
from hypothesis import strategies as st

from engine.mail.compose import STRUCTURAL_HEADERS
from engine.platform.outbound_http import url_problem
from tests.harness.dns_server import DnsServer
from tests.harness.fuzz import assert_alive_without_faults, assert_answered_cleanly, run_examples
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.inbound import DOMAIN, verified_domain
from tests.harness.sending import SENDER, ready_account, route_mail, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

EXAMPLES = 40
RECIPIENT = "ann@customer.example"


def _json(body: Any) -> dict[str, Any]:
    """A request's JSON body written with ASCII escapes, so every string the fuzzer drew
    (lone surrogates and control characters included) reaches the service as drawn."""
    return {"content": json.dumps(body), "headers": {"Content-Type": "application/json"}}


# -- Webhook and forward URLs --------------------------------------------------------------

# Printable ASCII noise leaves out the delimiters that end a host (/ ? # @ \ :), so a noisy
# URL never names a host the run did not choose; those delimiters get places of their own.
_NOISE = [
    *"\x00\t\n\r\x0b \x7f\x85\u00a0\u2028\u200b\ufeff\ud800éß€\U0001d518",
    *"[]{}<>|^`\"'%!$&()*+,;=~_-.",
    "%0",
    "%2e",
    "%00",
    "%zz",
]
_SCHEMES = ["https://"] * 4 + ["HTTPS://", "http://", "ftp://", "https:/", "https:", "//"]
_USERINFO = [""] * 4 + ["user@", "user:secret@", "@", ":@", "%40@"]
_LOOPBACK_HOSTS = [
    "127.0.0.1",
    "localhost",
    "LOCALHOST",
    "127.0.0.1.",
    "[::1]",
    "[0:0:0:0:0:0:0:1]",
    "[::ffff:127.0.0.1]",
    "[::1%25lo]",
]
_BROKEN_HOSTS = ["", "[::1", "::1", "[127.0.0.1]", "[]", "local host", ".".join(["c" * 63] * 4)]
_LABELS = st.one_of(
    st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True),
    st.sampled_from(
        [
            *["a" * 63, "b" * 64, "-lead", "trail-", "under_score", "xn--bcher-kva", "xn--abc"],
            *["xn--", "bücher", "ÉCOLE", "例え", "a%2eb", "UPPER"],
        ]
    ),
)
# The last label is never a number, so a name is never an IPv4 address in shorthand.
_TOP_LABELS = ["example", "test", "invalid", "xn--p1ai", "EXAMPLE", "example.", "рф", "test.."]
_NAMES = st.builds(
    lambda labels, top: ".".join([*labels, top]),
    st.lists(_LABELS, max_size=4),
    st.sampled_from(_TOP_LABELS),
)
_HOSTS = st.one_of(st.sampled_from(_LOOPBACK_HOSTS), _NAMES, st.sampled_from(_BROKEN_HOSTS))
_ODD_PORTS = ["", ":", ":0", ":1", ":65536", ":99999", ":-1", ":1e3", ":1_0", ": 1", ":٣", ":0x1f"]
_PATHS = [
    *["", "/", "/hook", "/hooks/postroom?token=abc&x=1", "/%7Euser", "/%zz", "/%00"],
    *["/..%2f..%2fetc", "/[x]", "/a|b", "/{x}", "/<x>", "/#frag", "?only=query", "/a b"],
    *["/é", "/\u202e", "/" + "p" * 1500],
]


def _url(scheme: str, userinfo: str, host: str, port: str, path: str) -> str:
    return f"{scheme}{userinfo}{host}{port}{path}"


def _with_noise(url: str, at: int, noise: str) -> str:
    at %= len(url) + 1
    return url[:at] + noise + url[at:]


def target_urls(receiver_port: int) -> st.SearchStrategy[str]:
    """URLs of the receiver as written by someone careful, URLs changed in one or more of
    their parts, and either kind with a character of noise put in anywhere."""
    receiver = [f":{receiver_port}"] * 2 + [f":+{receiver_port}", f":0{receiver_port}"]
    careful = st.builds(
        _url,
        st.just("https://"),
        st.just(""),
        st.sampled_from(["127.0.0.1", "localhost"]),
        st.sampled_from(receiver),
        st.sampled_from(_PATHS),
    )
    changed = st.builds(
        _url,
        st.sampled_from(_SCHEMES),
        st.sampled_from(_USERINFO),
        _HOSTS,
        st.sampled_from(receiver + _ODD_PORTS),
        st.sampled_from(_PATHS),
    )
    noisy = st.builds(
        _with_noise, st.one_of(careful, changed), st.integers(0, 2000), st.sampled_from(_NOISE)
    )
    return st.one_of(careful, changed, noisy)


class LoopbackResolver(trio.abc.HostnameResolver):
    """Answers every name with 127.0.0.1, so a name in a fuzzed URL is looked up nowhere and
    reaches nothing beyond this machine. (Trio asks it for names only: it reads IP literals
    itself, so `reaches_only_loopback` checks those before anything is sent.)"""

    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[Any]:  # of trio's (family, type, proto, canonname, sockaddr) entries
        number = int(port) if port is not None else 0
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", number))]

    async def getnameinfo(self, sockaddr: tuple[Any, ...], flags: int) -> tuple[str, str]:
        raise OSError("no reverse lookups in the fuzz run")


def reaches_only_loopback(url: str) -> bool:
    """Whether a POST to `url` stays on this machine under `LoopbackResolver`: its host is a
    loopback address, written in full or in the shorthand the C library also reads
    ("127.1"), or a name."""
    host = httpx.URL(url).host
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return True
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


async def _first_attempt(account: Account, hook: dict[str, Any]) -> dict[str, Any]:
    """The test delivery of `hook` once it has been tried."""
    with trio.fail_after(20):
        while True:
            page = await account.client.get(f"/v1/webhooks/{hook['id']}/deliveries")
            items = page.json()["items"]
            if items and items[0]["status"] != "pending":
                found = await account.client.get(f"/v1/webhook-deliveries/{items[0]['id']}")
                delivery: dict[str, Any] = found.json()
                return delivery
            await trio.sleep(0.05)


async def test_fuzzed_target_urls_are_saved_exactly_when_the_url_rule_accepts_them(
    service: Service, dns_server: DnsServer, https_receiver: HttpsReceiver
) -> None:
    account = await service.account("business")  # forwards without a plan limit
    domain = await verified_domain(account, dns_server)
    client = account.client
    hook = await client.post(
        "/v1/webhooks/", json={"url": https_receiver.url, "events": ["email.delivered"]}
    )
    forward = await client.post(
        "/v1/forwards/",
        json={
            "source_email": f"base@{DOMAIN}",
            "domain_id": domain["id"],
            "destination_emails": ["me@elsewhere.example"],
        },
    )
    assert hook.status_code == forward.status_code == 201, (hook.text, forward.text)
    hook_path = f"/v1/webhooks/{hook.json()['id']}"
    forward_path = f"/v1/forwards/{forward.json()['id']}"
    sources = itertools.count()

    async def save_everywhere(url: str) -> list[tuple[str, httpx.Response]]:
        """Each way a target URL is saved, and the answer (named by the URL's field)."""
        webhook = {"url": url, "events": ["email.delivered"]}
        targets = {"destination_urls": [url]}
        rule = {"source_email": f"in-{next(sources)}@{DOMAIN}", "domain_id": domain["id"]}
        return [
            ("url", await client.post("/v1/webhooks/", **_json(webhook))),
            ("url", await client.patch(hook_path, **_json({"url": url}))),
            ("destination_urls", await client.post("/v1/forwards/", **_json(rule | targets))),
            ("destination_urls", await client.patch(forward_path, **_json(targets))),
        ]

    def saved_exactly_when_the_rule_accepts(url: str) -> None:
        accepted = url_problem(url) is None
        for field, response in trio.from_thread.run(save_everywhere, url):
            assert_answered_cleanly(response, url)
            if response.is_success:
                assert accepted, (url, response.text)
                saved = response.json()[field]
                assert saved == (url if field == "url" else [url])
            else:
                assert not accepted and response.status_code == 422, (url, response.text)
                assert response.json()["code"] == "validation_error", (url, response.text)

    await run_examples(
        target_urls(https_receiver.port), saved_exactly_when_the_rule_accepts, max_examples=EXAMPLES
    )

    # Every saved webhook now sends its test delivery; names are answered by the loopback
    # resolver, so nothing is looked up or reached outside this machine.
    previous = trio.socket.set_custom_hostname_resolver(LoopbackResolver())
    try:
        hooks = (await client.get("/v1/webhooks/")).json()
        assert len(hooks) > 1
        for saved in hooks:
            assert reaches_only_loopback(saved["url"]), saved["url"]
            assert (await client.post(f"/v1/webhooks/{saved['id']}/test")).status_code == 200
        attempts = [await _first_attempt(account, saved) for saved in hooks]
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
    for attempt in attempts:
        assert attempt["attempt"] == 1, attempt
        assert attempt["status"] in ("delivered", "retrying"), attempt
        if attempt["status"] == "retrying":
            assert attempt["response_body"], attempt  # why it failed is recorded
    delivered = [a for a in attempts if a["status"] == "delivered"]
    assert delivered and len(https_receiver.requests) == len(delivered)
    await assert_alive_without_faults(service)


# -- Header fields of a send request -------------------------------------------------------

# Header text a careful sender might write (however odd), and text no header line can carry.
_FINE_TEXT = [
    *["", " ", "\t", "a\tb", "=?utf-8?q?Hi?=", "=?", "\\", '"quoted, name"', "a;b=c"],
    *["<eve@evil.example>", "eve@evil.example", "Ann (comment)", "%0d%0a", "\ufeff", "\u200b"],
    *["x" * 998, "word " * 250, "é" * 400, "💌" * 100],
]
_BAD_TEXT = [
    *["\n", "\r", "\r\nBcc: eve@evil.example", "X\nBcc: eve@evil.example", "\x00", "\x01"],
    *["\x7f", "\x85", "\u2028", "\u2029", "\ud800", "\udfff", "x" * 999],
]
# Every character a header may hold: no controls but TAB, no line or paragraph separators.
_HEADER_CHARACTERS = st.characters(
    exclude_categories=("Cc", "Cs", "Zl", "Zp"), include_characters="\t"
)
_TEXT = st.one_of(st.text(_HEADER_CHARACTERS, max_size=40), st.sampled_from(_FINE_TEXT))
_ANY_TEXT = st.one_of(st.text(max_size=40), st.sampled_from(_FINE_TEXT + _BAD_TEXT))
_HEADER_NAMES = st.one_of(
    st.sampled_from(["X-Campaign", "X-Entity-Ref-ID", "In-Reply-To", "References", "List-Id"]),
    st.from_regex(r"X-[A-Za-z0-9-]{1,20}", fullmatch=True),
)
_ANY_HEADER_NAMES = st.one_of(
    st.sampled_from(
        [
            *["Subject", "bcc", "X-Postroom-Tags", "Content-Type", "DKIM-Signature", "X-A:B"],
            *["X A", "X-É", "", "X-\r\nBcc", "x" * 80],
        ]
    ),
    st.text(min_size=1, max_size=12),
)
_CONTENT_TYPES = st.one_of(
    st.sampled_from(
        [
            *["text/plain", "text/plain; charset=utf-8", "application/pdf", "text", "/", ";"],
            *['image/png; name="a.png"', "multipart/mixed", "message/rfc822", "a/b/c"],
            *['text/html; charset="é"', "text/plain; name*=utf-8''%E2%82%AC"],
        ]
    ),
    _TEXT,
)
_FILENAMES = st.one_of(
    st.sampled_from(["report.pdf", "ünïcode ✉.txt", "x" * 255, "=?utf-8?q?a?=.txt", 'a"b.txt']),
    st.text(
        st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp"), exclude_characters="/\\"),
        min_size=1,
        max_size=40,
    ),
)
_ANY_FILENAMES = st.one_of(
    st.sampled_from(["../etc/passwd", "a\\b", "a/b", "..", "x" * 256]), _ANY_TEXT
)
_NAME = st.none() | _TEXT


def _mailboxes(address: str) -> st.SearchStrategy[list[dict[str, Any]]]:
    mailbox = st.fixed_dictionaries({"email": st.just(address), "name": _NAME})
    return st.lists(mailbox, min_size=1, max_size=2)


def _attachment(filename: str, content_type: str) -> dict[str, str]:
    return {"filename": filename, "content_base64": "aGk=", "content_type": content_type}


# Send bodies to the routed recipient domain with every header text as a careful sender might
# write it, however odd.
_CAREFUL_BODIES = st.fixed_dictionaries(
    {
        "from_": st.fixed_dictionaries({"email": st.just(SENDER), "name": _NAME}),
        "to": _mailboxes(RECIPIENT),
        "subject": _TEXT,
        "text": st.just("Thanks for your order."),
    },
    optional={
        "cc": _mailboxes("cy@customer.example"),
        "bcc": _mailboxes("bo@customer.example"),
        "reply_to": st.fixed_dictionaries(
            {"email": st.just("help@customer.example"), "name": _NAME}
        ),
        "tags": st.lists(_TEXT, max_size=3),
        "headers": st.dictionaries(_HEADER_NAMES, _TEXT, max_size=3),
        "attachments": st.lists(st.builds(_attachment, _FILENAMES, _CONTENT_TYPES), max_size=2),
    },
)


def _poisoned(body: dict[str, Any], field: str, text: str) -> dict[str, Any]:
    """`body` with `text` in one of its header fields (added when the body has none)."""
    body = copy.deepcopy(body)
    if field == "subject":
        body["subject"] = text
    elif field in ("from_", "reply_to"):
        body.setdefault(field, {"email": "help@customer.example"})["name"] = text
    elif field == "to":
        body["to"][0]["name"] = text
    elif field == "tags":
        body["tags"] = [*body.get("tags", []), text]
    elif field == "header name":
        body["headers"] = {**body.get("headers", {}), text: "spring"}
    elif field == "header value":
        body["headers"] = {**body.get("headers", {}), "X-Campaign": text}
    elif field == "filename":
        body["attachments"] = [*body.get("attachments", []), _attachment(text, "text/plain")]
    else:
        body["attachments"] = [*body.get("attachments", []), _attachment("a.txt", text)]
    return body


_FIELDS_AND_TEXTS = st.one_of(
    st.tuples(
        st.sampled_from(["subject", "from_", "to", "reply_to", "tags", "header value"]),
        _ANY_TEXT,
    ),
    st.tuples(st.just("header name"), _ANY_HEADER_NAMES),
    st.tuples(st.just("filename"), _ANY_FILENAMES),
    st.tuples(st.just("content type"), _ANY_TEXT),
)
# Careful bodies, and careful bodies with any text at all in one header field.
SEND_BODIES = st.one_of(
    _CAREFUL_BODIES,
    st.builds(
        lambda body, field_and_text: _poisoned(body, *field_and_text),
        _CAREFUL_BODIES,
        _FIELDS_AND_TEXTS,
    ),
)


async def test_fuzzed_header_fields_are_refused_alike_or_delivered_and_never_a_5xx(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    post = account.client.post
    # Accepted emails, by Message-ID: (email id, the custom header names they were given).
    accepted: dict[str, tuple[str, set[str]]] = {}

    async def send_everywhere(body: dict[str, Any]) -> list[httpx.Response]:
        return [
            await post("/v1/emails/validate", **_json(body)),
            await post("/v1/emails/", **_json(body)),
            await post("/v1/emails/batch", **_json([body])),
        ]

    def every_door_applies_the_same_rules(body: dict[str, Any]) -> None:
        checked, sent, batch = trio.from_thread.run(send_everywhere, body)
        for response in (checked, sent, batch):
            assert_answered_cleanly(response, body)
        if checked.status_code == 200:
            assert checked.json()["valid"] is (sent.status_code == 202), (body, sent.text)
        else:  # not the shape of a send body at all
            assert checked.status_code == sent.status_code == 422, (body, sent.text)
        if batch.status_code != 202:  # refused as a whole before any entry is read (a NUL)
            assert batch.status_code == sent.status_code == 422, (body, batch.text)
            return
        [entry] = batch.json()
        assert (entry["status"] == "queued") is (sent.status_code == 202), (body, entry)
        names = {name.lower() for name in body.get("headers", {})}
        for result in (sent.json(), entry) if sent.status_code == 202 else ():
            accepted[result["message_id"]] = (result["id"], names)

    await run_examples(SEND_BODIES, every_door_applies_the_same_rules, max_examples=EXAMPLES)

    assert accepted
    for email_id, _ in accepted.values():
        # The sink takes every message, so an accepted email that fails was bad input that
        # should have been refused (a 998-character tag was, until this fuzz found it).
        ended = await wait_for_status(account, email_id)
        why = [(e["event_type"], e["metadata"]) for e in ended["events"]]
        assert ended["status"] == "delivered", (email_id, ended["subject"], why)
    # Nothing in a field added a header line of its own to a delivered message.
    for message in smtp_sink.messages:
        parsed = email.message_from_bytes(message.data, policy=email.policy.default)
        _, given = accepted[parsed["Message-ID"]]
        assert {name.lower() for name in parsed} <= STRUCTURAL_HEADERS | given
    await assert_alive_without_faults(service)
