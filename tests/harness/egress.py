"""Egress sources and pools as an operator sets them up through the admin API: a source
(bind address and EHLO name), a weighted pool of sources, and a pool assigned to a workspace
or domain."""

from __future__ import annotations

from typing import Any

from tests.harness.service import Account

SOURCES = "/v1/admin/egress/sources"
POOLS = "/v1/admin/egress/pools"


async def create_source(admin: Account, name: str, address: str) -> dict[str, Any]:
    body = {"name": name, "bind_address": address, "ehlo_name": f"{name}.out.example.org"}
    created = await admin.client.post(SOURCES, json=body)
    assert created.status_code == 201, created.text
    found: dict[str, Any] = created.json()
    return found


async def create_pool(admin: Account, name: str, *weights: tuple[dict[str, Any], int]) -> str:
    sources = [{"source_id": s["id"], "weight": w} for s, w in weights]
    created = await admin.client.post(POOLS, json={"name": name, "sources": sources})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


async def assign_pool(admin: Account, kind: str, target: str, pool_id: str | None) -> None:
    path = f"/v1/admin/{kind}s/{target}/egress-pool"
    assigned = await admin.client.put(path, json={"pool_id": pool_id})
    assert assigned.status_code == 200, assigned.text
    assert (await admin.client.get(path)).json() == {"pool_id": pool_id}
