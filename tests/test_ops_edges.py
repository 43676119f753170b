"""Operational edges: the API documentation at /docs works offline, from assets the package
ships, and loads nothing from another origin; start-up says in one line where the console is
and whether the sandbox is on; the install asks pip for no extra the project lacks."""

from __future__ import annotations

import logging
import re
import tomllib

import pytest
import trio

from postroom.service import RunningService, serve
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.service import REPO, Service

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

_ASSET = re.compile(r"""<(?:script|link)\b[^>]*?\b(?:src|href)="([^"]*)\"""")
_CONTENT_TYPES = {".js": "javascript", ".css": "text/css"}


@sqlite_only
async def test_docs_page_loads_only_same_origin_assets_that_are_served(service: Service) -> None:
    client = service.client()
    page = await client.get("/docs")
    assert page.status_code == 200
    assets = _ASSET.findall(page.text)
    # Swagger UI's script and stylesheet, and ours that start it and restyle it
    assert len(assets) == 4
    assert "://" not in page.text  # no CDN, no absolute URL of any kind
    for url in assets:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = await client.get(url)
        assert asset.status_code == 200, url
        kind = _CONTENT_TYPES[url[url.rindex(".") :]]
        assert kind in asset.headers["Content-Type"], (url, asset.headers["Content-Type"])
        if "swagger-ui" in url:
            assert len(asset.content) > 100_000  # the real file, not an error page


@sqlite_only
async def test_documentation_uis_that_would_load_from_a_cdn_are_not_offered(
    service: Service,
) -> None:
    for path in ("/redocs", "/scalar"):
        response = await service.client().get(path)
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"


@sqlite_only
@pytest.mark.parametrize(
    ("sandbox", "said"),
    [
        ("on", "the sandbox is on: new workspaces capture their mail and nothing leaves"),
        ("off", "the sandbox is off: mail is delivered"),
    ],
)
async def test_start_up_says_where_the_console_is_and_whether_the_sandbox_is_on(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    caplog: pytest.LogCaptureFixture,
    sandbox: str,
    said: str,
) -> None:
    settings = harness.test_settings(
        database_url, dns_server, public_url="https://mail.example.net/", sandbox=sandbox
    )
    with caplog.at_level(logging.INFO, logger="postroom"):
        running: RunningService = await nursery.start(serve, settings)
        running.stop()
    [line] = [m for m in caplog.messages if "console" in m]
    assert line.startswith("Open the console at https://mail.example.net/ in a browser; ")
    assert said in line


def test_the_scripts_ask_pip_only_for_extras_the_project_declares() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared = set(pyproject["project"]["optional-dependencies"])
    asked = set()
    for script in (REPO / "scripts").iterdir():
        if script.is_file():
            asked |= set(re.findall(r"^[ \t]*ensure_venv[ \t]+([\w-]+)", script.read_text(), re.M))
    assert "dev" in asked  # scripts/test, scripts/build
    assert asked <= declared, f"pip would warn that {asked - declared} is no extra of postroom"
