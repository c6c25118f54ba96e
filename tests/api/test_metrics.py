"""GET /metrics: the call log's counters, in the Prometheus text format, for anyone."""

from __future__ import annotations

import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from gateway.keys import CALL_LOG
from tests.support import Api
from tests.test_proxy import add_server, call, recorder


def scrape(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_count_written_and_dropped_calls(api: Api, db: asyncpg.Connection) -> None:
    owner = await api.signup()
    key = await api.api_key(owner)
    async with recorder() as upstream:
        server_id = await add_server(api, db, owner, upstream.url)
        for i in range(3):
            await api.post(f"/proxy/{server_id}/mcp", json=call("t", i), auth=key, expect=200)
        await api.post(
            "/tool-calls",
            json={"server_id": str(server_id), "tool_name": "t", "status": "success"},
            auth=key,
            expect=201,
        )
        # The queue full (as after a long database outage): the call is answered, not logged.
        api.app[CALL_LOG].max_rows = 0
        await api.post(f"/proxy/{server_id}/mcp", json=call("t", 9), auth=key, expect=200)

    reply = await api.get("/metrics", expect=200)
    assert reply.headers["Content-Type"].startswith("text/plain")
    metrics = scrape(reply.body)
    # The ingested call is committed before its 201; the proxied ones may still be queued.
    stored = await db.fetchval("SELECT count(*) FROM tool_calls")
    assert metrics["mcp_gateway_tool_calls_written_total"] == stored >= 1
    assert (
        metrics["mcp_gateway_tool_calls_written_total"] + metrics["mcp_gateway_call_log_pending"]
        == 4
    )
    assert metrics["mcp_gateway_tool_calls_dropped_total"] == 1
    assert metrics["mcp_gateway_tool_calls_rejected_total"] == 0
    assert metrics["mcp_gateway_call_log_batches_total"] >= 1
