"""The engine's errors, grouped by who is to blame.

Front doors translate each into their protocol (an HTTP status and the error body, an SMTP
reply); engine code raises them and never speaks HTTP itself. Each carries a snake_case
`code` for the error body and a human `detail`.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

# Raised by storage (which knows nothing of the engine) for a write the disk has no room for;
# named here too so the front doors find every error they translate in one module.
from storage.errors import StorageFull as StorageFull


class EngineError(Exception):
    """Base of every error a caller can be told about."""

    code = "error"

    def __init__(self, detail: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.extra = extra


class NotFound(EngineError):
    """Raised when a resource does not exist or belongs to another workspace."""

    code = "not_found"


class Unauthorized(EngineError):
    """Raised when credentials are missing, wrong or deactivated."""

    code = "unauthorized"


class Forbidden(EngineError):
    """Raised when the caller is known but may not do this (e.g. a CSRF check failed)."""

    code = "forbidden"


class PlanFeature(Forbidden):
    """Raised when the workspace's plan does not include a feature."""

    code = "plan_feature"


class PlanLimit(Forbidden):
    """Raised when the workspace's plan limit for a resource is reached."""

    code = "plan_limit"


class Conflict(EngineError):
    """Raised when the request clashes with the resource's current state."""

    code = "conflict"


class MarketingStopped(Conflict):
    """Raised for mail that offers unsubscribe from a domain the complaint-rate guard stopped."""

    code = "marketing_stopped"


class InvalidRequest(EngineError):
    """Raised for a request the engine refuses as malformed (HTTP 400)."""

    code = "invalid_request"


class PayloadTooLarge(EngineError):
    """Raised when a part of the request is over its size limit (HTTP 413)."""

    code = "payload_too_large"


class Unprocessable(EngineError):
    """Raised for a well-formed request that fails a rule (HTTP 422)."""

    code = "validation_error"


class Gone(EngineError):
    """Raised when a resource existed but its time is over (HTTP 410), e.g. an expired offer."""

    code = "gone"


class RateLimited(EngineError):
    """Raised when a caller exceeds a rate limit (HTTP 429); `retry_after` is in seconds."""

    code = "rate_limited"

    def __init__(self, detail: str, *, retry_after: int, **extra: Any) -> None:
        super().__init__(detail, retry_after=retry_after, **extra)
        self.retry_after = retry_after


def closest(name: str, known: Sequence[str]) -> str | None:
    """The known name a misspelt `name` most likely meant: one it contains
    (`messages_per_minute` -> `per_minute`), else the nearest spelling, else None."""
    within = [k for k in known if len(k) > 2 and k in name.lower()]
    if within:
        return max(within, key=len)
    found = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_name(kind: str, name: str, known: Sequence[str]) -> str:
    """What to say about an unknown field, argument or token: its name, and the closest
    known name when there is one."""
    guess = closest(name, known)
    hint = f"; did you mean {guess!r}?" if guess else f"; known: {', '.join(known)}"
    return f"unknown {kind} {name!r}{hint}"
