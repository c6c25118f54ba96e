"""GET /metrics: what every gateway process counts, in the Prometheus text format, for anyone.

Each series carries the process's `worker` label; no workspace or server id is a label unless
GATEWAY_METRICS_PER_SERVER asks for it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from gateway.calllog.records import ToolCall
from gateway.calllog.writer import CALL_LOG
from tests.helpers.alerting import add_rule, deliver, evaluate, ingest, receiver
from tests.helpers.alerting import add_server as register_server
from tests.helpers.api import Api, AppFactory
from tests.helpers.proxying import add_server, arrange, call, logged_calls, recorder, rpc
from tests.helpers.upstreams import unused_url

Sample = tuple[str, dict[str, str], float]


async def scrape(api: Api) -> list[Sample]:
    reply = await api.get("/metrics", expect=200)
    assert reply.headers["Content-Type"].startswith("text/plain")
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(reply.body)
        for sample in family.samples
    ]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum over the samples of `name` whose labels include `labels`."""
    return sum(
        v
        for n, have, v in samples
        if n == name and all(have.get(k) == want for k, want in labels.items())
    )


def labelnames(samples: list[Sample], prefix: str) -> set[str]:
    return {key for name, labels, _ in samples if name.startswith(prefix) for key in labels}


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
        # A call admitted before the queue filled up (as in a long database outage) and
        # answered after: its room was reserved when it was admitted, so it is logged.
        upstream.delay = 0.5
        answered = asyncio.create_task(
            api.post(f"/proxy/{server_id}/mcp", json=call("t", 9), auth=key, expect=200)
        )
        await asyncio.sleep(0.2)
        call_log = api.app[CALL_LOG]
        call_log.max_rows = call_log.workspace_rows = 0
        await answered
        # Calls that come while it is full are refused before they go upstream.
        await api.post(f"/proxy/{server_id}/mcp", json=call("t", 10), auth=key, expect=503)
        # Only a row added without a reservation (none is, but for shutdown) can be dropped.
        stored_row = await db.fetchrow("SELECT * FROM tool_calls LIMIT 1")
        assert stored_row is not None
        call_log.add(ToolCall(**{field: stored_row[field] for field in ToolCall._fields}))
    assert len(upstream.requests) == 4
    await logged_calls(db, 5)  # the four proxied calls, the ingested one

    metrics = await scrape(api)
    assert value(metrics, "mcp_gateway_tool_calls_written_total", worker="0") == 5
    assert value(metrics, "mcp_gateway_call_log_pending") == 0
    assert value(metrics, "mcp_gateway_tool_calls_dropped_total") == 1
    assert value(metrics, "mcp_gateway_tool_calls_rejected_total") == 0
    assert value(metrics, "mcp_gateway_call_log_batches_total") >= 1


async def test_proxied_requests_by_method_class_and_outcome(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api(proxy_timeout_seconds=0.3)
    async with recorder() as ok, recorder(status=500) as failing, recorder(delay=2) as slow:
        good = await arrange(api, db, ok.url)
        await api.post(good.path, json=call("t", 1), auth=good.key, expect=200)
        await api.post(good.path, json=call("t", 2), auth=good.key, expect=200)
        await api.post(good.path, json=rpc("ping"), auth=good.key, expect=200)
        await api.delete(good.path, auth=good.key, expect=405)  # the recorder ends no session
        bad = await arrange(api, db, failing.url)
        await api.post(bad.path, json=call("t"), auth=bad.key, expect=500)
        silent = await arrange(api, db, slow.url)
        await api.post(silent.path, json=call("t"), auth=silent.key, expect=504)
        gone = await arrange(api, db, unused_url())
        await api.post(gone.path, json=rpc("ping"), auth=gone.key, expect=502)

    metrics = await scrape(api)
    requests = "mcp_gateway_proxy_requests_total"
    assert value(metrics, requests, method_class="tools_call", outcome="ok", worker="0") == 2
    assert value(metrics, requests, method_class="request", outcome="ok") == 1
    assert value(metrics, requests, method_class="session_end", outcome="upstream_4xx") == 1
    assert value(metrics, requests, method_class="tools_call", outcome="upstream_5xx") == 1
    assert value(metrics, requests, method_class="tools_call", outcome="timeout") == 1
    assert value(metrics, requests, method_class="request", outcome="unreachable") == 1
    assert value(metrics, requests) == 7
    errors = "mcp_gateway_upstream_errors_total"
    assert value(metrics, errors, kind="http_5xx") == 1
    assert value(metrics, errors, kind="timeout") == 1
    assert value(metrics, errors, kind="unreachable") == 1
    assert value(metrics, errors) == 3

    # Both times, for every exchange the upstream answered (its headers at least).
    for histogram in ("proxy_upstream_seconds", "proxy_gateway_seconds"):
        count = f"mcp_gateway_{histogram}_count"
        assert value(metrics, count, method_class="tools_call") == 3
        assert value(metrics, count, method_class="request") == 1
        assert value(metrics, count, method_class="session_end") == 1
        assert value(metrics, f"mcp_gateway_{histogram}_sum") > 0
        every = value(metrics, f"mcp_gateway_{histogram}_bucket", le="+Inf")
        assert every == value(metrics, count) == 5
    # No tenant's ids in the labels.
    assert labelnames(metrics, "mcp_gateway_proxy") == {"method_class", "outcome", "le", "worker"}


async def test_server_ids_as_labels_only_when_enabled(
    make_api: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_api(metrics_per_server=True)
    async with recorder() as upstream:
        setup = await arrange(api, db, upstream.url)
        await api.post(setup.path, json=call("t"), auth=setup.key, expect=200)
    metrics = await scrape(api)
    requests = "mcp_gateway_proxy_requests_total"
    assert value(metrics, requests, server_id=setup.server_id, outcome="ok") == 1


async def test_probes_by_status_with_durations(api: Api, sdk_json_url: str) -> None:
    owner = await api.signup()
    healthy = await register_server(api, owner, "up", sdk_json_url)
    down = await register_server(api, owner, "down", unused_url())
    for server in (healthy, healthy, down):
        await api.post(f"/servers/{server}/probe", auth=owner, expect=200)

    metrics = await scrape(api)
    assert value(metrics, "mcp_gateway_probes_total", status="healthy") == 2
    assert value(metrics, "mcp_gateway_probes_total", status="down") == 1
    assert value(metrics, "mcp_gateway_probe_seconds_count", status="healthy") == 2
    assert value(metrics, "mcp_gateway_probe_seconds_sum", status="healthy") > 0


async def test_alert_evaluations_and_notifications_by_result(api: Api) -> None:
    owner = await api.signup()
    erring = await register_server(api, owner, "erring")
    fine = await register_server(api, owner, "fine")
    await register_server(api, owner, "idle")
    await ingest(api, owner, erring, [{"status": "error"}])
    await ingest(api, owner, fine, [{"status": "success"}])
    async with receiver() as recv:
        recv.script["/hook"] = [500]  # refused once, then taken
        await add_rule(
            api,
            owner,
            metric="error_rate",
            operator=">",
            threshold=0.5,
            webhook_url=recv.url("/hook"),
        )
        assert await evaluate(api) == 1
        deadline = time.monotonic() + 10
        while len(recv.on("/hook")) < 2 and time.monotonic() < deadline:
            await deliver(api)
            await asyncio.sleep(0.02)

    metrics = await scrape(api)
    evaluations = "mcp_gateway_alert_evaluations_total"
    assert value(metrics, evaluations, result="firing") == 1
    assert value(metrics, evaluations, result="ok") == 1
    assert value(metrics, evaluations, result="no_data") == 1
    attempts = "mcp_gateway_alert_notification_attempts_total"
    assert value(metrics, attempts, result="retry") == 1
    assert value(metrics, attempts, result="delivered") == 1


async def test_cache_hits_and_misses_and_the_pool(api: Api, sdk_json_url: str) -> None:
    owner = await api.signup()
    key = await api.api_key(owner)
    server = await register_server(api, owner, "tools", sdk_json_url)
    for _ in range(2):
        await api.get(f"/servers/{server}/tools", auth=owner, expect=200)
        await api.get("/analytics/volume", auth=key, expect=200)

    metrics = await scrape(api)
    cache = "mcp_gateway_cache_requests_total"
    assert value(metrics, cache, cache="tool_lists", result="miss") == 1
    assert value(metrics, cache, cache="tool_lists", result="hit") == 1
    assert value(metrics, cache, cache="analytics", result="miss") == 1
    assert value(metrics, cache, cache="analytics", result="hit") == 1
    # The key was looked up in the database once, then found in the cache.
    assert value(metrics, cache, cache="api_keys", result="miss") == 1
    assert value(metrics, cache, cache="api_keys", result="hit") == 1

    pool = "mcp_gateway_db_pool_connections"
    assert value(metrics, pool, state="max") == 20
    assert 1 <= value(metrics, pool, state="open") <= 20
    assert value(metrics, "mcp_gateway_db_pool_wait_seconds_count") >= 1


async def test_any_worker_answers_for_all(make_api: AppFactory, tmp_path: Path) -> None:
    """Under `serve --workers N`, whichever worker a scrape reaches shows every worker's
    series, from the snapshots they leave in a shared directory."""
    shared = tmp_path / "metrics"
    shared.mkdir()
    first = await make_api(metrics_dir=shared, worker_id=1)
    second = await make_api(metrics_dir=shared, worker_id=2)
    owner = await second.signup()
    key = await second.api_key(owner)
    await second.get("/analytics/volume", auth=key, expect=200)

    deadline = time.monotonic() + 10
    while True:
        metrics = await scrape(first)
        misses = value(metrics, "mcp_gateway_cache_requests_total", cache="analytics", worker="2")
        if misses == 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert misses == 1
    assert value(metrics, "mcp_gateway_cache_requests_total", cache="analytics", worker="1") == 0
    assert {labels["worker"] for _, labels, _ in metrics} == {"1", "2"}
