"""Rate limits' budgets: shared by every process through PostgreSQL or Redis, spent from
leases in memory, never over the limit, and counted per process while the store is away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.policy.budgets import EMPTY_SECONDS, Budgets, PostgresBudgets, RedisBudgets
from gateway.policy.rules import parse_rate_limit
from tests.helpers.upstreams import free_port

HUNDRED_AN_HOUR = parse_rate_limit("100/hour")


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    async with asyncpg.create_pool(database_url, min_size=1, max_size=4) as pool:
        yield pool


async def spend(budgets: list[Budgets], subject: str, attempts: int) -> int:
    """Calls the processes let through, taking turns."""
    allowed = 0
    for attempt in range(attempts):
        if await budgets[attempt % len(budgets)].take(subject, HUNDRED_AN_HOUR) == 0.0:
            allowed += 1
    return allowed


async def test_two_processes_on_postgresql_admit_the_limit_within_ten_percent(
    pool: asyncpg.Pool,
) -> None:
    processes = [Budgets(PostgresBudgets(pool)), Budgets(PostgresBudgets(pool))]
    allowed = await spend(processes, "key:a:hour", 300)
    assert 90 <= allowed <= 100


async def test_two_processes_on_redis_admit_the_limit_within_ten_percent(redis_url: str) -> None:
    stores = [RedisBudgets(redis_url), RedisBudgets(redis_url)]
    try:
        allowed = await spend([Budgets(s) for s in stores], "key:redis-test:hour", 300)
    finally:
        for store in stores:
            await store.close()
    assert 90 <= allowed <= 100


async def test_the_store_never_grants_more_than_the_limit_to_concurrent_takers(
    pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    processes = [Budgets(PostgresBudgets(pool)) for _ in range(4)]
    answers = await asyncio.gather(
        *(processes[i % 4].take("server:s:hour", HUNDRED_AN_HOUR) for i in range(400))
    )
    assert sum(1 for a in answers if a == 0.0) <= 100
    assert await db.fetchval("SELECT used FROM call_budgets WHERE subject = 'server:s:hour'") <= 100


async def test_a_refused_call_is_told_when_the_window_ends(pool: asyncpg.Pool) -> None:
    budgets = Budgets(PostgresBudgets(pool))
    once_a_day = parse_rate_limit("1/day")
    assert await budgets.take("key:b:day", once_a_day) == 0.0
    retry_after = await budgets.take("key:b:day", once_a_day)
    assert 1 <= retry_after <= 86400


async def test_a_lease_given_back_can_be_spent_by_another_process(pool: asyncpg.Pool) -> None:
    first, second = Budgets(PostgresBudgets(pool)), Budgets(PostgresBudgets(pool))
    assert await first.take("key:c:hour", HUNDRED_AN_HOUR) == 0.0  # leases 5, spends 1
    assert await spend([second], "key:c:hour", 200) == 95
    await first.refund_all()
    await asyncio.sleep(EMPTY_SECONDS)  # the second asks the store again after this long
    assert await spend([second], "key:c:hour", 10) == 4


async def test_calls_given_back_after_another_refusal_are_spent_again(pool: asyncpg.Pool) -> None:
    budgets = Budgets(PostgresBudgets(pool))
    twice = parse_rate_limit("2/hour")
    assert await budgets.take("key:d:hour", twice) == 0.0
    budgets.give_back("key:d:hour", twice)
    answers = [await budgets.take("key:d:hour", twice) for _ in range(5)]
    assert answers.count(0.0) == 2


async def test_while_the_store_is_away_each_process_counts_the_limit_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unreachable = await asyncpg.create_pool(
        f"postgresql://postgres@127.0.0.1:{free_port()}/none", min_size=0, max_size=1
    )
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.policy.budgets"):
            allowed = await spend([Budgets(PostgresBudgets(unreachable))], "key:e:hour", 150)
    finally:
        await unreachable.close()
    assert allowed == 100
    assert "each process counts its limits alone" in caplog.text


async def test_while_redis_is_away_each_process_counts_the_limit_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RedisBudgets(f"redis://127.0.0.1:{free_port()}/0")
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.policy.budgets"):
            allowed = await spend([Budgets(store)], "key:f:hour", 150)
    finally:
        await store.close()
    assert allowed == 100
    assert "each process counts its limits alone" in caplog.text


async def test_on_redis_a_lease_given_back_can_be_spent_by_another_process(
    redis_url: str,
) -> None:
    stores = [RedisBudgets(redis_url), RedisBudgets(redis_url)]
    first, second = Budgets(stores[0]), Budgets(stores[1])
    try:
        assert await first.take("key:g:hour", HUNDRED_AN_HOUR) == 0.0  # leases 5, spends 1
        assert await spend([second], "key:g:hour", 200) == 95
        await first.refund_all()
        await asyncio.sleep(EMPTY_SECONDS)
        assert await spend([second], "key:g:hour", 10) == 4
    finally:
        for store in stores:
            await store.close()
