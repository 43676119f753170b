"""The two clients: `Postroom` (blocking) and `AsyncPostroom` (any async library httpx
supports), over one description of each call (`_Call`), so they never drift apart.

Thin on purpose: bodies and answers are the JSON the API documents (/openapi.json), as
dicts; what this adds is authentication, the Idempotency-Key header, and one exception
for every error answer (the API's error body: `code`, `detail`, extra keys).

Sends (one email, a batch) always carry an Idempotency-Key, a random one unless the caller
gives theirs: a send whose answer was lost (a time-out, a dropped connection, a 503 while the
database restarts) may have been committed and delivered, and only the same key makes trying
again safe. The client does try again itself, with the same key, up to `retries` times,
after the answer's Retry-After (at most `MAX_RETRY_WAIT`); then the error is raised.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import httpx

DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRIES = 2  # further tries of a send whose answer was lost or was 503
RETRY_WAIT = 1.0  # seconds before trying again when the answer gave no Retry-After
MAX_RETRY_WAIT = 10.0


class PostroomError(Exception):
    """The API answered an error: `status`, and its error body's `code` and `detail`."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.code = str(body.get("code", "error"))
        self.detail = str(body.get("detail", ""))
        self.body = body
        super().__init__(f"{status} {self.code}: {self.detail}")


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    retried: bool = False  # safe to send again: it carries an Idempotency-Key


def _retry_wait(response: httpx.Response | None) -> float | None:
    """Seconds to wait before sending a keyed call again after `response` (None: the
    answer was lost), or None when it must not be sent again."""
    if response is None:
        return RETRY_WAIT
    if response.status_code != 503:
        return None
    try:
        return min(float(response.headers.get("Retry-After", RETRY_WAIT)), MAX_RETRY_WAIT)
    except ValueError:
        return RETRY_WAIT


def _answer(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {"code": "error", "detail": response.text}
        raise PostroomError(response.status_code, body if isinstance(body, dict) else {})
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


def _idempotent(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key if key is not None else str(uuid.uuid4())}


class _Calls:
    """The API's operations as calls; each client runs them its own way."""

    @staticmethod
    def send_email(email: dict[str, Any], idempotency_key: str | None) -> _Call:
        headers = _idempotent(idempotency_key)
        return _Call("POST", "/v1/emails/", email, headers=headers, retried=True)

    @staticmethod
    def send_batch(emails: list[dict[str, Any]], idempotency_key: str | None) -> _Call:
        headers = _idempotent(idempotency_key)
        return _Call("POST", "/v1/emails/batch", emails, headers=headers, retried=True)

    @staticmethod
    def get_email(email_id: str) -> _Call:
        return _Call("GET", f"/v1/emails/{email_id}")

    @staticmethod
    def list_emails(**filters: Any) -> _Call:
        return _Call("GET", "/v1/emails/", params=filters or None)

    @staticmethod
    def replay_webhook(webhook_id: str, **filters: Any) -> _Call:
        return _Call("POST", f"/v1/webhooks/{webhook_id}/replay", filters)

    @staticmethod
    def erase(email: str) -> _Call:
        return _Call("POST", "/v1/privacy/erase", {"email": email})


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "User-Agent": "postroom-client/0.1"}


class Postroom:
    """The blocking client. Any operation not wrapped here: `request(method, path, ...)`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        **httpx_args: Any,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, **httpx_args
        )
        self._retries = retries

    def _run(self, call: _Call) -> Any:
        tries = 1 + (self._retries if call.retried else 0)
        for attempt in range(1, tries + 1):
            try:
                response = self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError:
                if attempt == tries:
                    raise
                time.sleep(RETRY_WAIT)
                continue
            wait = _retry_wait(response)
            if wait is None or attempt == tries:
                return _answer(response)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, json: Any = None, **params: Any) -> Any:
        """Any operation: the decoded answer, or PostroomError."""
        return self._run(_Call(method, path, json, params or None))

    def send_email(self, email: dict[str, Any], idempotency_key: str | None = None) -> Any:
        """Send one email (the key defaults to a random one, kept across retries)."""
        return self._run(_Calls.send_email(email, idempotency_key))

    def send_batch(self, emails: list[dict[str, Any]], idempotency_key: str | None = None) -> Any:
        """Send a batch (POST /v1/emails/batch), keyed like `send_email`."""
        return self._run(_Calls.send_batch(emails, idempotency_key))

    def get_email(self, email_id: str) -> Any:
        return self._run(_Calls.get_email(email_id))

    def list_emails(self, **filters: Any) -> Any:
        return self._run(_Calls.list_emails(**filters))

    def replay_webhook(self, webhook_id: str, **filters: Any) -> Any:
        return self._run(_Calls.replay_webhook(webhook_id, **filters))

    def erase(self, email: str) -> Any:
        return self._run(_Calls.erase(email))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Postroom:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncPostroom:
    """The async client (asyncio or Trio, as httpx supports both)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        **httpx_args: Any,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, **httpx_args
        )
        self._retries = retries

    async def _run(self, call: _Call) -> Any:
        tries = 1 + (self._retries if call.retried else 0)
        for attempt in range(1, tries + 1):
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError:
                if attempt == tries:
                    raise
                await anyio.sleep(RETRY_WAIT)  # anyio: under asyncio or Trio alike
                continue
            wait = _retry_wait(response)
            if wait is None or attempt == tries:
                return _answer(response)
            await anyio.sleep(wait)
        raise AssertionError("unreachable")

    async def request(self, method: str, path: str, json: Any = None, **params: Any) -> Any:
        """Any operation: the decoded answer, or PostroomError."""
        return await self._run(_Call(method, path, json, params or None))

    async def send_email(self, email: dict[str, Any], idempotency_key: str | None = None) -> Any:
        """Send one email (the key defaults to a random one, kept across retries)."""
        return await self._run(_Calls.send_email(email, idempotency_key))

    async def send_batch(
        self, emails: list[dict[str, Any]], idempotency_key: str | None = None
    ) -> Any:
        """Send a batch (POST /v1/emails/batch), keyed like `send_email`."""
        return await self._run(_Calls.send_batch(emails, idempotency_key))

    async def get_email(self, email_id: str) -> Any:
        return await self._run(_Calls.get_email(email_id))

    async def list_emails(self, **filters: Any) -> Any:
        return await self._run(_Calls.list_emails(**filters))

    async def replay_webhook(self, webhook_id: str, **filters: Any) -> Any:
        return await self._run(_Calls.replay_webhook(webhook_id, **filters))

    async def erase(self, email: str) -> Any:
        return await self._run(_Calls.erase(email))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncPostroom:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
