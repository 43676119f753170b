"""The two clients: `Postroom` (blocking) and `AsyncPostroom` (any async library httpx
supports), over one description of each call (`_Call`), so they never drift apart.

Thin on purpose: bodies and answers are the JSON the API documents (/openapi.json), as
dicts; what this adds is authentication, the Idempotency-Key header, and one exception
for every error answer (the API's error body: `code`, `detail`, extra keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

DEFAULT_TIMEOUT = 30.0


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
    return {} if key is None else {"Idempotency-Key": key}


class _Calls:
    """The API's operations as calls; each client runs them its own way."""

    @staticmethod
    def send_email(email: dict[str, Any], idempotency_key: str | None) -> _Call:
        return _Call("POST", "/v1/emails/", email, headers=_idempotent(idempotency_key))

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
        self, base_url: str, api_key: str, *, timeout: float = DEFAULT_TIMEOUT, **httpx_args: Any
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, **httpx_args
        )

    def _run(self, call: _Call) -> Any:
        response = self._http.request(
            call.method, call.path, json=call.json, params=call.params, headers=call.headers
        )
        return _answer(response)

    def request(self, method: str, path: str, json: Any = None, **params: Any) -> Any:
        """Any operation: the decoded answer, or PostroomError."""
        return self._run(_Call(method, path, json, params or None))

    def send_email(self, email: dict[str, Any], idempotency_key: str | None = None) -> Any:
        return self._run(_Calls.send_email(email, idempotency_key))

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
        self, base_url: str, api_key: str, *, timeout: float = DEFAULT_TIMEOUT, **httpx_args: Any
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, **httpx_args
        )

    async def _run(self, call: _Call) -> Any:
        response = await self._http.request(
            call.method, call.path, json=call.json, params=call.params, headers=call.headers
        )
        return _answer(response)

    async def request(self, method: str, path: str, json: Any = None, **params: Any) -> Any:
        """Any operation: the decoded answer, or PostroomError."""
        return await self._run(_Call(method, path, json, params or None))

    async def send_email(self, email: dict[str, Any], idempotency_key: str | None = None) -> Any:
        return await self._run(_Calls.send_email(email, idempotency_key))

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
