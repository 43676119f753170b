"""Shared pieces of request and response models."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

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


class Out(BaseModel):
    """Base of response models: built from engine records by attribute."""

    model_config = ConfigDict(from_attributes=True)


class PageQuery(In):
    page: int = Field(0, ge=0, le=1_000_000)
    limit: int = Field(20, ge=1, le=100)
