"""URL converters: a path id that is not a UUID names nothing, so it is a plain 404."""

from __future__ import annotations

from werkzeug.routing import BaseConverter


class IdConverter(BaseConverter):
    """Matches a UUID in any case and hands it on in lower case."""

    regex = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

    def to_python(self, value: str) -> str:
        return value.lower()
