"""Operational edges of the HTTP door: the API documentation at /docs works offline, from
assets the package ships, and loads nothing from another origin."""

from __future__ import annotations

import re

import pytest

from tests.harness.service import Service

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
