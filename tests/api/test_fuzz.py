"""schemathesis over every operation of the OpenAPI document, as an owner, a member and an API
key: no server error, every response as documented (status, content type, headers, body), and
nothing the document allows refused for a reason it does not state.

The run is the schemathesis CLI against the test's own gateway, configured by
tests/api/schemathesis.toml (hooks in tests/api/fuzz_hooks.py). CI runs a small, seeded budget
so that a failure replays; FUZZ_EXAMPLES and FUZZ_SEED widen it (docs/development.md).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from gateway.api.openapi import OPENAPI_DOCUMENT
from gateway.security.outbound import parse_networks
from tests.helpers.api import AppFactory

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = os.environ.get("FUZZ_EXAMPLES", "5")
SEED = os.environ.get("FUZZ_SEED", "1")  # "random" for a new one each run
# A bound on the whole run, whatever the budget: a hung request fails the test, not CI.
RUN_TIMEOUT_SECONDS = 120 + 6 * int(EXAMPLES)


@pytest.mark.parametrize("caller", ["owner", "member", "key"])
async def test_no_operation_errors_or_departs_from_the_document(
    make_api: AppFactory, caller: str, tmp_path: Path
) -> None:
    # Every address refused: what the fuzzer registers is never dialled (502), so no service
    # on this machine is reached and the answers do not depend on what happens to listen.
    api = await make_api(outbound_deny=parse_networks("0.0.0.0/0,::/0"))
    owner = await api.org(await api.signup(name="Fuzz Owner"), name="Fuzzed")
    header = {
        "owner": f"Authorization: Bearer {owner.access_token}",
        "member": f"Authorization: Bearer {(await api.member(owner)).access_token}",
        "key": f"X-API-Key: {await api.api_key(owner)}",
    }[caller]
    operations = [
        op
        for item in api.app[OPENAPI_DOCUMENT]["paths"].values()
        for op in item.values()
        # An API key goes where the document says keys go; elsewhere it is refused (403).
        if caller != "key" or {"apiKey": []} in op["security"]
    ]
    ids = "|".join(op["operationId"] for op in operations)
    args = [
        f"--config-file={CONFIG}",
        "run",
        str(api.client.make_url("/api/v1/openapi.json")),
        f"--include-operation-id-regex=^({ids})$",
        f"--header={header}",
        f"--max-examples={EXAMPLES}",
        # One worker: hypothesis describing its strategies from several threads at once trips
        # CPython 3.11's "AST constructor recursion depth mismatch".
        "--workers=1",
        "--request-timeout=20",
        f"--report-dir={tmp_path}",
    ]
    if SEED != "random":
        args.append(f"--seed={SEED}")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "schemathesis.cli",
        *args,
        cwd=ROOT,  # the hooks module is tests.api.fuzz_hooks
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(RUN_TIMEOUT_SECONDS):
            output, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    report = output.decode(errors="replace")
    assert process.returncode == 0, report[-20_000:]
    # It really ran: every operation chosen was exercised.
    assert f"Tested: {len(operations)}\n" in report, report[-5_000:]
