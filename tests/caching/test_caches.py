"""In-process caches of per-request lookups, and their invalidation across gateway processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gateway.accounts.access import AUTHENTICATOR
from gateway.caching.caches import MISSING, Caches, InvalidatedCache
from tests.helpers.api import Api, AppFactory, Reply

# -- the cache ------------------------------------------------------------------------------


def counting_loader(values: dict[str, int]) -> Callable[[str], Callable[[], Awaitable[int]]]:
    def loader(key: str) -> Callable[[], Awaitable[int]]:
        async def load() -> int:
            values[key] = values.get(key, 0) + 1
            return values[key]

        return load

    return loader


async def test_nothing_is_cached_until_invalidations_can_be_heard() -> None:
    loads: dict[str, int] = {}
    load = counting_loader(loads)
    cache: InvalidatedCache[str, int] = InvalidatedCache("test")
    assert await cache.get("a", load("a")) == 1
    assert await cache.get("a", load("a")) == 2  # loaded again: not listening yet
    cache.enabled = True
    assert await cache.get("a", load("a")) == 3
    assert await cache.get("a", load("a")) == 3  # cached
    cache.drop("a")
    assert await cache.get("a", load("a")) == 4


async def test_entries_expire_after_the_ttl() -> None:
    loads: dict[str, int] = {}
    load = counting_loader(loads)
    cache: InvalidatedCache[str, int] = InvalidatedCache("test", ttl=0.05)
    cache.enabled = True
    assert await cache.get("a", load("a")) == 1
    assert await cache.get("a", load("a")) == 1
    await asyncio.sleep(0.1)
    assert cache.peek("a") is MISSING
    assert await cache.get("a", load("a")) == 2


async def test_a_full_cache_makes_room_by_dropping_its_oldest_entry() -> None:
    loads: dict[str, int] = {}
    load = counting_loader(loads)
    cache: InvalidatedCache[str, int] = InvalidatedCache("test", maxsize=2)
    cache.enabled = True
    for key in ("a", "b", "c"):
        await cache.get(key, load(key))
    assert len(cache) == 2
    assert cache.peek("a") is MISSING
    assert (cache.peek("b"), cache.peek("c")) == (1, 1)


async def test_a_load_that_raced_with_an_invalidation_is_not_stored() -> None:
    cache: InvalidatedCache[str, str] = InvalidatedCache("test")
    cache.enabled = True
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow_stale_load() -> str:
        started.set()
        await release.wait()
        return "stale"

    pending = asyncio.create_task(cache.get("k", slow_stale_load))
    await started.wait()
    cache.drop("k")  # the row changed while the old value was being read
    release.set()
    assert await pending == "stale"  # the caller that asked still gets what it read

    async def fresh() -> str:
        return "fresh"

    assert await cache.get("k", fresh) == "fresh"  # but the stale value was not kept


async def test_notifications_are_dispatched_by_table() -> None:
    caches = Caches()
    keys: InvalidatedCache[str, int] = InvalidatedCache("keys")
    roles: InvalidatedCache[tuple[str, str], int] = InvalidatedCache("roles")
    dropped: list[str] = []

    def drop_key(key: str) -> None:
        dropped.append(key)
        keys.drop(key)

    def drop_role(key: str) -> None:
        workspace, user = key.split(":")
        roles.drop((workspace, user))

    caches.register(keys, {"api_keys": drop_key})
    caches.register(roles, {"memberships": drop_role})
    caches.set_listening(True)

    async def one() -> int:
        return 1

    await keys.get("abc", one)
    await roles.get(("w", "u"), one)
    caches.invalidate("api_keys:abc")
    caches.invalidate("servers:whatever")  # no cache for it: ignored
    assert dropped == ["abc"]
    assert len(keys) == 0 and len(roles) == 1
    caches.invalidate("memberships:w:u")
    assert len(roles) == 0
    await keys.get("abc", one)
    caches.set_listening(False)  # the listener lost its connection: forget everything
    assert len(keys) == 0 and not keys.enabled


# -- across processes -----------------------------------------------------------------------


async def eventually(
    call: Callable[[], Awaitable[Reply]], status: int, within: float = 2.0
) -> Reply:
    """Repeat a request until it answers `status` (a NOTIFY takes a moment to arrive)."""
    deadline = time.monotonic() + within
    while True:
        reply = await call()
        if reply.status == status or time.monotonic() > deadline:
            return reply
        await asyncio.sleep(0.02)


async def listening(api: Api) -> None:
    authenticator = api.app[AUTHENTICATOR]
    deadline = time.monotonic() + 5
    while not (authenticator.keys.enabled and authenticator.roles.enabled):
        assert time.monotonic() < deadline, "the cache listener never connected"
        await asyncio.sleep(0.02)


async def test_a_key_revoked_in_one_process_is_refused_by_another(make_api: AppFactory) -> None:
    a, b = await make_api(), await make_api()  # two gateway processes, one database
    await listening(a)
    owner = await b.org(await b.signup())
    key = await b.api_key(owner)
    # Known to A (refused there: not a key route) and cached, so only a NOTIFY can change it.
    # The NOTIFY of the key's creation may reach A during its first lookup, which then is not
    # cached (it may predate the change): ask again until it is.
    deadline = time.monotonic() + 5
    while True:
        await a.get("/auth/me", auth=key, expect=403)
        if len(a.app[AUTHENTICATOR].keys) == 1:
            break
        assert time.monotonic() < deadline, "process A never cached the key"
        await asyncio.sleep(0.02)

    keys = await b.get(f"/workspaces/{owner.workspace_id}/api-keys", auth=owner, expect=200)
    await b.delete(
        f"/workspaces/{owner.workspace_id}/api-keys/{keys.body[0]['id']}", auth=owner, expect=204
    )

    reply = await eventually(lambda: a.get("/auth/me", auth=key), 401)
    assert reply.status == 401


async def test_membership_changes_in_one_process_apply_in_another(make_api: AppFactory) -> None:
    a, b = await make_api(), await make_api()
    await listening(a)
    owner = await b.org(await b.signup())
    admin = await b.member(owner, "admin")
    member = await b.member(owner, "member")
    ws = f"/workspaces/{owner.workspace_id}"
    # A caches each role. (These endpoints trust the role check alone, with no membership
    # join of their own, so a stale cache entry would let the request through.) As for keys,
    # a late NOTIFY of the memberships' creation keeps a first lookup from being cached.
    roles = a.app[AUTHENTICATOR].roles
    deadline = time.monotonic() + 5
    while True:
        await a.get(f"{ws}/members", auth=member, expect=200)
        await a.get(f"{ws}/api-keys", auth=admin, expect=200)
        if len(roles) >= 2:
            break
        assert time.monotonic() < deadline, "process A never cached the roles"
        await asyncio.sleep(0.02)

    # Removed in B: refused in A.
    await b.delete(f"{ws}/members/{member.user_id}", auth=owner, expect=204)
    removed = await eventually(lambda: a.get(f"{ws}/members", auth=member), 404)
    assert removed.status == 404

    # Demoted in B: no admin rights in A.
    await b.patch(f"{ws}/members/{admin.user_id}", json={"role": "member"}, auth=owner, expect=200)
    demoted = await eventually(
        lambda: a.post(f"{ws}/api-keys", json={"name": "k2"}, auth=admin), 403
    )
    assert demoted.status == 403
