"""/metrics as tests read it: every sample by name and sorted labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.harness.service import Service


async def scrape(service: Service) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on /metrics, by name and sorted labels."""
    response = await service.client().get("/metrics")
    assert response.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
