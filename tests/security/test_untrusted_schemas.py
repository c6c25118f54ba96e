"""The schema checker against hostile JSON Schemas: real worker processes, each check within
its bound, killed and replaced when over it or when they crash, one check per workspace."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway.security.untrusted_schemas import Problem, SchemaChecker
from tests.helpers.hostile import (
    any_of_chain,
    catastrophic_pattern,
    distinct_objects,
    ref_loop,
    unique_objects,
)
from tests.helpers.upstreams import serve_loopback


@pytest.fixture
async def checker() -> AsyncIterator[SchemaChecker]:
    pool = SchemaChecker(seconds=1.0)
    yield pool
    await pool.close()


@pytest.fixture
async def single() -> AsyncIterator[SchemaChecker]:
    """A pool of one worker, so a test knows which process a check runs in."""
    pool = SchemaChecker(seconds=1.0, workers=1)
    yield pool
    await pool.close()


def running(pid: int) -> bool:
    """Alive (a zombie, dead but not yet reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def timed(checker: SchemaChecker, owner: str, schema: object, instance: object) -> float:
    started = time.perf_counter()
    await checker.check(owner, schema, instance)
    return time.perf_counter() - started


async def test_arguments_that_break_the_schema_are_named_most_relevant_first(
    checker: SchemaChecker,
) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"items": {"minimum": 3}}},
        "required": ["a", "c"],
    }
    verdict = await checker.check("w1", schema, {"a": "two", "b": [5, 1]})
    assert verdict.checked and verdict.reason is None
    assert verdict.problems == (
        Problem((), '"c" is a required property'),
        Problem(("a",), '"two" is not of type "integer"'),
        Problem(("b", 1), "1 is less than the minimum of 3"),
    )
    assert (await checker.check("w1", schema, {"a": 1, "c": 0})).problems == ()


async def test_at_most_ten_problems_are_told(checker: SchemaChecker) -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    verdict = await checker.check("w1", schema, list(range(5000)))
    assert verdict.checked
    assert len(verdict.problems) == 10


async def test_a_catastrophic_pattern_is_matched_in_linear_time(checker: SchemaChecker) -> None:
    """A backtracking engine would take hours over 60 "a"s and a "!"."""
    schema = catastrophic_pattern()
    verdict = await checker.check("w1", schema, {"text": "a" * 60 + "!"})
    assert verdict.checked
    assert [p.path for p in verdict.problems] == [("text",)]
    assert "does not match" in verdict.problems[0].message
    assert (await checker.check("w1", schema, {"text": "a" * 60})).problems == ()


async def test_patterns_the_linear_engine_cannot_take_are_still_checked(
    checker: SchemaChecker,
) -> None:
    schema = {"properties": {"code": {"type": "string", "pattern": "^(?!x)[a-z]+$"}}}
    assert (await checker.check("w1", schema, {"code": "abc"})).problems == ()
    refused = await checker.check("w1", schema, {"code": "xyz"})
    assert [p.path for p in refused.problems] == [("code",)]


async def test_a_check_over_its_bound_is_given_up_and_its_worker_killed_and_replaced(
    single: SchemaChecker,
) -> None:
    checker = single
    await checker.check("w1", {"type": "object"}, {})
    [before] = checker.pids
    started = time.perf_counter()
    verdict = await checker.check("w1", any_of_chain(), {"value": "not a number"})
    assert time.perf_counter() - started < 3
    assert not verdict.checked
    assert verdict.reason == "checking took longer than 1 s"
    assert not running(before)  # killed by its PID
    again = await checker.check("w1", {"type": "object", "required": ["x"]}, {})
    assert again.checked and again.problems == (Problem((), '"x" is a required property'),)
    assert before not in checker.pids


async def test_a_worker_that_crashes_is_replaced() -> None:
    checker = SchemaChecker(seconds=30.0, workers=1)
    try:
        await checker.check("w1", {"type": "object"}, {})
        [victim] = checker.pids
        busy = asyncio.create_task(checker.check("w1", any_of_chain(), {"value": "x"}))
        await asyncio.sleep(0.3)
        os.kill(victim, signal.SIGSEGV)  # what a stack overflow in native code looks like
        verdict = await asyncio.wait_for(busy, 10)
        assert not verdict.checked
        assert verdict.reason == "the schema checker failed on this schema"
        again = await checker.check("w1", {"type": "integer"}, "x")
        assert again.checked and len(again.problems) == 1
    finally:
        await checker.close()


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        (ref_loop(), {"value": {"deeper": [1, 2, 3]}}),
        ({"$ref": "#"}, {"x": {"y": {"z": 1}}}),
        ({"properties": {"next": {"$ref": "#"}}}, {"next": {"next": {"next": {}}}}),
        (unique_objects(), {"items": distinct_objects(3000)}),
    ],
    ids=["ref-loop", "self-ref", "recursive-properties", "unique-3000-objects"],
)
async def test_loops_and_costly_keywords_are_answered_at_once(
    checker: SchemaChecker, schema: dict[str, object], instance: object
) -> None:
    await checker.check("warm-up", {}, {})
    started = time.perf_counter()
    verdict = await checker.check("w1", schema, instance)
    assert time.perf_counter() - started < 1
    assert verdict.checked and verdict.problems == ()


async def test_a_ref_to_another_document_is_never_fetched(checker: SchemaChecker) -> None:
    fetched: list[str] = []

    async def document(request: web.Request) -> web.Response:
        fetched.append(request.path)
        return web.json_response({"type": "integer"})

    app = web.Application()
    app.router.add_get("/schema.json", document)
    async with serve_loopback(app) as base_url:
        schema = {"properties": {"a": {"$ref": f"{base_url}/schema.json"}}}
        verdict = await checker.check("w1", schema, {"a": "x"})
    assert not verdict.checked
    assert verdict.reason == (
        "the inputSchema refers to another document ($ref), which the gateway does not fetch"
    )
    assert fetched == []


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": 12}, "the inputSchema is not a valid JSON Schema: "),
        ({"description": "x" * (1024 * 1024)}, "the inputSchema is larger than 1024 KiB"),
        (
            {
                "items": {"items": {"items": {}}},
                "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
            },
            None,
        ),
    ],
    ids=["invalid", "over-1-mib", "shallow"],
)
async def test_unusable_schemas_are_not_enforced(
    checker: SchemaChecker, schema: dict[str, object], reason: str | None
) -> None:
    verdict = await checker.check("w1", schema, {})
    if reason is None:
        assert verdict.checked
    else:
        assert not verdict.checked
        assert verdict.reason is not None and verdict.reason.startswith(reason)


@pytest.mark.parametrize("depth", [65, 300])
async def test_a_schema_nested_too_deeply_is_not_enforced(
    checker: SchemaChecker, depth: int
) -> None:
    schema: dict[str, object] = {}
    for _ in range(depth - 1):
        schema = {"not": schema}
    verdict = await checker.check("w1", schema, {})
    assert not verdict.checked
    assert verdict.reason == "the inputSchema is nested deeper than 64 levels"


async def test_one_workspace_checks_one_schema_at_a_time(checker: SchemaChecker) -> None:
    """Its slow checks take one worker between them, never both: another workspace's check
    is served at once meanwhile."""
    await asyncio.gather(checker.check("w2", {}, {}), checker.check("w3", {}, {}))  # started
    slow = [
        asyncio.create_task(checker.check("w1", any_of_chain(), {"value": "x"})) for _ in range(2)
    ]
    await asyncio.sleep(0.2)
    assert await timed(checker, "w2", {"type": "object"}, {}) < 0.5
    first, second = await asyncio.gather(*slow)
    assert first.reason == "checking took longer than 1 s"
    assert not second.checked


async def test_a_check_that_cannot_start_in_time_is_not_enforced(single: SchemaChecker) -> None:
    """The one worker is busy past w3's bound: w1's slow check until it is killed (1 s), then
    w2's, which waited less than its own bound for it (w2 comes half-way, w3 just after)."""
    checker = single
    assert (await checker.check("w0", {"type": "object"}, {})).checked  # the worker is up
    running_slow = asyncio.create_task(checker.check("w1", any_of_chain(), {"value": "x"}))
    await asyncio.sleep(0.5)
    waiting_slow = asyncio.create_task(checker.check("w2", any_of_chain(), {"value": "x"}))
    await asyncio.sleep(0.1)
    started = time.perf_counter()
    verdict = await checker.check("w3", {"type": "object"}, {})
    assert 0.9 < time.perf_counter() - started < 2
    assert not verdict.checked
    assert verdict.reason == "the schema checker was busy for 1 s with other checks"
    await asyncio.gather(running_slow, waiting_slow)
    assert (await checker.check("w3", {"type": "object"}, {})).checked


async def test_the_event_loop_stays_free_while_schemas_are_checked(
    checker: SchemaChecker,
) -> None:
    """The longest pause of the loop, while two workers spin on hostile schemas."""
    done = asyncio.Event()
    longest = 0.0

    async def watch() -> None:
        nonlocal longest
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            longest = max(longest, time.perf_counter() - before)

    watcher = asyncio.create_task(watch())
    await asyncio.gather(
        checker.check("w1", any_of_chain(), {"value": "x"}),
        checker.check("w2", unique_objects(), {"items": distinct_objects(3000)}),
        checker.check("w3", catastrophic_pattern(), {"text": "a" * 40 + "!"}),
    )
    done.set()
    await watcher
    assert longest < 0.5


async def test_workers_get_no_secrets_and_stop_with_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_JWT_SECRET", "not-for-workers")
    monkeypatch.setenv("DATABASE_URL", "postgresql://secret@db/x")
    checker = SchemaChecker(seconds=1.0)
    await asyncio.gather(checker.check("w1", {}, {}), checker.check("w2", {}, {}))
    pids = checker.pids
    assert len(pids) == 2
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes()  # noqa: ASYNC240 -- /proc, instant
        assert b"not-for-workers" not in environ
        assert b"DATABASE_URL" not in environ
    await checker.close()
    assert not any(running(pid) for pid in pids)
    assert (await checker.check("w1", {}, {})).reason == "the gateway is shutting down"


async def test_a_caller_that_goes_away_mid_check_leaves_no_worker_behind(
    single: SchemaChecker,
) -> None:
    checker = single
    await checker.check("w1", {}, {})
    [worker] = checker.pids
    task = asyncio.create_task(checker.check("w1", any_of_chain(), {"value": "x"}))
    await asyncio.sleep(0.2)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not running(worker)  # its answer would have gone to the next check
    assert (await checker.check("w1", {"type": "integer"}, "x")).problems
