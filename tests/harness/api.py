"""The API's refusals as tests check them: every error answers with a JSON body of a `code`
and a human `detail`."""

from __future__ import annotations

from typing import Any

import httpx


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    assert isinstance(body["detail"], str)
    return body
