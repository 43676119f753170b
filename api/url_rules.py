"""URL rules whose builder functions are compiled once per process, not once per app.

Werkzeug generates and `compile()`s two URL-builder functions for every rule it binds, which
made building the app cost ~0.1 s of CPU, most of it there. A builder depends only on the
rule's text and parts, its defaults and whether unknown arguments are appended, so rules with
the same of those share one. It matters where a process builds several apps: the test suite
builds one per test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from quart.routing import QuartRule


class SharedBuilderRule(QuartRule):
    _builders: ClassVar[dict[tuple[Any, ...], Callable[..., tuple[str, str]]]] = {}

    def _compile_builder(self, append_unknown: bool = True) -> Callable[..., tuple[str, str]]:
        defaults = sorted((name, repr(value)) for name, value in (self.defaults or {}).items())
        trace = tuple(self._trace)
        key = (self.rule, self.host, self.subdomain, trace, tuple(defaults), append_unknown)
        builder = self._builders.get(key)
        if builder is None:
            builder = self._builders[key] = super()._compile_builder(append_unknown)
        return builder
