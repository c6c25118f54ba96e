"""`serve --workers 2` as a real process tree: one port shared by two workers, state kept
consistent between them through PostgreSQL, background work done once, SIGTERM and SIGKILL.

Each test runs `python -m gateway serve --workers 2` against its own database. To act on one
known worker, a test keeps one keep-alive connection to it (a session limited to one
connection, which must never open a second): /healthz on it says which worker it is, and every
later request on it reaches the same process (tests/helpers/supervised.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.config import Settings
from gateway.ops.supervisor import Report, StartFailed, Supervisor
from tests.helpers.alerting import receiver
from tests.helpers.processes import SECRETS, environment
from tests.helpers.supervised import (
    STARTUP_SECONDS,
    STOP_SECONDS,
    WORKERS,
    Pinned,
    Supervised,
    alive,
    all_listening,
    connect,
    fresh_worker_ids,
    listeners,
    one_per_worker,
    start,
    stop,
    supervised_gateway,
    until,
    until_async,
)
from tests.helpers.upstreams import free_port

ACCEPT = "application/json, text/event-stream"

pytestmark = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="reads /proc to see the workers (Linux only)"
)


@pytest.fixture
async def gateway(database_url: str, tmp_path: Path) -> AsyncIterator[Supervised]:
    """`python -m gateway serve --workers 2` on a free port, ready; stopped by PID at the end
    (the parent with SIGTERM, then anything of its tree still running with SIGKILL)."""
    async with supervised_gateway(database_url, tmp_path) as supervised:
        yield supervised


# A change in one worker reaches the other's in-memory caches by PostgreSQL NOTIFY, a few
# milliseconds after the changing request was answered (up to ~10 ms measured on a loaded
# 2-core machine), so a request sent at once may still be served from the cache. The bound is
# a hang guard, far below the caches' TTL (300 s): only the invalidation can make the other
# worker change its answer.
INVALIDATION_SECONDS = 15.0


async def heard(
    worker: Pinned,
    request: tuple[str, str],
    changed: Callable[[int, Any], bool],
    **kw: Any,
) -> None:
    """Repeat `request` on `worker` until its answer shows the change."""
    deadline = time.monotonic() + INVALIDATION_SECONDS
    stale = 0
    while True:
        status, body = await worker.request(*request, **kw)
        if changed(status, body):
            return
        stale += 1
        assert time.monotonic() < deadline, (
            f"worker {worker.worker} still answers {status} {str(body)[:200]} ({stale} times, "
            f"{INVALIDATION_SECONDS:g} s after the change)"
        )
        await asyncio.sleep(0.005)


# -- arrangements through the API ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Owner:
    headers: dict[str, str]  # bearer token
    workspace: str
    key: str
    key_id: str


async def owner_with_key(worker: Pinned) -> Owner:
    """A new user (bearer headers, workspace) and an API key of their workspace."""
    signup = {
        "email": f"owner-{uuid.uuid4().hex[:8]}@example.com",
        "password": "password123",
        "name": "Owner",
    }
    status, tokens = await worker.request("POST", "/api/v1/auth/signup", json=signup)
    assert status == 201, tokens
    headers = {"Authorization": f"Bearer {tokens['access_token']}"}
    workspace = tokens["workspace"]["id"]
    status, key = await worker.request(
        "POST", f"/api/v1/workspaces/{workspace}/api-keys", json={"name": "k"}, auth=headers
    )
    assert status == 201, key
    return Owner(headers, workspace, key["key"], key["id"])


async def register(worker: Pinned, owner: Owner, url: str) -> str:
    name = f"upstream-{uuid.uuid4().hex[:6]}"
    status, server = await worker.request(
        "POST", "/api/v1/servers", json={"name": name, "url": url}, auth=owner.headers
    )
    assert status == 201, server
    server_id: str = server["id"]
    return server_id


async def proxied_call(worker: Pinned, key: str, server_id: str, text: str) -> None:
    """One tools/call through the proxy, answered by the upstream."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": text}},
    }
    headers = {"Accept": ACCEPT, "MCP-Protocol-Version": "2025-06-18"}
    status, reply = await worker.request(
        "POST", f"/api/v1/proxy/{server_id}/mcp", json=body, auth=key, headers=headers
    )
    assert status == 200, reply
    assert reply["result"]["content"][0]["text"] == text, reply


# -- the tests -------------------------------------------------------------------------------


async def test_the_parent_says_listening_only_once_every_worker_listens(
    database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = environment(DATABASE_URL=database_url, GATEWAY_RUN_WORKERS="false", **SECRETS)
    args = [sys.executable, "-m", "gateway", "serve", "--workers", str(WORKERS)]
    supervised = start([*args, "--port", str(port)], env, tmp_path / "gateway.log", port)
    try:
        await until(
            lambda: "listening on" in supervised.log(), "listening", STARTUP_SECONDS, supervised
        )
        # Every worker listened before the line was written: all of them do now.
        assert listeners(port) == WORKERS, supervised.log()
        [line] = [line for line in supervised.log().splitlines() if "listening on" in line]
        assert line.endswith(
            f"listening on http://127.0.0.1:{port} with {WORKERS} worker processes "
            "(Ctrl+C or SIGTERM stops it)"
        ), line
    finally:
        await asyncio.to_thread(stop, supervised)
    assert supervised.process.returncode == 0, supervised.log()


def _reports_failure(settings: Settings, report: Report) -> None:
    """A worker that cannot start (as when the port is taken)."""
    report("failed", f"worker {settings.worker_id} cannot start")
    raise SystemExit(1)


def _listens(settings: Settings, report: Report) -> None:
    """A worker that listens (it says so) until it is stopped."""
    report("listening", f"http://127.0.0.1:{9000 + settings.worker_id}")
    signal.pause()


def test_a_worker_that_cannot_start_the_first_time_stops_them_all() -> None:
    announced: list[str] = []
    supervisor = Supervisor(Settings(), WORKERS, _reports_failure, announced.append)
    with pytest.raises(StartFailed, match=r"^worker \d cannot start$"):
        supervisor.run()
    assert announced == []
    assert not [pid for pid in supervisor.pids() if alive(pid)]


def test_the_parent_announces_once_when_every_worker_listens() -> None:
    announced: list[str] = []

    def announce(url: str) -> None:
        announced.append(url)
        os.kill(os.getpid(), signal.SIGTERM)  # the parent's handler: stop the workers

    supervisor = Supervisor(Settings(), WORKERS, _listens, announce)
    supervisor.run()
    assert len(announced) == 1 and re.fullmatch(r"http://127\.0\.0\.1:900\d", announced[0])
    assert not [pid for pid in supervisor.pids() if alive(pid)]


async def test_two_workers_share_one_port_and_every_invalidation(
    gateway: Supervised, sdk_json_url: str
) -> None:
    # The kernel spreads new connections over both workers.
    assert await fresh_worker_ids(gateway.url) == {1, 2}

    async with one_per_worker(gateway.url) as workers:
        one, two = workers[1], workers[2]
        for worker in (one, two):
            status, ready = await worker.request("GET", "/readyz")
            assert status == 200, ready
        owner = await owner_with_key(one)
        server_id = await register(one, owner, sdk_json_url)

        # A revoked API key, cached by both workers: refused by the one that revoked it on its
        # very next request, and by the other as soon as the NOTIFY reaches it.
        servers = ("GET", "/api/v1/servers")
        for worker in (one, two):
            status, _ = await worker.request(*servers, auth=owner.key)
            assert status == 200
        status, _ = await one.request(
            "DELETE",
            f"/api/v1/workspaces/{owner.workspace}/api-keys/{owner.key_id}",
            auth=owner.headers,
        )
        assert status == 204
        status, _ = await one.request(*servers, auth=owner.key)
        assert status == 401
        await heard(two, servers, lambda status, _: status == 401, auth=owner.key)

        # The playground's tool list, cached by each worker: one DELETE drops it from both.
        tools = ("GET", f"/api/v1/servers/{server_id}/tools")
        for worker in (one, two):
            for cached in (False, True):
                status, listing = await worker.request(*tools, auth=owner.headers)
                assert status == 200, listing
                assert listing["cached"] is cached, (worker.worker, listing)
        status, _ = await two.request("DELETE", f"{tools[1]}/cache", auth=owner.headers)
        assert status == 204
        status, listing = await two.request(*tools, auth=owner.headers)
        assert (status, listing["cached"]) == (200, False)
        await heard(one, tools, lambda status, body: body["cached"] is False, auth=owner.headers)
    gateway.check_running()


# Every claim of background work, logged by a trigger of the test's own: the row claimed, whether
# it was due when claimed (a claim is an UPDATE that pushes the due time past now()), which
# process claimed it (its application_name), and when its transaction started (a statement
# waiting on a lock has started its transaction, not always its statement: asyncpg's Execute
# message, after the wait, restarts statement_timestamp()).
_CLAIM_LOG = """
CREATE TABLE test_claims (
    seq bigserial PRIMARY KEY,
    kind text NOT NULL,
    id uuid NOT NULL,
    was_due boolean NOT NULL,
    claimer text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
CREATE FUNCTION test_log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_claims (kind, id, was_due, claimer)
    VALUES (TG_TABLE_NAME, NEW.id, (to_jsonb(OLD) ->> TG_ARGV[0])::timestamptz <= now(),
            current_setting('application_name'));
    RETURN NULL;
END $$;
CREATE TRIGGER test_claimed AFTER UPDATE OF next_probe_at ON servers FOR EACH ROW
    WHEN (NEW.next_probe_at > now() AND NEW.next_probe_at IS DISTINCT FROM OLD.next_probe_at)
    EXECUTE FUNCTION test_log_claim('next_probe_at');
CREATE TRIGGER test_claimed AFTER UPDATE OF next_eval_at ON alert_rules FOR EACH ROW
    WHEN (NEW.next_eval_at > now() AND NEW.next_eval_at IS DISTINCT FROM OLD.next_eval_at)
    EXECUTE FUNCTION test_log_claim('next_eval_at');
"""

# Claim statements (the prober's and the alert evaluator's), by the due condition they select on.
_CLAIMING = {"servers": "%next_probe_at <= now()%", "alert_rules": "%next_eval_at <= now()%"}
_WAITING_CLAIMERS = """
SELECT DISTINCT application_name FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1
"""
_CLAIMS_RUNNING_SINCE_BEFORE = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active'
  AND (query LIKE $1 OR query LIKE $2) AND xact_start < $3
"""
WORKER_NAMES = {f"mcp-gateway worker {n}" for n in range(1, WORKERS + 1)}


async def test_probes_and_alert_evaluations_are_claimed_once_across_workers(
    gateway: Supervised, sdk_json_url: str, database_url: str
) -> None:
    db, monitor = await asyncpg.connect(database_url), await asyncpg.connect(database_url)
    try:
        await db.execute(_CLAIM_LOG)
        async with receiver() as hooks, one_per_worker(gateway.url) as workers:
            one = workers[1]
            owner = await owner_with_key(one)
            servers = [await register(one, owner, sdk_json_url) for _ in range(3)]
            # A call on the first server, and a rule per server that holds once it has one.
            call = {"server_id": servers[0], "tool_name": "echo", "status": "success"}
            status, _ = await one.request("POST", "/api/v1/tool-calls", json=call, auth=owner.key)
            assert status == 201
            rules = []
            for server_id in servers:
                rule = {
                    "name": f"calls on {server_id}",
                    "server_id": server_id,
                    "metric": "call_count",
                    "operator": ">=",
                    "threshold": 1,
                    "window_minutes": 60,
                    "webhook_url": hooks.url("/hook"),
                }
                status, created = await one.request(
                    "POST", "/api/v1/alerts/rules", json=rule, auth=owner.headers
                )
                assert status == 201, created
                rules.append(created["id"])
            workspace = uuid.UUID(owner.workspace)

            # The race, forced: with both tables locked, every server and rule is made due
            # while both workers' claims of each kind wait on the lock; then all go at once.
            async with db.transaction():
                await db.execute("LOCK TABLE servers, alert_rules IN EXCLUSIVE MODE")
                await db.execute(
                    "UPDATE servers SET next_probe_at = now() WHERE workspace_id = $1", workspace
                )
                await db.execute(
                    "UPDATE alert_rules SET next_eval_at = now() WHERE workspace_id = $1",
                    workspace,
                )
                before = await db.fetchval("SELECT coalesce(max(seq), 0) FROM test_claims")

                async def both_wait() -> bool:
                    for pattern in _CLAIMING.values():
                        rows = await monitor.fetch(_WAITING_CLAIMERS, pattern)
                        if {row[0] for row in rows} != WORKER_NAMES:
                            return False
                    return True

                await until_async(both_wait, "both workers waiting to claim each kind", gateway)
            released = await monitor.fetchval("SELECT clock_timestamp()")

            async def raced() -> bool:
                running = await monitor.fetchval(
                    _CLAIMS_RUNNING_SINCE_BEFORE, *_CLAIMING.values(), released
                )
                claimed = await monitor.fetchval(
                    "SELECT count(DISTINCT id) FROM test_claims WHERE seq > $1", before
                )
                return bool(running == 0 and claimed == len(servers) + len(rules))

            await until_async(raced, "every server and rule claimed again", gateway)
            claims = await db.fetch("SELECT * FROM test_claims ORDER BY seq")

            # No claim ever took a row that was not due: a second claim of the same due row
            # would have found it pushed into the future by the first.
            not_due = [
                f"{c['kind']} {c['id']} by {c['claimer']}" for c in claims if not c["was_due"]
            ]
            assert claims
            assert not not_due, f"claimed when not due: {not_due}"
            assert {c["claimer"] for c in claims} <= WORKER_NAMES
            # Each server was claimed once since the race (the next is an hour away) ...
            since = [c for c in claims if c["seq"] > before]
            assert sorted(str(c["id"]) for c in since if c["kind"] == "servers") == sorted(servers)
            # ... and no rule twice by the two claims that raced for it.
            racing = Counter(
                str(c["id"])
                for c in since
                if c["kind"] == "alert_rules" and c["claimed_at"] < released
            )
            assert racing and max(racing.values()) == 1, racing

            # Each claim was one probe, stored once.
            probes = Counter(str(c["id"]) for c in claims if c["kind"] == "servers")

            async def stored() -> bool:
                rows = await db.fetch(
                    "SELECT server_id, count(*) FROM health_checks GROUP BY server_id"
                )
                return {str(r[0]): r[1] for r in rows} == probes

            await until_async(stored, "every claimed probe stored", gateway)

            # Evaluated again and again by either worker, the rule with a call fired once and
            # its notification was sent once; the others have no data.
            delivered = await hooks.wait_for("/hook", 1, within=STARTUP_SECONDS)
            assert len(delivered) == 1, delivered
            events = await db.fetch("SELECT rule_id, event_type FROM alert_events")
            assert [(str(e[0]), e[1]) for e in events] == [(rules[0], "FIRING")]
            assert delivered[0].body["event"]["event_type"] == "FIRING"
    finally:
        await db.close()
        await monitor.close()
    gateway.check_running()


async def test_a_killed_worker_is_replaced_and_sigterm_stops_all_after_draining(
    gateway: Supervised, sdk_json_url: str, database_url: str
) -> None:
    first = gateway.worker_pids()
    assert sorted(first) == [1, 2] and len(gateway.started()) == 2

    # SIGKILL one worker: the parent starts another under the same worker id.
    os.kill(first[2], signal.SIGKILL)
    await until(lambda: not alive(first[2]), "the killed worker gone", STOP_SECONDS, gateway)
    await until(
        lambda: gateway.worker_pids()[2] != first[2],
        "a new worker 2 started",
        STARTUP_SECONDS,
        gateway,
    )
    replaced = gateway.worker_pids()
    assert replaced[1] == first[1] and alive(replaced[2])
    await all_listening(gateway)
    assert await fresh_worker_ids(gateway.url) == {1, 2}

    # A proxied call through each worker, answered while its log entry cannot be written yet
    # (the test holds a lock that blocks writes to tool_calls), then SIGTERM to the parent.
    db = await asyncpg.connect(database_url)
    try:
        async with one_per_worker(gateway.url) as workers:
            owner = await owner_with_key(workers[1])
            server_id = await register(workers[1], owner, sdk_json_url)
            logged = "SELECT status FROM tool_calls WHERE server_id = $1"
            async with db.transaction():
                await db.execute("LOCK TABLE tool_calls IN SHARE MODE")
                for worker in workers.values():
                    await proxied_call(worker, owner.key, server_id, f"via {worker.worker}")
                assert await db.fetch(logged, uuid.UUID(server_id)) == []  # still in memory
                gateway.process.send_signal(signal.SIGTERM)
                # Both workers stop listening and go on draining, held up by the lock.
                await until(lambda: listeners(gateway.port) == 0, "workers shut", 30, gateway)
                assert all(alive(pid) for pid in replaced.values()), gateway.log()
            code = await asyncio.to_thread(gateway.process.wait, STOP_SECONDS)
        assert code == 0, gateway.log()
        assert not [pid for pid in replaced.values() if alive(pid)], gateway.log()
        assert "received SIGTERM: stopping 2 workers" in gateway.log()
        # Each worker says what it drains, and the parent when all are done.
        for worker_id in (1, 2):
            assert re.search(
                rf"worker {worker_id} INFO gateway: received SIGTERM: stopping; draining "
                r"\d+ open connections \(\d+ proxied requests in flight\) and \d+ queued",
                gateway.log(),
            ), gateway.log()
        assert gateway.log().rstrip().endswith("mcp-gateway stopped"), gateway.log()
        # Nothing the workers answered was lost: each drained its call log before exiting.
        rows = await db.fetch(logged, uuid.UUID(server_id))
        assert [row["status"] for row in rows] == ["success", "success"]
    finally:
        await db.close()


# -- rate limits across processes ------------------------------------------------------------


LIMIT = 100
ATTEMPTS = 300


async def limited_key(worker: Pinned, owner: Owner) -> str:
    # Per day: a window that does not end during the test (one ending mid-test would double
    # the allowance; at midnight UTC the test may say so).
    status, key = await worker.request(
        "POST",
        f"/api/v1/workspaces/{owner.workspace}/api-keys",
        json={"name": "limited", "rate_limit": f"{LIMIT}/day"},
        auth=owner.headers,
    )
    assert status == 201, key
    raw: str = key["key"]
    return raw


async def admitted(workers: list[Pinned], key: str, server_id: str) -> Counter[int]:
    """Statuses of ATTEMPTS tools/calls sent to the workers in turn."""
    params = {"name": "add", "arguments": {"a": 1, "b": 2}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {"Accept": ACCEPT, "MCP-Protocol-Version": "2025-06-18"}
    statuses: Counter[int] = Counter()
    for attempt in range(ATTEMPTS):
        status, _ = await workers[attempt % len(workers)].request(
            "POST", f"/api/v1/proxy/{server_id}/mcp", json=body, auth=key, headers=headers
        )
        statuses[status] += 1
    return statuses


async def test_a_key_s_rate_limit_holds_across_both_workers_within_ten_percent(
    gateway: Supervised, sdk_json_url: str
) -> None:
    async with one_per_worker(gateway.url) as workers:
        owner = await owner_with_key(workers[1])
        server_id = await register(workers[1], owner, sdk_json_url)
        key = await limited_key(workers[1], owner)
        statuses = await admitted(list(workers.values()), key, server_id)
    assert set(statuses) <= {200, 429}, statuses
    assert LIMIT * 0.9 <= statuses[200] <= LIMIT, statuses


def listening_alone(port: int) -> Callable[[], bool]:
    return lambda: listeners(port) == 1


async def test_a_rate_limit_holds_across_two_gateways_on_one_database(
    database_url: str, tmp_path: Path, sdk_json_url: str
) -> None:
    env = environment(
        DATABASE_URL=database_url,
        GATEWAY_DATA_DIR=str(tmp_path / "data"),
        GATEWAY_AUTH_RATE_LIMIT="10000/minute",
        GATEWAY_DB_ACQUIRE_TIMEOUT_SECONDS="30",
        **SECRETS,
    )
    gateways = []
    try:
        for n in range(2):
            port = free_port()
            args = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1"]
            gateways.append(start([*args, "--port", str(port)], env, tmp_path / f"{n}.log", port))
        for one in gateways:
            await until(listening_alone(one.port), "listening", STARTUP_SECONDS, one)
        first, second = await connect(gateways[0].url), await connect(gateways[1].url)
        try:
            owner = await owner_with_key(first)
            server_id = await register(first, owner, sdk_json_url)
            key = await limited_key(first, owner)
            statuses = await admitted([first, second], key, server_id)
        finally:
            await first.session.close()
            await second.session.close()
    finally:
        for one in gateways:
            await asyncio.to_thread(stop, one)
    assert set(statuses) <= {200, 429}, statuses
    assert LIMIT * 0.9 <= statuses[200] <= LIMIT, statuses
