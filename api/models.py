"""Shared pieces of request and response models."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
EmailText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=3, max_length=320)]
# Tags go out in the X-Postroom-Tags header, where a word cannot be folded: 200 characters fit
# any header line (998), as they fit the email log's `tag` filter.
Tag = Annotated[str, StringConstraints(max_length=200)]


class In(BaseModel):
    """Base of request models (bodies and query strings): a field the model does not know is
    refused with a 422 naming it (api/validation.py), never ignored, so a misspelt field is
    never a silent no-op."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _a_time_in_utc(cls, value: Any) -> Any:
        """A time given with an offset must be a time in UTC too, which everything after
        compares and stores it as: 9999-12-31T23:59:59-23:00 is past the calendar's end."""
        if isinstance(value, datetime) and value.tzinfo is not None:
            try:
                value.astimezone(UTC)
            except OverflowError:
                raise ValueError("the time is out of range once in UTC") from None
        return value


class Out(BaseModel):
    """Base of response models: built from engine records by attribute."""

    model_config = ConfigDict(from_attributes=True)


class PageQuery(In):
    page: int = Field(0, ge=0, le=1_000_000)
    limit: int = Field(20, ge=1, le=100)
