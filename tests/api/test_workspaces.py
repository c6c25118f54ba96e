"""/workspaces: workspaces, members and roles, invitations and API keys."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from gateway.accounts.access import AUTHENTICATOR
from gateway.caching.caches import CACHES
from tests.helpers.api import Api, AppFactory, Reply
from tests.helpers.mail import Inbox


async def own_invalidation_only(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wait until the app caches lookups, then stop NOTIFYs from reaching its caches: what
    follows must hold through the process's own invalidation, with no race against the
    notification (other processes rely on the NOTIFY; see tests/test_caches.py)."""
    authenticator = api.app[AUTHENTICATOR]
    deadline = time.monotonic() + 5
    while not (authenticator.roles.enabled and authenticator.keys.enabled):
        assert time.monotonic() < deadline, "the cache listener never connected"
        await asyncio.sleep(0.02)
    monkeypatch.setattr(api.app[CACHES], "invalidate", lambda payload: None)


def token_of(invite: dict[str, Any]) -> str:
    url: str = invite["invite_url"]
    return url.rsplit("/", 1)[1]


# -- workspaces -----------------------------------------------------------------------------


async def test_create_workspace_makes_the_creator_its_owner(api: Api) -> None:
    ada = await api.signup()
    reply = await api.post("/workspaces", json={"name": "Acme Corp"}, auth=ada, expect=201)
    workspace = reply.body
    assert workspace["name"] == "Acme Corp"
    assert workspace["slug"] == "acme-corp"  # derived from the name
    assert workspace["is_personal"] is False
    assert workspace["role"] == "owner"
    fetched = await api.get(f"/workspaces/{workspace['id']}", auth=ada, expect=200)
    assert fetched.body == workspace
    listed = await api.get("/workspaces", auth=ada, expect=200)
    # The personal workspace comes first.
    assert [w["id"] for w in listed.body] == [ada.workspace_id, workspace["id"]]
    assert listed.body[1] == workspace
    # Ada's token is scoped to her personal workspace, but /workspaces/{id} acts on the one named.
    key = await api.post(
        f"/workspaces/{workspace['id']}/api-keys", json={"name": "k"}, auth=ada, expect=201
    )
    assert key.body["created_by"] == ada.user_id
    personal_keys = await api.get(f"/workspaces/{ada.workspace_id}/api-keys", auth=ada)
    assert personal_keys.body == []


async def test_slugs_are_explicit_or_derived_and_unique(api: Api) -> None:
    ada = await api.signup()
    bob = await api.signup()
    explicit = await api.post(
        "/workspaces", json={"name": "Acme", "slug": "acme-42"}, auth=ada, expect=201
    )
    assert explicit.body["slug"] == "acme-42"
    taken = await api.post(
        "/workspaces", json={"name": "Other", "slug": "acme-42"}, auth=bob, expect=400
    )
    assert "slug" in taken.detail
    renamed = await api.patch(
        f"/workspaces/{bob.workspace_id}", json={"slug": "acme-42"}, auth=bob, expect=400
    )
    assert "slug" in renamed.detail
    # A derived slug that is taken gets a suffix instead of failing.
    first = await api.post("/workspaces", json={"name": "Beta"}, auth=ada, expect=201)
    second = await api.post("/workspaces", json={"name": "Beta"}, auth=ada, expect=201)
    assert first.body["slug"] == "beta"
    assert second.body["slug"].startswith("beta-")


async def test_workspace_validation_is_422_naming_the_field(api: Api) -> None:
    ada = await api.signup()
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "body.name"),
        ({"name": ""}, "body.name"),
        ({"name": "   "}, "body.name"),
        ({"name": ["Acme"]}, "body.name"),
        ({"name": "Acme", "slug": "A"}, "body.slug"),
        ({"name": "Acme", "slug": "Acme"}, "body.slug"),
        ({"name": "Acme", "slug": "-acme"}, "body.slug"),
        ({"name": "Acme", "slug": "acme_corp"}, "body.slug"),
        ({"name": "Acme", "slug": "a" * 64}, "body.slug"),
        ({"name": "Acme", "slug": 7}, "body.slug"),
    ]
    for body, field in cases:
        reply = await api.post("/workspaces", json=body, auth=ada, expect=422)
        assert reply.detail.startswith(f"{field}:"), (body, reply.detail)
    reply = await api.patch(
        f"/workspaces/{ada.workspace_id}", json={"slug": "Not A Slug"}, auth=ada, expect=422
    )
    assert reply.detail.startswith("body.slug:")
    # The longest and shortest valid slugs are fine.
    for slug in ("a" * 63, "ab"):
        await api.post("/workspaces", json={"name": "Acme", "slug": slug}, auth=ada, expect=201)


async def test_update_workspace_changes_only_what_is_sent(api: Api) -> None:
    owner = await api.org(await api.signup(), name="Acme")
    admin = await api.member(owner, "admin")
    path = f"/workspaces/{owner.workspace_id}"
    before = (await api.get(path, auth=owner, expect=200)).body
    renamed = await api.patch(path, json={"name": "Acme Inc"}, auth=admin, expect=200)
    assert renamed.body == {**before, "name": "Acme Inc", "role": "admin"}
    reslugged = await api.patch(path, json={"slug": "acme-inc"}, auth=owner, expect=200)
    assert reslugged.body == {**before, "name": "Acme Inc", "slug": "acme-inc"}
    unchanged = await api.patch(path, json={"unknown": 1}, auth=owner, expect=200)
    assert unchanged.body == reslugged.body


async def test_deleting_a_workspace_deletes_everything_in_it(
    api: Api, db: asyncpg.Connection
) -> None:
    founder = await api.signup()
    # A personal workspace cannot be deleted.
    personal = f"/workspaces/{founder.workspace_id}"
    reply = await api.delete(personal, auth=founder, expect=400)
    assert "personal" in reply.detail
    await api.get(personal, auth=founder, expect=200)

    owner = await api.org(founder)
    member = await api.member(owner)
    key = await api.api_key(owner)
    await api.invite(owner, "pending@example.com")
    path = f"/workspaces/{owner.workspace_id}"

    await api.delete(path, auth=owner, expect=204)

    await api.get(path, auth=owner, expect=404)
    await api.get(path, auth=member, expect=404)
    await api.get("/auth/me", auth=key, expect=401)  # its API keys are gone
    for table in ("memberships", "invites", "api_keys"):
        count = await db.fetchval(
            f"SELECT count(*) FROM {table} WHERE workspace_id = $1", uuid.UUID(owner.workspace_id)
        )
        assert count == 0, table
    # The users themselves remain, with their personal workspaces.
    listed = await api.get("/workspaces", auth=member, expect=200)
    assert [w["is_personal"] for w in listed.body] == [True]


async def test_unknown_and_malformed_workspace_ids_are_404(api: Api) -> None:
    ada = await api.signup()
    for workspace_id in (uuid.uuid4(), "not-a-uuid"):
        await api.get(f"/workspaces/{workspace_id}", auth=ada, expect=404)
        await api.get(f"/workspaces/{workspace_id}/members", auth=ada, expect=404)
        await api.delete(f"/workspaces/{workspace_id}", auth=ada, expect=404)


# -- members --------------------------------------------------------------------------------


async def test_members_list_shows_roles(api: Api) -> None:
    owner = await api.org(await api.signup("olga@example.com", name="Olga"))
    admin = await api.member(owner, "admin")
    member = await api.member(owner, "member")
    reply = await api.get(f"/workspaces/{owner.workspace_id}/members", auth=member, expect=200)
    assert [(m["user_id"], m["role"]) for m in reply.body] == [
        (owner.user_id, "owner"),
        (admin.user_id, "admin"),
        (member.user_id, "member"),
    ]
    assert reply.body[0]["email"] == "olga@example.com"
    assert reply.body[0]["name"] == "Olga"
    assert set(reply.body[0]) == {"user_id", "email", "name", "role", "joined_at"}


async def test_owners_change_roles_with_effect_on_the_next_request(api: Api) -> None:
    owner = await api.org(await api.signup())
    bob = await api.member(owner)
    path = f"/workspaces/{owner.workspace_id}/members/{bob.user_id}"
    promoted = await api.patch(path, json={"role": "admin"}, auth=owner, expect=200)
    assert promoted.body["user_id"] == bob.user_id
    assert promoted.body["role"] == "admin"
    # The new admin has admin rights on the very next request.
    await api.post(
        f"/workspaces/{owner.workspace_id}/api-keys", json={"name": "k"}, auth=bob, expect=201
    )
    await api.patch(path, json={"role": "owner"}, auth=owner, expect=200)
    # A second owner can now demote the first.
    demoted = await api.patch(
        f"/workspaces/{owner.workspace_id}/members/{owner.user_id}",
        json={"role": "member"},
        auth=bob,
        expect=200,
    )
    assert demoted.body["role"] == "member"
    # ...who loses the rights of the old role on the very next request.
    await api.post(
        f"/workspaces/{owner.workspace_id}/api-keys", json={"name": "k"}, auth=owner, expect=403
    )
    await api.get(f"/workspaces/{owner.workspace_id}/api-keys", auth=owner, expect=200)


async def test_the_last_owner_cannot_be_demoted_or_removed(api: Api) -> None:
    owner = await api.org(await api.signup())
    await api.member(owner, "admin")
    me = f"/workspaces/{owner.workspace_id}/members/{owner.user_id}"
    reply = await api.patch(me, json={"role": "admin"}, auth=owner, expect=400)
    assert "owner" in reply.detail
    await api.delete(me, auth=owner, expect=400)
    # Re-affirming the owner role is harmless.
    await api.patch(me, json={"role": "owner"}, auth=owner, expect=200)
    # With a second owner, the first may step down.
    second = await api.member(owner, "owner")
    await api.delete(me, auth=owner, expect=204)
    members = await api.get(f"/workspaces/{owner.workspace_id}/members", auth=second, expect=200)
    assert owner.user_id not in {m["user_id"] for m in members.body}


async def test_member_role_validation_and_unknown_members(api: Api) -> None:
    owner = await api.org(await api.signup())
    bob = await api.member(owner)
    path = f"/workspaces/{owner.workspace_id}/members/{bob.user_id}"
    for body in ({"role": "superuser"}, {"role": None}, {}, {"role": 1}):
        reply = await api.patch(path, json=body, auth=owner, expect=422)
        assert reply.detail.startswith("body.role:"), reply.detail
    stranger = await api.signup()
    for user_id in (stranger.user_id, uuid.uuid4(), "nope"):
        other = f"/workspaces/{owner.workspace_id}/members/{user_id}"
        await api.patch(other, json={"role": "admin"}, auth=owner, expect=404)
        await api.delete(other, auth=owner, expect=404)


async def test_admins_remove_members_only_and_owners_remove_anyone(api: Api) -> None:
    owner = await api.org(await api.signup())
    admin = await api.member(owner, "admin")
    other_admin = await api.member(owner, "admin")
    member = await api.member(owner, "member")
    base = f"/workspaces/{owner.workspace_id}/members"

    reply = await api.delete(f"{base}/{other_admin.user_id}", auth=admin, expect=403)
    assert "member" in reply.detail
    await api.delete(f"{base}/{owner.user_id}", auth=admin, expect=403)
    await api.delete(f"{base}/{member.user_id}", auth=admin, expect=204)
    await api.delete(f"{base}/{other_admin.user_id}", auth=owner, expect=204)
    remaining = await api.get(base, auth=owner, expect=200)
    assert {m["user_id"] for m in remaining.body} == {owner.user_id, admin.user_id}


async def test_a_removed_member_loses_access_on_the_next_request(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = await api.org(await api.signup())
    member = await api.member(owner)
    await own_invalidation_only(api, monkeypatch)
    workspace = f"/workspaces/{owner.workspace_id}"
    await api.get(f"{workspace}/members", auth=member, expect=200)  # the role is now cached
    await api.delete(f"{workspace}/members/{member.user_id}", auth=owner, expect=204)
    await api.get(workspace, auth=member, expect=404)
    await api.get(f"{workspace}/members", auth=member, expect=404)
    await api.post(
        "/auth/switch-workspace",
        json={"workspace_id": owner.workspace_id},
        auth=member,
        expect=404,
    )


# -- invitations ----------------------------------------------------------------------------


async def test_invite_returns_the_invitation_with_its_url_once(
    api: Api, db: asyncpg.Connection
) -> None:
    owner = await api.org(await api.signup())
    reply = await api.post(
        f"/workspaces/{owner.workspace_id}/members/invite",
        json={"email": " Ada@Example.com"},
        auth=owner,
        expect=201,
    )
    invite = reply.body
    assert invite["email"] == "ada@example.com"
    assert invite["role"] == "member"  # the default
    assert invite["status"] == "pending"
    assert invite["invited_by"] == owner.user_id
    assert invite["invite_url"] == f"http://gateway.test/invite/{token_of(invite)}"
    assert len(token_of(invite)) >= 32
    expires_in = datetime.fromisoformat(invite["expires_at"]) - datetime.fromisoformat(
        invite["created_at"]
    )
    assert expires_in == timedelta(days=7)

    listed = await api.get(f"/workspaces/{owner.workspace_id}/invites", auth=owner, expect=200)
    assert listed.body == [{k: v for k, v in invite.items() if k != "invite_url"}]
    # Stored as a hash only: a copy of the database opens no workspace.
    row = await db.fetchrow("SELECT * FROM invites")
    assert row is not None and token_of(invite) not in [str(v) for v in row.values()]
    assert row["token_hash"] == hashlib.sha256(token_of(invite).encode()).hexdigest()


async def test_invitations_that_are_refused(api: Api) -> None:
    owner = await api.org(await api.signup())
    member = await api.member(owner)
    path = f"/workspaces/{owner.workspace_id}/members/invite"
    reply = await api.post(path, json={"email": member.email.upper()}, auth=owner, expect=400)
    assert "already a member" in reply.detail
    cases: list[tuple[dict[str, Any], str]] = [
        ({"email": "ada@example.com", "role": "owner"}, "body.role"),
        ({"email": "ada@example.com", "role": "boss"}, "body.role"),
        ({"email": "ada"}, "body.email"),
        ({"role": "member"}, "body.email"),
    ]
    for body, field in cases:
        reply = await api.post(path, json=body, auth=owner, expect=422)
        assert reply.detail.startswith(f"{field}:"), (body, reply.detail)


async def test_inviting_again_replaces_the_pending_invitation(api: Api) -> None:
    owner = await api.org(await api.signup())
    first = await api.invite(owner, "ada@example.com", role="member")
    second = await api.invite(owner, "ada@example.com", role="admin")
    listed = await api.get(f"/workspaces/{owner.workspace_id}/invites", auth=owner, expect=200)
    assert [(i["id"], i["role"]) for i in listed.body] == [(second["id"], "admin")]
    ada = await api.signup("ada@example.com")
    await api.post(f"/auth/accept-invite/{token_of(first)}", auth=ada, expect=404)
    accepted = await api.post(f"/auth/accept-invite/{token_of(second)}", auth=ada, expect=200)
    assert accepted.body["workspace"]["role"] == "admin"


async def test_invites_list_and_revoke_only_pending_unexpired_invitations(
    api: Api, db: asyncpg.Connection
) -> None:
    owner = await api.org(await api.signup())
    pending = await api.invite(owner, "pending@example.com")
    revoked = await api.invite(owner, "revoked@example.com")
    expired = await api.invite(owner, "expired@example.com")
    await api.member(owner)  # an accepted invitation
    await api.delete(
        f"/workspaces/{owner.workspace_id}/invites/{revoked['id']}", auth=owner, expect=204
    )
    await db.execute(
        "UPDATE invites SET expires_at = now() - interval '1 second' WHERE id = $1",
        uuid.UUID(expired["id"]),
    )
    listed = await api.get(f"/workspaces/{owner.workspace_id}/invites", auth=owner, expect=200)
    assert [i["id"] for i in listed.body] == [pending["id"]]
    # Only a pending invitation can be revoked.
    path = f"/workspaces/{owner.workspace_id}/invites"
    await api.delete(f"{path}/{revoked['id']}", auth=owner, expect=404)
    await api.delete(f"{path}/{uuid.uuid4()}", auth=owner, expect=404)
    await api.delete(f"{path}/not-a-uuid", auth=owner, expect=404)


# -- API keys -------------------------------------------------------------------------------


async def test_api_key_is_shown_once_and_listed_without_its_value(api: Api) -> None:
    owner = await api.org(await api.signup())
    path = f"/workspaces/{owner.workspace_id}/api-keys"
    created = await api.post(path, json={"name": "ci agent"}, auth=owner, expect=201)
    key = created.body["key"]
    assert key.startswith("mcpg_")
    assert len(key) >= len("mcpg_") + 43  # 32 random bytes, URL-safe base64
    assert created.body["prefix"] == key[:12]
    assert created.body["name"] == "ci agent"
    assert created.body["created_by"] == owner.user_id
    assert created.body["last_used_at"] is None

    listed = await api.get(path, auth=owner, expect=200)
    assert listed.body == [{k: v for k, v in created.body.items() if k != "key"}]
    assert key not in str(listed.body)
    # A second key is different and listed first (newest first).
    other = await api.post(path, json={"name": "other"}, auth=owner, expect=201)
    assert other.body["key"] != key
    listed = await api.get(path, auth=owner, expect=200)
    assert [k["id"] for k in listed.body] == [other.body["id"], created.body["id"]]
    for body in ({}, {"name": ""}, {"name": 3}):
        reply = await api.post(path, json=body, auth=owner, expect=422)
        assert reply.detail.startswith("body.name:"), reply.detail


async def test_a_revoked_api_key_is_refused_at_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = await api.org(await api.signup())
    key = await api.api_key(owner)
    await own_invalidation_only(api, monkeypatch)
    # A valid key is known but refused on account endpoints (403); an invalid one is 401.
    await api.get("/auth/me", auth=key, expect=403)
    listed = await api.get(f"/workspaces/{owner.workspace_id}/api-keys", auth=owner, expect=200)
    key_id = listed.body[0]["id"]
    await api.delete(f"/workspaces/{owner.workspace_id}/api-keys/{key_id}", auth=owner, expect=204)
    reply = await api.get("/auth/me", auth=key, expect=401)
    assert "API key" in reply.detail
    listed = await api.get(f"/workspaces/{owner.workspace_id}/api-keys", auth=owner, expect=200)
    assert listed.body == []
    # Revocation is irreversible: a second revoke finds nothing.
    await api.delete(f"/workspaces/{owner.workspace_id}/api-keys/{key_id}", auth=owner, expect=404)


async def test_api_keys_are_refused_on_account_and_workspace_endpoints(api: Api) -> None:
    owner = await api.org(await api.signup())
    key = await api.api_key(owner)
    base = f"/workspaces/{owner.workspace_id}"
    for method, path, body in [
        ("POST", "/auth/login", {"email": owner.email, "password": "password123"}),
        ("POST", "/auth/refresh", {"refresh_token": owner.refresh_token}),
        ("GET", "/auth/me", None),
        ("GET", "/workspaces", None),
        ("GET", base, None),
        ("GET", f"{base}/members", None),
        ("GET", f"{base}/api-keys", None),
        ("POST", f"{base}/api-keys", {"name": "escalate"}),
    ]:
        reply = await api.request(method, path, json=body, auth=key, expect=403)
        assert "API key" in reply.detail
    # The bearer token wins when both are sent.
    both = await api.get("/auth/me", auth=owner, headers={"X-API-Key": key}, expect=200)
    assert both.body["id"] == owner.user_id


# -- bounds: what one workspace (or user) may create ----------------------------------------


async def _burst(api: Api, count: int, method: str, path: str, **kw: Any) -> list[Reply]:
    """`count` identical requests at once (bodies from `body(i)` when given)."""
    make_body = kw.pop("body", None)
    return list(
        await asyncio.gather(
            *(
                api.request(method, path, json=make_body(i) if make_body else None, **kw)
                for i in range(count)
            )
        )
    )


def _statuses(replies: list[Reply]) -> dict[int, int]:
    counted: dict[int, int] = {}
    for reply in replies:
        counted[reply.status] = counted.get(reply.status, 0) + 1
    return counted


async def test_a_burst_of_invitations_stops_at_the_hourly_bound_with_retry_after(
    make_api: AppFactory, smtp: Inbox, db: asyncpg.Connection
) -> None:
    """The spam relay: 100 invitations at once used to be 100 emails in 0.3 s. At the
    defaults, 50 an hour: the 51st is 429 with Retry-After, and no email goes out for it."""
    api = await make_api(smtp_url=smtp.url)
    owner = await api.org(await api.signup(), name="Spam Inc")
    path = f"/workspaces/{owner.workspace_id}/members/invite"
    replies = await _burst(
        api, 100, "POST", path, auth=owner, body=lambda i: {"email": f"target{i}@example.com"}
    )
    assert _statuses(replies) == {201: 50, 429: 50}
    for refused in (r for r in replies if r.status == 429):
        assert 0 < int(refused.headers["Retry-After"]) <= 3600
        assert "GATEWAY_INVITES_PER_HOUR" in refused.detail
    sent = [m for m in await smtp.received(api) if m.recipients[0].startswith("target")]
    assert len(sent) == 50
    assert await db.fetchval("SELECT count(*) FROM invites") == 50
    # Revoking does not give the hour back: each invitation was an email already.
    invite_id = next(r.body["id"] for r in replies if r.status == 201)
    await api.delete(f"/workspaces/{owner.workspace_id}/invites/{invite_id}", auth=owner)
    await api.post(path, json={"email": "one-more@example.com"}, auth=owner, expect=429)
    # Another workspace is not held back by this one.
    other = await api.org(await api.signup(), name="Innocent")
    await api.invite(other, "friend@example.com")


async def test_pending_invitations_stop_at_the_bound(api: Api, db: asyncpg.Connection) -> None:
    """At the defaults: 200 pending (sent over four hours, 50 an hour); the 201st is 422."""
    owner = await api.org(await api.signup())
    path = f"/workspaces/{owner.workspace_id}/members/invite"
    for hour in range(4):
        bodies = [{"email": f"p{hour}-{i}@example.com"} for i in range(50)]
        replies = await _burst(api, 50, "POST", path, auth=owner, body=bodies.__getitem__)
        assert _statuses(replies) == {201: 50}
        await db.execute("UPDATE invites SET created_at = created_at - interval '1 hour'")
    reply = await api.post(path, json={"email": "one-too-many@example.com"}, auth=owner)
    assert reply.status == 422 and "GATEWAY_MAX_PENDING_INVITES_PER_WORKSPACE" in reply.detail
    # Inviting a pending address again replaces its invitation: no more pending than before.
    await api.post(
        path, json={"email": "p0-0@example.com", "role": "admin"}, auth=owner, expect=201
    )
    # Revoking one makes room.
    listed = await api.get(f"/workspaces/{owner.workspace_id}/invites", auth=owner, expect=200)
    assert len(listed.body) == 200
    await api.delete(
        f"/workspaces/{owner.workspace_id}/invites/{listed.body[0]['id']}", auth=owner, expect=204
    )
    await api.post(path, json={"email": "one-too-many@example.com"}, auth=owner, expect=201)


async def test_invitation_bounds_hold_under_concurrent_requests(make_api: AppFactory) -> None:
    api = await make_api(max_pending_invites_per_workspace=3, invites_per_hour=6)
    owner = await api.org(await api.signup())
    path = f"/workspaces/{owner.workspace_id}/members/invite"
    replies = await _burst(
        api, 10, "POST", path, auth=owner, body=lambda i: {"email": f"c{i}@example.com"}
    )
    assert _statuses(replies) == {201: 3, 422: 7}
    listed = await api.get(f"/workspaces/{owner.workspace_id}/invites", auth=owner, expect=200)
    assert len(listed.body) == 3
    # Refused ones were not sent, so they did not count against the hour: two more fit.
    for invite in listed.body[:2]:
        await api.delete(f"/workspaces/{owner.workspace_id}/invites/{invite['id']}", auth=owner)
    replies = await _burst(
        api, 10, "POST", path, auth=owner, body=lambda i: {"email": f"d{i}@example.com"}
    )
    assert _statuses(replies) == {201: 2, 422: 8}
    # Five sent this hour: one more (after a revocation), then the hour is used up.
    listed = await api.get(f"/workspaces/{owner.workspace_id}/invites", auth=owner, expect=200)
    for invite, email in zip(listed.body[:2], ("e@example.com", "f@example.com"), strict=True):
        await api.delete(f"/workspaces/{owner.workspace_id}/invites/{invite['id']}", auth=owner)
        last = await api.post(path, json={"email": email}, auth=owner)
    assert last.status == 429 and "Retry-After" in last.headers
    listed = await api.get(f"/workspaces/{owner.workspace_id}/invites", auth=owner, expect=200)
    assert len(listed.body) == 2


async def test_api_keys_past_the_bound_are_422_even_when_created_at_once(
    make_api: AppFactory,
) -> None:
    api = await make_api(max_api_keys_per_workspace=3)
    owner = await api.org(await api.signup())
    path = f"/workspaces/{owner.workspace_id}/api-keys"
    replies = await _burst(api, 10, "POST", path, auth=owner, body=lambda i: {"name": f"k{i}"})
    assert _statuses(replies) == {201: 3, 422: 7}
    refused = next(r for r in replies if r.status == 422)
    assert "GATEWAY_MAX_API_KEYS_PER_WORKSPACE" in refused.detail
    listed = await api.get(path, auth=owner, expect=200)
    assert len(listed.body) == 3
    # Revoked keys do not count.
    await api.delete(f"{path}/{listed.body[0]['id']}", auth=owner, expect=204)
    await api.post(path, json={"name": "replacement"}, auth=owner, expect=201)
    await api.post(path, json={"name": "one too many"}, auth=owner, expect=422)
    # The bound is the workspace's: another has its own.
    other = await api.org(await api.signup())
    await api.api_key(other)


async def test_api_keys_at_the_default_bound(api: Api) -> None:
    owner = await api.org(await api.signup())
    path = f"/workspaces/{owner.workspace_id}/api-keys"
    replies = await _burst(api, 101, "POST", path, auth=owner, body=lambda i: {"name": f"k{i}"})
    assert _statuses(replies) == {201: 100, 422: 1}


async def test_workspaces_past_the_bound_are_422_even_when_created_at_once(
    make_api: AppFactory,
) -> None:
    """The bound counts every workspace the user belongs to, the personal one included."""
    api = await make_api(max_workspaces_per_user=4)
    ada = await api.signup()
    host = await api.org(await api.signup())
    invite = await api.invite(host, ada.email)
    await api.post(f"/auth/accept-invite/{token_of(invite)}", auth=ada, expect=200)
    replies = await _burst(api, 10, "POST", "/workspaces", auth=ada, body=lambda i: {"name": "W"})
    assert _statuses(replies) == {201: 2, 422: 8}
    refused = next(r for r in replies if r.status == 422)
    assert "GATEWAY_MAX_WORKSPACES_PER_USER" in refused.detail
    listed = await api.get("/workspaces", auth=ada, expect=200)
    assert len(listed.body) == 4
    # Deleting one makes room; other users are not affected.
    created = next(r.body["id"] for r in replies if r.status == 201)
    await api.delete(f"/workspaces/{created}", auth=ada, expect=204)
    await api.post("/workspaces", json={"name": "Again"}, auth=ada, expect=201)
    await api.post("/workspaces", json={"name": "Other"}, auth=host, expect=201)


async def test_names_with_control_characters_are_422_naming_the_field(api: Api) -> None:
    owner = await api.org(await api.signup())
    for name in ("Acme\r\nBcc: victim@example.com", "Acme\nInc", "Acme\x1bInc", "Acme\x9bInc"):
        for method, path in (
            ("POST", "/workspaces"),
            ("PATCH", f"/workspaces/{owner.workspace_id}"),
            ("POST", f"/workspaces/{owner.workspace_id}/api-keys"),
        ):
            reply = await api.request(method, path, json={"name": name}, auth=owner, expect=422)
            assert reply.detail.startswith("body.name:") and "control" in reply.detail, path
    workspace = await api.get(f"/workspaces/{owner.workspace_id}", auth=owner, expect=200)
    assert workspace.body["name"] == "Acme"


async def test_a_removed_admins_api_keys_keep_working_and_are_listed_as_such(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decided: keys belong to the workspace (agents in production depend on them), so they
    outlive their creator's membership; the creator saw the value, so the list says so."""
    owner = await api.org(await api.signup())
    admin = await api.member(owner, "admin")
    theirs = await api.api_key(admin, "admin's agent")
    mine = await api.api_key(owner, "owner's agent")
    path = f"/workspaces/{owner.workspace_id}/api-keys"
    listed = await api.get(path, auth=owner, expect=200)
    assert [k["created_by_former_member"] for k in listed.body] == [False, False]

    await api.delete(
        f"/workspaces/{owner.workspace_id}/members/{admin.user_id}", auth=owner, expect=204
    )
    listed = await api.get(path, auth=owner, expect=200)
    flags = {k["name"]: k["created_by_former_member"] for k in listed.body}
    assert flags == {"admin's agent": True, "owner's agent": False}
    for key in (theirs, mine):
        await api.get("/servers", auth=key, expect=200)
    # Revoking it is the remedy, and takes effect at once.
    [flagged] = [k for k in listed.body if k["created_by_former_member"]]
    await own_invalidation_only(api, monkeypatch)
    await api.delete(f"{path}/{flagged['id']}", auth=owner, expect=204)
    await api.get("/servers", auth=theirs, expect=401)
