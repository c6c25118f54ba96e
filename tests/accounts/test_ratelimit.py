"""Login and signup rate limits hold across gateway processes: the counts are shared."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from gateway.accounts.ratelimit import AuthRateLimiter
from gateway.background.retention import run_once
from gateway.keys import POOL, SETTINGS
from gateway.security.outbound import parse_networks
from tests.helpers.api import Api, AppFactory
from tests.helpers.upstreams import free_port

LOGIN = {"email": "ada@example.com", "password": "password123"}


async def test_two_processes_share_one_limit(make_api: AppFactory) -> None:
    # Two apps on one database, as two gateway processes behind a balancer.
    a, b = await make_api(auth_rate_limit="3/minute"), await make_api(auth_rate_limit="3/minute")
    await a.post("/auth/login", json=LOGIN, expect=401)
    await b.post("/auth/login", json=LOGIN, expect=401)
    await a.post("/auth/login", json=LOGIN, expect=401)
    for api in (b, a):
        limited = await api.post("/auth/login", json=LOGIN, expect=429)
        assert 1 <= int(limited.headers["Retry-After"]) <= 60


async def test_racing_processes_never_exceed_the_limit(make_api: AppFactory) -> None:
    a, b = await make_api(auth_rate_limit="5/minute"), await make_api(auth_rate_limit="5/minute")
    limiters = [
        AuthRateLimiter.shared("5/minute", api.app[POOL], None) for api in (a, b) for _ in range(3)
    ]
    outcomes = await asyncio.gather(
        *(limiters[i % len(limiters)].hit("email:race@example.com") for i in range(30)),
        return_exceptions=True,
    )
    assert sum(outcome is None for outcome in outcomes) == 5


async def test_expired_attempts_are_swept(api: Api, db: asyncpg.Connection) -> None:
    await api.post("/auth/login", json=LOGIN, expect=401)
    # Both keys: the client's address and the email.
    assert await db.fetchval("SELECT count(*) FROM rate_limit_hits") == 2
    assert (await run_once(api.app[POOL], api.app[SETTINGS])).rate_limit_hits == 0
    await db.execute("UPDATE rate_limit_hits SET expires_at = now() - interval '1 second'")
    swept = await run_once(api.app[POOL], api.app[SETTINGS], batch_size=1, pause=0)
    assert swept.rate_limit_hits == 2
    assert await db.fetchval("SELECT count(*) FROM rate_limit_hits") == 0


async def _login(api: Api, email: str, forwarded_for: str, expect: int) -> None:
    body = {"email": email, "password": "password123"}
    headers = {"X-Forwarded-For": forwarded_for}
    await api.post("/auth/login", json=body, headers=headers, expect=expect)


async def test_behind_a_trusted_proxy_each_client_has_its_own_limit(
    make_api: AppFactory,
) -> None:
    api = await make_api(auth_rate_limit="2/minute", trusted_proxies=parse_networks("127.0.0.0/8"))
    await _login(api, "a1@example.com", "203.0.113.5", 401)
    await _login(api, "a2@example.com", "203.0.113.5", 401)
    await _login(api, "a3@example.com", "203.0.113.5", 429)
    await _login(api, "b1@example.com", "203.0.113.6", 401)  # another client
    # What the client itself wrote (left of the proxy's entry) changes nothing.
    await _login(api, "a4@example.com", "198.51.100.9, 203.0.113.5", 429)


async def test_forwarded_for_is_ignored_from_anyone_else(make_api: AppFactory) -> None:
    api = await make_api(auth_rate_limit="2/minute")
    await _login(api, "a1@example.com", "203.0.113.5", 401)
    await _login(api, "a2@example.com", "203.0.113.6", 401)
    await _login(api, "a3@example.com", "203.0.113.7", 429)  # all one address: 127.0.0.1


async def test_with_redis_processes_share_the_limit_there(
    make_api: AppFactory, redis_url: str, db: asyncpg.Connection
) -> None:
    settings = {"auth_rate_limit": "3/minute", "trusted_proxies": parse_networks("127.0.0.0/8")}
    a, b = (
        await make_api(redis_url=redis_url, **settings),
        await make_api(redis_url=redis_url, **settings),
    )
    client = f"203.0.113.{uuid.uuid4().int % 250}"  # the session's Redis outlives this test
    emails = [f"{uuid.uuid4().hex}@example.com" for _ in range(5)]
    await _login(a, emails[0], client, 401)
    await _login(b, emails[1], client, 401)
    await _login(a, emails[2], client, 401)
    await _login(b, emails[3], client, 429)
    await _login(a, emails[4], client, 429)
    assert await db.fetchval("SELECT count(*) FROM rate_limit_hits") == 0  # all in Redis


async def test_while_redis_is_away_attempts_are_let_through(make_api: AppFactory) -> None:
    api = await make_api(redis_url=f"redis://127.0.0.1:{free_port()}/0", auth_rate_limit="1/minute")
    for email in ("a@example.com", "b@example.com"):
        await _login(api, email, "203.0.113.1", 401)
