"""The mixed profile: agents through the proxy, ingestion, REST reads and dashboard pages.

    BENCH_API_KEY=mcpg_... BENCH_SERVER_ID=<uuid> BENCH_EMAIL=... BENCH_PASSWORD=... \
        locust -f bench/locustfile.py --host http://127.0.0.1:8080 --headless -u 40 -r 10 -t 1m

bench/soak.py starts everything and runs this for ten minutes, checking memory and the log;
bench/proxy.py and bench/ingest.py are the reproducible throughput measurements. Agents call a
stateless JSON upstream. Only point it at 127.0.0.1 or at a test host of your own.
"""

from __future__ import annotations

import itertools
import os
import re

from locust import FastHttpUser, between, task

API_KEY = os.environ.get("BENCH_API_KEY", "")
SERVER_ID = os.environ.get("BENCH_SERVER_ID", "")
EMAIL = os.environ.get("BENCH_EMAIL", "")
PASSWORD = os.environ.get("BENCH_PASSWORD", "")
# Rows per POST /tool-calls (bench/soak.py counts acknowledged rows with it).
INGEST_ROWS = int(os.environ.get("BENCH_INGEST_ROWS", "100"))
_ids = itertools.count(1)
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


class Agent(FastHttpUser):
    """An MCP client: mostly tools/call, now and then another request."""

    weight = 10
    wait_time = between(0.0, 0.05)
    headers = {
        "X-API-Key": API_KEY,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
        "X-Caller-Agent": "locust",
    }

    def _rpc(self, method: str, params: str, name: str) -> None:
        body = f'{{"jsonrpc":"2.0","id":{next(_ids)},"method":"{method}","params":{params}}}'
        self.client.post(
            f"/api/v1/proxy/{SERVER_ID}/mcp", data=body, headers=self.headers, name=name
        )

    @task(20)
    def call_tool(self) -> None:
        self._rpc("tools/call", '{"name":"echo","arguments":{"text":"hi"}}', "proxy tools/call")

    @task(1)
    def list_tools(self) -> None:
        self._rpc("tools/list", "{}", "proxy tools/list")


class Ingester(FastHttpUser):
    """A script shipping calls made elsewhere, in arrays."""

    weight = 1
    wait_time = between(0.05, 0.2)
    headers = {"X-API-Key": API_KEY, "Content-Type": "application/json"}

    @task
    def ingest(self) -> None:
        row = f'{{"server_id":"{SERVER_ID}","tool_name":"ingested","status":"success"}}'
        self.client.post(
            "/api/v1/tool-calls",
            data="[" + ",".join([row] * INGEST_ROWS) + "]",
            headers=self.headers,
            name=f"ingest x{INGEST_ROWS}",
        )


class Reader(FastHttpUser):
    """A REST client reading the log, the analytics and the registry."""

    weight = 2
    wait_time = between(0.05, 0.2)
    headers = {"X-API-Key": API_KEY}

    @task(4)
    def list_calls(self) -> None:
        self.client.get("/api/v1/tool-calls?limit=50", headers=self.headers, name="list")

    @task(1)
    def list_filtered(self) -> None:
        self.client.get(
            "/api/v1/tool-calls?limit=50&tool_name=ech&status=success",
            headers=self.headers,
            name="list filtered",
        )

    @task(2)
    def analytics(self) -> None:
        self.client.get("/api/v1/analytics/volume?days=1", headers=self.headers, name="analytics")

    @task(1)
    def servers(self) -> None:
        self.client.get("/api/v1/servers", headers=self.headers, name="servers")


class Viewer(FastHttpUser):
    """A person on the dashboard, signed in through the login form."""

    weight = 1
    wait_time = between(0.5, 2.0)

    def on_start(self) -> None:
        with self.client.get("/login", name="dashboard login", catch_response=True) as page:
            found = _CSRF.search(page.text or "")
            if found is None:
                page.failure("no CSRF token on the login page")
                return
        form = {"csrf_token": found.group(1), "email": EMAIL, "password": PASSWORD}
        self.client.post("/login", data=form, name="dashboard login")

    @task(3)
    def overview(self) -> None:
        self.client.get("/", name="page /")

    @task(2)
    def calls(self) -> None:
        self.client.get("/tool-calls", name="page /tool-calls")

    @task(1)
    def analytics(self) -> None:
        self.client.get("/analytics", name="page /analytics")

    @task(1)
    def servers(self) -> None:
        self.client.get("/servers", name="page /servers")
