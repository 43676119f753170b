"""A corpus of malformed requests against every API route: each gets a clean 4xx, never a 5xx.

Every refusal must carry the standard error body (`code` and `detail` strings; validation
errors also list `errors` of `{loc, msg}`), and the service must still answer `/healthz`
afterwards. One `postroom serve` process per database engine serves the whole corpus, so the
hundreds of cases stay fast.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from tests.harness.service import POSTGRES_ENV, REPO, SMTP_HOST, ServiceProcess, free_port

MAX_BODY_BYTES = 40 * 1024 * 1024
HUGE = "x" * 1_000_000
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"
CODE_OF_STATUS = {
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
}

Auth = Literal["key", "cookie", "none"]


@dataclass(frozen=True)
class Case:
    """One malformed request and the refusal it must get."""

    name: str
    method: str
    path: str  # `{domain_id}` is replaced by a real domain of the caller
    status: int
    content: bytes | None = None
    headers: dict[str, str | bytes] = field(default_factory=dict)
    auth: Auth = "key"
    code: str | None = None  # default: the usual code of `status`
    filler: int = 0  # a body of this many spaces, built only when the case runs

    def body(self) -> bytes | None:
        return b" " * self.filler if self.filler else self.content

    @property
    def expected_code(self) -> str:
        return self.code or CODE_OF_STATUS[self.status]


@dataclass(frozen=True)
class BodyRoute:
    """A route that takes a JSON body, and what counts as a good and a bad body for it."""

    name: str
    method: str
    path: str
    valid: dict[str, Any]
    text_field: str  # where strings with bad characters go
    wrong_types: list[dict[str, Any]]
    missing: list[dict[str, Any]]
    auth: Auth = "key"


BODY_ROUTES = [
    BodyRoute(
        "api-keys",
        "POST",
        "/v1/api-keys/",
        {"name": "ok"},
        "name",
        wrong_types=[
            {"name": 5},
            {"name": ["a"]},
            {"name": None},
            {"name": {"a": 1}},
            {"name": "ok", "permissions": "send"},
            {"name": "ok", "permissions": [1]},
        ],
        missing=[{}, {"permissions": ["send"]}],
    ),
    BodyRoute(
        "domains",
        "POST",
        "/v1/domains/",
        {"name": "valid-but-unused.example"},
        "name",
        wrong_types=[{"name": 5}, {"name": True}, {"name": []}, {"name": None}],
        missing=[{}, {"domain": "x.example"}],
    ),
    BodyRoute(
        "domain-update",
        "PATCH",
        "/v1/domains/{domain_id}",
        {"open_tracking": True},
        "open_tracking",
        wrong_types=[
            {"open_tracking": "maybe"},
            {"click_tracking": [1]},
            {"open_tracking": {}},
            {"click_tracking": 2},
        ],
        missing=[],  # every field is optional
    ),
    BodyRoute(
        "senders",
        "POST",
        "/v1/senders/",
        {"email": "hello@valid-but-unused.example"},
        "email",
        wrong_types=[{"email": 5}, {"email": ["a@b.example"]}, {"email": "a@b.example", "name": 5}],
        missing=[{}, {"name": "No Address"}],
    ),
    BodyRoute(
        "suppressions",
        "POST",
        "/v1/suppressions/",
        {"email": "someone@valid.example"},
        "email",
        wrong_types=[
            {"email": 5},
            {"email": None},
            {"email": "a@b.example", "reason": 5},
            {"email": "a@b.example", "reason": "because"},
        ],
        missing=[{}, {"reason": "manual"}],
    ),
    BodyRoute(
        "auth-login",
        "POST",
        "/v1/auth/login",
        {"email": "nobody@valid.example", "password": "whatever1"},
        "email",
        wrong_types=[
            {"email": 5, "password": "x"},
            {"email": "a@b.example", "password": 5},
            {"email": ["a@b.example"], "password": ["x"]},
        ],
        missing=[{}, {"email": "a@b.example"}, {"password": "whatever1"}],
        auth="none",
    ),
    BodyRoute(
        "auth-reauth",
        "POST",
        "/v1/auth/reauth",
        {"password": "whatever1"},
        "password",
        wrong_types=[{"password": 5}, {"password": None}, {"password": ["x"]}],
        missing=[{}, {"passwd": "whatever1"}],
        auth="cookie",
    ),
    BodyRoute(
        "smtp-credentials",
        "POST",
        "/v1/smtp-credentials/",
        {"domain_id": UNKNOWN_ID},
        "domain_id",
        wrong_types=[{"domain_id": 5}, {"domain_id": None}, {"domain_id": [UNKNOWN_ID]}],
        missing=[{}, {"domain": UNKNOWN_ID}],
    ),
    BodyRoute(
        "forwards",
        "POST",
        "/v1/forwards/",
        {"source_email": "in@valid.example", "domain_id": UNKNOWN_ID},
        "source_email",
        wrong_types=[
            {"source_email": 5, "domain_id": UNKNOWN_ID},
            {"source_email": "in@valid.example", "domain_id": 5},
            {"source_email": "in@valid.example", "domain_id": UNKNOWN_ID, "destination_urls": 5},
            {
                "source_email": "in@valid.example",
                "domain_id": UNKNOWN_ID,
                "destination_emails": [5],
            },
        ],
        missing=[],  # the spec's Forwards rules answer a missing field with 400 (decisions.md)
    ),
    BodyRoute(
        "contact-lists",
        "POST",
        "/v1/contacts/",
        {"name": "Customers"},
        "name",
        wrong_types=[{"name": 5}, {"name": None}, {"name": "ok", "description": ["x"]}],
        missing=[{}, {"description": "no name"}],
    ),
    BodyRoute(
        "templates",
        "POST",
        "/v1/templates/",
        {"name": "Welcome", "subject": "Hi", "html_body": "<p>Hi</p>"},
        "name",
        wrong_types=[
            {"name": 5, "subject": "Hi", "html_body": "x"},
            {"name": "ok", "subject": ["Hi"], "html_body": "x"},
            {"name": "ok", "subject": "Hi", "html_body": {"a": 1}},
        ],
        missing=[{}],
    ),
    BodyRoute(
        "transfer-initiate",
        "POST",
        "/v1/domains/{domain_id}/transfer",
        {"target_email": "nobody@valid.example"},
        "target_email",
        wrong_types=[
            {"target_email": 5},
            {"target_email": None},
            {"target_email": "nobody@valid.example", "note": 5},
        ],
        missing=[{}, {"note": "no target"}],
    ),
]


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def too_large_case(name: str, method: str, path: str, auth: Auth = "key") -> Case:
    return Case(
        name,
        method,
        path,
        413,
        headers={"Content-Type": "application/json"},
        auth=auth,
        filler=MAX_BODY_BYTES + 1,
    )


def _body_cases(route: BodyRoute) -> list[Case]:
    json_type: dict[str, str | bytes] = {"Content-Type": "application/json"}

    def case(
        name: str, status: int, content: bytes, headers: dict[str, str | bytes] | None = None
    ) -> Case:
        return Case(
            f"{route.name}-{name}",
            route.method,
            route.path,
            status,
            content,
            json_type if headers is None else headers,
            route.auth,
        )

    too_large = too_large_case(
        f"{route.name}-body-over-40MiB", route.method, route.path, route.auth
    )
    content_types = [
        case("text-plain", 415, _json(route.valid), {"Content-Type": "text/plain"}),
        case(
            "form-urlencoded",
            415,
            b"name=x&email=a%40b.example",
            {"Content-Type": "application/x-www-form-urlencoded"},
        ),
        case(
            "multipart",
            415,
            b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n--b--\r\n',
            {"Content-Type": "multipart/form-data; boundary=b"},
        ),
        case("xml", 415, b"<name>x</name>", {"Content-Type": "application/xml"}),
    ]
    field_name = route.text_field
    raw_field = field_name.encode()
    cases = [
        case("invalid-json", 422, b'{"name": '),
        case("lone-brace", 422, b"{"),
        case("trailing-garbage", 422, _json(route.valid) + b" x"),
        case("not-json", 422, b"hello"),
        case("single-quotes", 422, b"{'name': 'x'}"),
        case("json-array", 422, b"[]"),
        case("json-array-of-valid", 422, _json([route.valid])),
        case("json-string", 422, b'"x"'),
        case("json-number", 422, b"42"),
        case("json-null", 422, b"null"),
        case("json-true", 422, b"true"),
        case("empty-body", 422, b""),
        case("whitespace-body", 422, b" \r\n\t "),
        case("deeply-nested", 422, b"[" * 100_000 + b"]" * 100_000),
        case("nul-byte", 422, b'{"' + raw_field + b'": "a\x00b"}'),
        case("nul-escape", 422, b'{"' + raw_field + b'": "a\\u0000b"}'),
        case("non-utf8", 422, b'{"' + raw_field + b'": "\xff\xfe\xfd"}'),
        case("latin-1", 422, b'{"' + raw_field + b'": "caf\xe9"}'),
        case("utf-16", 422, json.dumps(route.valid).encode("utf-16")),
        case("huge-number", 422, b'{"' + raw_field + b'": 1e999999}'),
        case("huge-string", 422, _json({**route.valid, field_name: HUGE})),
        *(case(f"wrong-type-{i}", 422, _json(body)) for i, body in enumerate(route.wrong_types)),
        *(case(f"missing-field-{i}", 422, _json(body)) for i, body in enumerate(route.missing)),
        too_large,
        *content_types,
    ]
    return cases


PLAIN_CASES = [
    # Unknown routes.
    Case("unknown-v1-root", "GET", "/v1", 404),
    Case("unknown-v1-slash", "GET", "/v1/", 404),
    Case("unknown-resource", "GET", "/v1/nope", 404),
    Case("unknown-version", "GET", "/v2/api-keys/", 404),
    Case("unknown-deep-path", "GET", "/v1/api-keys/a/b/c", 404),
    Case("unknown-domain-action", "POST", "/v1/domains/{domain_id}/launch", 404),
    Case("unknown-auth-action", "POST", "/v1/auth/register", 404, auth="none"),
    Case("unknown-audit-subpath", "GET", "/v1/audit-log/export", 404),
    Case("unknown-without-auth", "GET", "/v1/secret-admin", 404, auth="none"),
    Case("unknown-non-utf8-path", "GET", "/v1/%ff%fe", 404),
    # Wrong methods.
    Case("put-api-keys", "PUT", "/v1/api-keys/", 405),
    Case("delete-api-keys-collection", "DELETE", "/v1/api-keys/", 405),
    Case("get-api-key-by-id", "GET", f"/v1/api-keys/{UNKNOWN_ID}", 405),
    Case("patch-api-key", "PATCH", f"/v1/api-keys/{UNKNOWN_ID}", 405),
    Case("trace-api-keys", "TRACE", "/v1/api-keys/", 405),
    Case("put-domains", "PUT", "/v1/domains/", 405),
    Case("delete-domains-collection", "DELETE", "/v1/domains/", 405),
    Case("put-domain", "PUT", "/v1/domains/{domain_id}", 405),
    Case("get-domain-verify", "GET", "/v1/domains/{domain_id}/verify", 405),
    Case("delete-domain-verify", "DELETE", "/v1/domains/{domain_id}/verify", 405),
    Case("patch-senders", "PATCH", "/v1/senders/", 405),
    Case("get-sender-by-id", "GET", f"/v1/senders/{UNKNOWN_ID}", 405),
    Case("put-suppressions", "PUT", "/v1/suppressions/", 405),
    Case("get-suppression-by-email", "GET", "/v1/suppressions/a@b.example", 405),
    Case("post-audit-log", "POST", "/v1/audit-log", 405),
    Case("delete-audit-log", "DELETE", "/v1/audit-log", 405),
    Case("get-login", "GET", "/v1/auth/login", 405, auth="none"),
    Case("put-login", "PUT", "/v1/auth/login", 405, auth="none"),
    Case("get-logout", "GET", "/v1/auth/logout", 405),
    Case("get-reauth", "GET", "/v1/auth/reauth", 405),
    # Ids that are not UUIDs, or name nothing.
    Case("domain-id-not-uuid", "GET", "/v1/domains/not-a-uuid", 404),
    Case("domain-id-too-long", "GET", "/v1/domains/{domain_id}0", 404),
    Case("domain-id-no-dashes", "GET", "/v1/domains/" + UNKNOWN_ID.replace("-", ""), 404),
    Case("domain-id-unknown", "GET", f"/v1/domains/{UNKNOWN_ID}", 404),
    Case("domain-id-unknown-upper", "DELETE", f"/v1/domains/{UNKNOWN_ID.upper()}", 404),
    Case("domain-id-nul", "DELETE", "/v1/domains/%00", 404),
    Case("domain-id-sql", "GET", "/v1/domains/'%20OR%201=1%20--", 404),
    Case(
        "domain-update-unknown-id",
        "PATCH",
        f"/v1/domains/{UNKNOWN_ID}",
        404,
        b'{"open_tracking": true}',
        {"Content-Type": "application/json"},
    ),
    Case("domain-verify-not-uuid", "POST", "/v1/domains/zzz/verify", 404),
    Case("domain-verify-unknown", "POST", f"/v1/domains/{UNKNOWN_ID}/verify", 404),
    Case("api-key-id-number", "DELETE", "/v1/api-keys/123", 404),
    Case("api-key-id-huge", "DELETE", "/v1/api-keys/" + "a" * 5000, 404),
    Case("api-key-id-unknown", "DELETE", f"/v1/api-keys/{UNKNOWN_ID}", 404),
    Case("sender-id-not-uuid", "DELETE", "/v1/senders/zzz", 404),
    Case("sender-id-unknown", "DELETE", f"/v1/senders/{UNKNOWN_ID}", 404),
    Case("suppression-unknown", "DELETE", "/v1/suppressions/nobody@nowhere.example", 404),
    Case("suppression-nul", "DELETE", "/v1/suppressions/%00", 404),
    Case("suppression-huge", "DELETE", "/v1/suppressions/" + "a" * 5000 + "@x.example", 404),
    Case("suppression-non-utf8", "DELETE", "/v1/suppressions/%ff%fe@x.example", 404),
    # Path traversal in ids.
    Case("traversal-domain", "GET", "/v1/domains/..%2f..%2fapi-keys", 404),
    Case("traversal-domain-dots", "GET", "/v1/domains/%2e%2e", 404),
    Case("traversal-domain-suffix", "GET", "/v1/domains/{domain_id}%2f..%2f..%2fapi-keys", 404),
    Case("traversal-api-key", "DELETE", "/v1/api-keys/..%2f..%2fdomains", 404),
    Case("traversal-sender", "DELETE", "/v1/senders/..%2f..%2f..%2fetc%2fpasswd", 404),
    Case("traversal-suppression", "DELETE", "/v1/suppressions/..%2f..%2fapi-keys", 404),
    Case("traversal-suppression-etc", "DELETE", "/v1/suppressions/..%2f..%2fetc%2fpasswd", 404),
    # Odd query strings.
    Case("audit-limit-negative", "GET", "/v1/audit-log?limit=-1", 422),
    Case("audit-limit-zero", "GET", "/v1/audit-log?limit=0", 422),
    Case("audit-limit-exponent", "GET", "/v1/audit-log?limit=1e9", 422),
    Case("audit-limit-hex", "GET", "/v1/audit-log?limit=0x10", 422),
    Case("audit-limit-float", "GET", "/v1/audit-log?limit=1.5", 422),
    Case("audit-limit-huge", "GET", "/v1/audit-log?limit=" + "9" * 40, 422),
    Case("audit-limit-over", "GET", "/v1/audit-log?limit=501", 422),
    Case("audit-limit-empty", "GET", "/v1/audit-log?limit=", 422),
    Case("audit-limit-space", "GET", "/v1/audit-log?limit=%20", 422),
    Case("audit-limit-non-utf8", "GET", "/v1/audit-log?limit=%ff", 422),
    Case("audit-limit-repeated", "GET", "/v1/audit-log?limit=5&limit=6", 422),
    Case("audit-range-repeated", "GET", "/v1/audit-log?range=7d&range=30d", 422),
    Case("audit-category-repeated", "GET", "/v1/audit-log?category=Security&category=Domain", 422),
    Case("audit-range-unknown", "GET", "/v1/audit-log?range=1y", 422),
    Case("audit-range-empty", "GET", "/v1/audit-log?range=", 422),
    Case("audit-category-unknown", "GET", "/v1/audit-log?category=Marketing", 422),
    Case("audit-category-nul", "GET", "/v1/audit-log?category=%00", 422),
    Case("audit-category-huge", "GET", "/v1/audit-log?category=" + "a" * 5000, 422),
    Case("suppressions-page-text", "GET", "/v1/suppressions/?page=abc", 422),
    Case("suppressions-page-negative", "GET", "/v1/suppressions/?page=-1", 422),
    Case("suppressions-page-exponent", "GET", "/v1/suppressions/?page=1e9", 422),
    Case("suppressions-page-huge", "GET", "/v1/suppressions/?page=" + "9" * 40, 422),
    Case("suppressions-page-repeated", "GET", "/v1/suppressions/?page=1&page=2", 422),
    Case("suppressions-limit-zero", "GET", "/v1/suppressions/?limit=0", 422),
    Case("suppressions-limit-negative", "GET", "/v1/suppressions/?limit=-1", 422),
    Case("suppressions-limit-over", "GET", "/v1/suppressions/?limit=101", 422),
    Case("suppressions-limit-exponent", "GET", "/v1/suppressions/?limit=1e9", 422),
    Case("suppressions-q-too-long", "GET", "/v1/suppressions/?q=" + "a" * 321, 422),
    Case("suppressions-q-nul", "GET", "/v1/suppressions/?q=a%00b", 422),
    # Oversized bodies on routes that take none.
    too_large_case("logout-body-over-40MiB", "POST", "/v1/auth/logout", "cookie"),
    too_large_case("domain-verify-body-over-40MiB", "POST", "/v1/domains/{domain_id}/verify"),
    too_large_case("delete-api-key-body-over-40MiB", "DELETE", f"/v1/api-keys/{UNKNOWN_ID}"),
    too_large_case("get-audit-log-body-over-40MiB", "GET", "/v1/audit-log"),
    too_large_case("unknown-route-body-over-40MiB", "POST", "/v1/nope", "none"),
    # Credentials that are malformed, oversized or not ASCII.
    Case("auth-missing", "GET", "/v1/api-keys/", 401, auth="none"),
    Case(
        "auth-non-ascii",
        "GET",
        "/v1/api-keys/",
        401,
        headers={"Authorization": "Bearer svc_k_ключ".encode()},
        auth="none",
    ),
    Case(
        "auth-latin-1",
        "GET",
        "/v1/api-keys/",
        401,
        headers={"Authorization": "Bearer svc_k_caf\xe9".encode("latin-1")},
        auth="none",
    ),
    Case(
        "auth-non-ascii-scheme",
        "GET",
        "/v1/domains/",
        401,
        headers={"Authorization": "Bëarer svc_k_x".encode()},
        auth="none",
    ),
    Case(
        "auth-enormous",
        "GET",
        "/v1/api-keys/",
        401,
        headers={"Authorization": "Bearer svc_k_" + "k" * 12_000},
        auth="none",
    ),
    Case(
        "auth-basic",
        "POST",
        "/v1/api-keys/",
        401,
        b'{"name": "x"}',
        {"Authorization": "Basic dXNlcjpwYXNz", "Content-Type": "application/json"},
        auth="none",
    ),
    Case(
        "auth-bearer-empty",
        "GET",
        "/v1/suppressions/",
        401,
        headers={"Authorization": "Bearer"},
        auth="none",
    ),
    Case(
        "auth-bearer-two-tokens",
        "GET",
        "/v1/audit-log",
        401,
        headers={"Authorization": "Bearer svc_k_a svc_k_b"},
        auth="none",
    ),
    Case(
        "many-junk-headers",
        "GET",
        "/v1/senders/",
        401,
        headers={
            **{f"X-Junk-{i}": "j" * 100 for i in range(100)},
            "Authorization": "Bearer nope",
        },
        auth="none",
    ),
    Case(
        "cookie-garbage",
        "GET",
        "/v1/api-keys/",
        401,
        headers={"Cookie": "postroom_session=garbage"},
        auth="none",
    ),
    Case(
        "cookie-non-ascii",
        "GET",
        "/v1/api-keys/",
        401,
        headers={"Cookie": "postroom_session=jwt-ключ".encode()},
        auth="none",
    ),
    Case(
        "cookie-enormous",
        "GET",
        "/v1/api-keys/",
        401,
        headers={"Cookie": "postroom_session=" + "c" * 12_000},
        auth="none",
    ),
    Case(
        "cookie-workspace-enormous",
        "GET",
        "/v1/api-keys/",
        404,
        headers={"X-Workspace-Id": "w" * 12_000},
        auth="cookie",
    ),
    Case(
        "cookie-workspace-non-ascii",
        "GET",
        "/v1/api-keys/",
        404,
        headers={"X-Workspace-Id": "wörkspace".encode()},
        auth="cookie",
    ),
    Case(
        "cookie-post-without-origin",
        "POST",
        "/v1/api-keys/",
        403,
        b'{"name": "x"}',
        {"Content-Type": "application/json", "Origin": ""},
        auth="cookie",
        code="csrf_failed",
    ),
    Case(
        "cookie-post-non-ascii-origin",
        "POST",
        "/v1/auth/logout",
        403,
        headers={"Origin": "http://pöstroom.test".encode()},
        auth="cookie",
        code="csrf_failed",
    ),
]

CASES = [case for route in BODY_ROUTES for case in _body_cases(route)] + PLAIN_CASES


@dataclass
class Target:
    """The service under test, a workspace in it, and ways to call it."""

    url: str
    api_key: str
    session: str
    domain_id: str
    client: httpx.Client
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _database_url(engine: str, tmp: Path) -> Iterator[str]:
    if engine == "sqlite":
        yield f"sqlite:///{tmp / 'postroom.db'}"
        return
    admin_url = os.environ.get(POSTGRES_ENV)
    if not admin_url:
        pytest.skip(f"PostgreSQL not configured ({POSTGRES_ENV} unset): SQLite only")
    import psycopg

    name = "postroom_test_" + secrets.token_hex(6)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{admin_url.rpartition('/')[0]}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _wait_healthy(proc: ServiceProcess, url: str, log: Path) -> None:
    assert proc.process is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.process.poll() is not None:
            raise RuntimeError(f"postroom serve exited early:\n{log.read_text()}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("postroom serve did not become healthy in 30 s")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    """One `postroom serve` process per engine, with an account, a domain and a session."""
    tmp = tmp_path_factory.mktemp(f"malformed-{request.param}")
    databases = _database_url(request.param, tmp)
    database_url = next(databases)
    api_listen = f"127.0.0.1:{free_port()}"
    url = f"http://{api_listen}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_")}
    env.update(
        {
            "POSTROOM_DATABASE_URL": database_url,
            "POSTROOM_API_LISTEN": api_listen,
            "POSTROOM_SUBMISSION_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_INBOUND_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_SMTP_HOST": SMTP_HOST,
            "POSTROOM_PUBLIC_URL": url,
            "PYTHONPATH": str(REPO),
        }
    )
    proc = ServiceProcess(env, tmp)
    email, password = "malformed@example.org", "correct horse battery staple"
    created = json.loads(
        proc.cli(
            "accounts", "create", "--email", email, "--password", password, "--plan", "business"
        ).stdout
    )
    log = tmp / "serve.log"
    client = httpx.Client(base_url=url, timeout=60.0)
    with log.open("wb") as log_file:
        proc.process = subprocess.Popen(
            [sys.executable, "-m", "postroom", "serve", "--workers", "1"],
            env=env,
            cwd=tmp,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_healthy(proc, url, log)
        key_headers = {"Authorization": f"Bearer {created['api_key']}"}
        domain = client.post(
            "/v1/domains/", json={"name": "malformed.example"}, headers=key_headers
        )
        assert domain.status_code == 201, domain.text
        login = client.post("/v1/auth/login", json={"email": email, "password": password})
        assert login.status_code == 200, login.text
        client.cookies.clear()
        yield Target(
            url,
            created["api_key"],
            login.cookies["postroom_session"],
            domain.json()["id"],
            client,
            log,
        )
    finally:
        client.close()
        proc.stop()
        for _ in databases:
            pass


def _credentials(case: Case, target: Target) -> dict[str, str | bytes]:
    if case.auth == "key":
        return {"Authorization": f"Bearer {target.api_key}"}
    if case.auth == "cookie":
        return {"Cookie": f"postroom_session={target.session}", "Origin": target.url}
    return {}


def assert_clean_refusal(response: httpx.Response, case: Case, target: Target) -> None:
    status = response.status_code
    assert status < 500, f"{case.name}: {status} {response.text[:500]}\n{target.log_tail()}"
    assert 400 <= status < 500, f"{case.name}: accepted with {status}: {response.text[:500]}"
    assert status == case.status, f"{case.name}: {status} {response.text[:500]}"
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body, dict)
    assert isinstance(body.get("code"), str), body
    assert isinstance(body.get("detail"), str), body
    assert body["detail"]
    assert body["code"] == case.expected_code, body
    if body["code"] == "validation_error":
        errors = body.get("errors")
        assert isinstance(errors, list), body
        assert errors, body
        for error in errors:
            assert set(error) == {"loc", "msg"}, error
            assert isinstance(error["loc"], list), error
            assert isinstance(error["msg"], str), error


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_malformed_request_is_refused_cleanly(target: Target, case: Case) -> None:
    headers = [
        (name.encode(), value if isinstance(value, bytes) else value.encode())
        for name, value in {**_credentials(case, target), **case.headers}.items()
    ]
    path = case.path.replace("{domain_id}", target.domain_id)

    response = target.client.request(case.method, path, content=case.body(), headers=headers)

    assert_clean_refusal(response, case, target)
    assert target.client.get("/healthz").status_code == 200


def test_oversized_header_block_is_refused_by_the_http_server(target: Target) -> None:
    """Headers beyond the HTTP server's 16 KiB limit never reach the app.

    Hypercorn answers 431 itself, without the JSON error body, and closes the connection;
    the service carries on.
    """
    response = target.client.get(
        "/v1/api-keys/",
        headers={"Authorization": f"Bearer {target.api_key}", "X-Junk": "j" * 65_536},
    )
    assert response.status_code == 431
    assert target.client.get("/healthz").status_code == 200


EARLY_REFUSALS = [
    ("bad-key", "POST", "/v1/api-keys/", {"Authorization": "Bearer svc_k_wrong"}, 401),
    ("unknown-route", "POST", "/v1/nope", {}, 404),
    ("wrong-method", "PUT", "/v1/api-keys/", {}, 405),
    ("wrong-content-type", "POST", "/v1/api-keys/", {"Content-Type": "text/plain"}, 415),
]


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [refusal[1:] for refusal in EARLY_REFUSALS],
    ids=[refusal[0] for refusal in EARLY_REFUSALS],
)
def test_connection_stays_usable_after_a_refusal_that_skipped_the_body(
    target: Target, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    """A refusal sent before the body has arrived must not strand the client's connection."""
    auth = {"Authorization": f"Bearer {target.api_key}"}
    with httpx.Client(base_url=target.url, timeout=5.0) as client:
        for _ in range(3):
            refused = client.request(
                method, path, content=b" " * 1_000_000, headers={**auth, **headers}
            )
            assert refused.status_code == status
            assert client.get("/healthz").status_code == 200


def test_the_corpus_left_no_trace_of_errors(target: Target) -> None:
    """Nothing above made the service log an unhandled error (runs last in the module)."""
    log = target.log.read_text(errors="replace")
    assert "Traceback" not in log
    assert "unhandled error" not in log
