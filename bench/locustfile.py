"""Mixed load through a running gateway with locust (pip install -e '.[bench]').

    BENCH_API_KEY=mcpg_... BENCH_SERVER_ID=<uuid> \
        locust -f bench/locustfile.py --host http://127.0.0.1:8080 --headless -u 50 -r 10 -t 1m

Agents call tools through the proxy (stateless JSON upstream assumed), others ingest arrays and
read the log. bench/proxy.py and bench/ingest.py are the reproducible measurements; this file
is for soak tests and for mixing the three kinds of traffic. Only point it at 127.0.0.1 or at a
test host of your own.
"""

from __future__ import annotations

import itertools
import os

from locust import FastHttpUser, between, task

API_KEY = os.environ.get("BENCH_API_KEY", "")
SERVER_ID = os.environ.get("BENCH_SERVER_ID", "")
_ids = itertools.count(1)


class Agent(FastHttpUser):
    wait_time = between(0.0, 0.05)
    headers = {
        "X-API-Key": API_KEY,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "X-Caller-Agent": "locust",
    }

    @task(20)
    def call_tool(self) -> None:
        body = (
            f'{{"jsonrpc":"2.0","id":{next(_ids)},"method":"tools/call",'
            '"params":{"name":"echo","arguments":{"text":"hi"}}}'
        )
        self.client.post(
            f"/api/v1/proxy/{SERVER_ID}/mcp", data=body, headers=self.headers, name="proxy"
        )

    @task(2)
    def ingest(self) -> None:
        row = f'{{"server_id":"{SERVER_ID}","tool_name":"ingested","status":"success"}}'
        self.client.post(
            "/api/v1/tool-calls",
            data="[" + ",".join([row] * 100) + "]",
            headers=self.headers,
            name="ingest x100",
        )

    @task(1)
    def read_log(self) -> None:
        self.client.get(
            "/api/v1/tool-calls?limit=50&tool_name=ech", headers=self.headers, name="list"
        )
