"""Log lines on stderr: one JSON object per line (the default) or plain text for a terminal.

A JSON line holds `ts` (RFC 3339 UTC), `level`, `logger`, `message`, and the record's context
(`log.info("...", extra={"domain": d})`) as further keys. Secrets never reach a line: code
does not log them, and as a second guard context keys that name a secret are replaced by
"[redacted]" and anything shaped like an API key or a JWT is masked in every value. The
HTTP client's request log is silenced, since webhook URLs can carry tokens in their query.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

from storage.backlog import Backlog

REDACTED = "[redacted]"
_SECRET_KEYS = re.compile(r"pass(word)?|secret|token|api_?key|authorization|cookie", re.I)
# API keys (svc_k_...), JWTs (session cookies), and SMTP credential passwords if ever echoed.
_SECRET_VALUES = re.compile(r"svc_k_[\w-]+|eyJ[\w-]+\.[\w-]+\.[\w-]*")
# Attributes every LogRecord has; anything else on a record is context from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
# Request lines can carry secrets in URLs, and are noise (httpx2: the MCP SDK's client, whose
# every request `postroom mcp --stdio` would log).
QUIET = ("httpx", "httpcore", "httpx2", "httpcore2", "hpack")


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return _SECRET_VALUES.sub(REDACTED, value)
    if isinstance(value, int | float | bool) or value is None:
        return value
    return _SECRET_VALUES.sub(REDACTED, str(value))


def context(record: logging.LogRecord) -> dict[str, Any]:
    """The record's `extra=` fields, secrets redacted."""
    return {
        key: REDACTED if _SECRET_KEYS.search(key) else _scrub(value)
        for key, value in vars(record).items()
        if key not in _STANDARD and not key.startswith("_")
    }


def _timestamp(created: float) -> str:
    at = datetime.fromtimestamp(created, UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _scrub(record.getMessage()),
        }
        for key, value in context(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exc"] = _scrub(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = _scrub(super().format(record))
        pairs = " ".join(f"{key}={value}" for key, value in context(record).items())
        return f"{text} {pairs}" if pairs else str(text)


def configure(log_format: str) -> None:
    """Send every logger's records at INFO and above to stderr in `log_format` (json|text)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)


def log_left_behind(log: logging.Logger, left: Backlog) -> None:
    """The shutdown line: what waits in the database for the next start."""
    counts = {
        "scheduled_emails": left.emails.get("scheduled", 0),
        "queued_emails": left.emails.get("queued", 0),
        "deferred_emails": left.emails.get("deferred", 0),
        "pending_webhook_deliveries": sum(left.webhook_deliveries.values()),
    }
    log.info(
        "stopped cleanly; left for the next start: %(queued_emails)d queued, "
        "%(deferred_emails)d deferred and %(scheduled_emails)d scheduled emails, "
        "%(pending_webhook_deliveries)d webhook deliveries",
        counts,
        extra=counts,
    )
