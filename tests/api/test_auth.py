"""/auth: signup, login, refresh rotation, /auth/me, switch-workspace, invitations."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import jwt

from gateway.keys import SETTINGS
from gateway.security.tokens import (
    AccessClaims,
    EmailClaims,
    issue_access_token,
    issue_email_token,
)
from tests.helpers.api import Account, Api, AppFactory
from tests.helpers.mail import Inbox


def token_of(invite: dict[str, Any]) -> str:
    url: str = invite["invite_url"]
    return url.rsplit("/", 1)[1]


def claims(access_token: str) -> dict[str, Any]:
    decoded: dict[str, Any] = jwt.decode(access_token, options={"verify_signature": False})
    return decoded


# -- signup ---------------------------------------------------------------------------------


async def test_signup_returns_tokens_scoped_to_a_new_personal_workspace(
    api: Api, db: asyncpg.Connection
) -> None:
    reply = await api.post(
        "/auth/signup",
        json={"email": "ada@example.com", "password": "correct horse", "name": "Ada"},
        expect=201,
    )
    tokens = reply.body
    assert tokens["token_type"] == "bearer"
    assert tokens["expires_in"] == 900
    assert tokens["user"] == {"id": tokens["user"]["id"], "email": "ada@example.com", "name": "Ada"}
    assert tokens["workspace"]["role"] == "owner"
    assert tokens["refresh_token"] and tokens["refresh_token"] != tokens["access_token"]
    access = claims(tokens["access_token"])
    assert access["sub"] == tokens["user"]["id"]
    assert access["wid"] == tokens["workspace"]["id"]
    assert access["type"] == "access"
    assert access["exp"] - access["iat"] == 900

    ada = Account(
        tokens["user"]["id"],
        "ada@example.com",
        tokens["workspace"]["id"],
        tokens["access_token"],
        tokens["refresh_token"],
    )
    workspaces = await api.get("/workspaces", auth=ada, expect=200)
    [personal] = workspaces.body
    assert personal["id"] == tokens["workspace"]["id"]
    assert personal["is_personal"] is True
    assert personal["role"] == "owner"
    # The password is kept only as an argon2id hash.
    stored = await db.fetchval(
        "SELECT password_hash FROM users WHERE id = $1", uuid.UUID(ada.user_id)
    )
    assert stored.startswith("$argon2id$")
    assert "correct horse" not in stored


async def test_emails_are_stored_trimmed_and_lower_cased_and_are_unique(api: Api) -> None:
    ada = await api.signup("  Ada.Lovelace@Example.COM ")
    assert ada.email == "ada.lovelace@example.com"
    me = await api.get("/auth/me", auth=ada, expect=200)
    assert me.body["email"] == "ada.lovelace@example.com"
    reply = await api.post(
        "/auth/signup",
        json={"email": "ADA.lovelace@example.com", "password": "password123", "name": "Other"},
        expect=400,
    )
    assert "email" in reply.detail


_SIGNUP = {"email": "ada@example.com", "password": "password123", "name": "Ada"}

# (change to a valid signup body, the field the 422 must name)
_INVALID_SIGNUPS: list[tuple[dict[str, Any], str]] = [
    ({"password": "short"}, "body.password"),
    ({"password": 12345678}, "body.password"),
    ({"email": "not-an-email"}, "body.email"),
    ({"email": None}, "body.email"),
    ({"name": ""}, "body.name"),
    ({"name": 42}, "body.name"),
    ({"invite_token": 7}, "body.invite_token"),
]


async def test_signup_validation_is_422_naming_the_field_and_ignores_unknown_fields(
    api: Api,
) -> None:
    for change, field in _INVALID_SIGNUPS:
        reply = await api.post("/auth/signup", json={**_SIGNUP, **change}, expect=422)
        assert reply.detail.startswith(f"{field}:"), (change, reply.detail)
    for missing in _SIGNUP:
        body = {k: v for k, v in _SIGNUP.items() if k != missing}
        reply = await api.post("/auth/signup", json=body, expect=422)
        assert reply.detail.startswith(f"body.{missing}:"), reply.detail
        assert "required" in reply.detail.lower()
    # Nothing was created along the way; unknown fields are ignored.
    reply = await api.post("/auth/signup", json={**_SIGNUP, "role": "god"}, expect=201)
    assert reply.body["workspace"]["role"] == "owner"


# -- login ----------------------------------------------------------------------------------


async def test_login_lands_in_the_personal_workspace_and_ignores_email_case(api: Api) -> None:
    ada = await api.signup("ada@example.com", password="correct horse")
    await api.org(ada)  # a later org workspace does not change where login lands
    reply = await api.post(
        "/auth/login",
        json={"email": " ADA@Example.com", "password": "correct horse"},
        expect=200,
    )
    assert reply.body["user"]["id"] == ada.user_id
    assert reply.body["workspace"]["id"] == ada.workspace_id
    assert claims(reply.body["access_token"])["wid"] == ada.workspace_id


async def test_login_of_someone_removed_from_every_workspace_gets_a_new_personal_one(
    api: Api,
) -> None:
    ada = await api.signup("ada@example.com")
    bob = await api.member(ada, "owner")  # a co-owner of Ada's personal workspace
    await api.delete(f"/workspaces/{ada.workspace_id}/members/{ada.user_id}", auth=bob, expect=204)
    reply = await api.post(
        "/auth/login", json={"email": "ada@example.com", "password": "password123"}, expect=200
    )
    assert reply.body["workspace"]["id"] != ada.workspace_id
    assert reply.body["workspace"]["role"] == "owner"
    me = await api.get("/auth/me", auth=ada.scoped(reply.body), expect=200)
    assert [(w["is_personal"], w["role"]) for w in me.body["workspaces"]] == [(True, "owner")]


async def test_failed_logins(api: Api) -> None:
    """A wrong password and an unknown email get the same 401; malformed bodies are 422."""
    await api.signup("ada@example.com", password="correct horse")
    wrong = await api.post(
        "/auth/login", json={"email": "ada@example.com", "password": "wrong horse"}, expect=401
    )
    unknown = await api.post(
        "/auth/login", json={"email": "bob@example.com", "password": "correct horse"}, expect=401
    )
    assert wrong.detail == unknown.detail
    reply = await api.post("/auth/login", json={"email": "ada@example.com"}, expect=422)
    assert reply.detail.startswith("body.password:")
    reply = await api.post("/auth/login", json={"email": 5, "password": "x"}, expect=422)
    assert reply.detail.startswith("body.email:")


async def test_login_and_signup_are_rate_limited_with_retry_after(make_api: AppFactory) -> None:
    api = await make_api(auth_rate_limit="3/minute")
    for _ in range(3):
        await api.post(
            "/auth/login", json={"email": "ada@example.com", "password": "password123"}, expect=401
        )
    limited = await api.post(
        "/auth/login", json={"email": "ada@example.com", "password": "password123"}, expect=429
    )
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert "too many" in limited.detail
    # The limit is per client address too: another email from the same address is refused,
    # and so is signup.
    await api.post(
        "/auth/login", json={"email": "bob@example.com", "password": "password123"}, expect=429
    )
    signup = await api.post(
        "/auth/signup",
        json={"email": "carol@example.com", "password": "password123", "name": "Carol"},
        expect=429,
    )
    assert "Retry-After" in signup.headers


# -- access tokens --------------------------------------------------------------------------


async def test_expired_forged_and_malformed_access_tokens_are_401(api: Api) -> None:
    ada = await api.signup()
    secret = api.app[SETTINGS].jwt_secret
    ids = AccessClaims(uuid.UUID(ada.user_id), uuid.UUID(ada.workspace_id))
    expired = issue_access_token(secret, -60, ids)
    forged = issue_access_token("another-secret-" + "y" * 40, 900, ids)
    for headers in (
        {"Authorization": f"Bearer {expired}"},
        {"Authorization": f"Bearer {forged}"},
        {"Authorization": "Bearer not.a.jwt"},
        {"Authorization": f"Basic {ada.access_token}"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Bearer {ada.refresh_token}"},  # not an access token
        {},
    ):
        reply = await api.get("/auth/me", headers=headers, expect=401)
        assert reply.detail
    expired_reply = await api.get(
        "/auth/me", headers={"Authorization": f"Bearer {expired}"}, expect=401
    )
    assert "expired" in expired_reply.detail


# -- refresh --------------------------------------------------------------------------------


async def test_refresh_rotates_the_refresh_token(api: Api) -> None:
    ada = await api.signup()
    first = await api.post("/auth/refresh", json={"refresh_token": ada.refresh_token}, expect=200)
    assert first.body["refresh_token"] != ada.refresh_token
    assert first.body["user"]["id"] == ada.user_id
    await api.get("/auth/me", auth=ada.scoped(first.body), expect=200)
    second = await api.post(
        "/auth/refresh", json={"refresh_token": first.body["refresh_token"]}, expect=200
    )
    assert second.body["refresh_token"] != first.body["refresh_token"]


async def test_reusing_a_rotated_refresh_token_revokes_the_whole_session(api: Api) -> None:
    ada = await api.signup()
    rotated = await api.post("/auth/refresh", json={"refresh_token": ada.refresh_token}, expect=200)
    newest = rotated.body["refresh_token"]

    # Someone presents the old token again: theft is assumed.
    reused = await api.post("/auth/refresh", json={"refresh_token": ada.refresh_token}, expect=401)
    assert reused.detail
    # Every token of that session is dead, including the newest one.
    await api.post("/auth/refresh", json={"refresh_token": newest}, expect=401)
    # Other sessions (another login) are unaffected.
    login = await api.post(
        "/auth/login", json={"email": ada.email, "password": "password123"}, expect=200
    )
    await api.post("/auth/refresh", json={"refresh_token": login.body["refresh_token"]}, expect=200)


async def test_refresh_with_an_unknown_expired_or_missing_token(
    api: Api, db: asyncpg.Connection
) -> None:
    ada = await api.signup()
    await api.post("/auth/refresh", json={"refresh_token": "no-such-token"}, expect=401)
    reply = await api.post("/auth/refresh", json={}, expect=422)
    assert reply.detail.startswith("body.refresh_token:")
    await db.execute("UPDATE refresh_tokens SET expires_at = now() - interval '1 second'")
    await api.post("/auth/refresh", json={"refresh_token": ada.refresh_token}, expect=401)


async def test_refresh_keeps_the_session_workspace_while_the_user_belongs_to_it(
    api: Api,
) -> None:
    owner = await api.org(await api.signup())  # switch-workspace: a session scoped to the org
    reply = await api.post("/auth/refresh", json={"refresh_token": owner.refresh_token})
    assert reply.status == 200  # no Authorization header needed
    assert reply.body["workspace"]["id"] == owner.workspace_id
    assert claims(reply.body["access_token"])["wid"] == owner.workspace_id

    bob = await api.member(owner)  # bob's session is scoped to the org too
    await api.delete(
        f"/workspaces/{owner.workspace_id}/members/{bob.user_id}", auth=owner, expect=204
    )
    # His access token still names the org, which he is no longer in.
    me = await api.get("/auth/me", auth=bob, expect=200)
    assert me.body["current_workspace"] is None
    assert [w["is_personal"] for w in me.body["workspaces"]] == [True]
    # Refreshing lands him in his personal workspace.
    reply = await api.post("/auth/refresh", json={"refresh_token": bob.refresh_token}, expect=200)
    personal = me.body["workspaces"][0]
    assert reply.body["workspace"]["id"] == personal["id"]
    me = await api.get("/auth/me", auth=bob.scoped(reply.body), expect=200)
    assert me.body["current_workspace"]["id"] == personal["id"]


# -- /auth/me -------------------------------------------------------------------------------


async def test_me_shows_current_workspace_workspaces_and_pending_invites(api: Api) -> None:
    owner = await api.org(await api.signup(name="Olga"), name="Acme")
    ada = await api.signup("ada@example.com", name="Ada")
    invite = await api.invite(owner, "ADA@example.com", role="admin")

    me = await api.get("/auth/me", auth=ada, expect=200)
    assert me.body["id"] == ada.user_id
    assert me.body["email"] == "ada@example.com"
    assert me.body["name"] == "Ada"
    assert set(me.body["current_workspace"]) == {"id", "name", "slug", "role"}
    assert me.body["current_workspace"]["id"] == ada.workspace_id
    assert me.body["current_workspace"]["role"] == "owner"
    [personal] = me.body["workspaces"]
    assert personal == {**me.body["current_workspace"], "is_personal": True}
    assert me.body["email_verified"] is False
    [pending] = me.body["pending_invites"]
    assert pending["id"] == invite["id"]
    # Signing up with an address proves nothing: no token until the address is verified.
    assert pending["token"] is None
    assert pending["workspace_id"] == owner.workspace_id
    assert pending["workspace_name"] == "Acme"
    assert pending["role"] == "admin"
    assert pending["invited_by"] == owner.user_id
    assert pending["expires_at"] == invite["expires_at"]

    # Once accepted (with the emailed link), the invitation leaves the list and the workspace
    # joins it.
    await api.post(f"/auth/accept-invite/{token_of(invite)}", auth=ada, expect=200)
    me = await api.get("/auth/me", auth=ada, expect=200)
    assert me.body["pending_invites"] == []
    assert {(w["id"], w["role"], w["is_personal"]) for w in me.body["workspaces"]} == {
        (ada.workspace_id, "owner", True),
        (owner.workspace_id, "admin", False),
    }


async def test_me_hides_expired_and_revoked_invites(api: Api, db: asyncpg.Connection) -> None:
    owner = await api.org(await api.signup())
    ada = await api.signup("ada@example.com")
    expired = await api.invite(owner, "ada@example.com")
    await db.execute(
        "UPDATE invites SET expires_at = now() - interval '1 second' WHERE id = $1",
        uuid.UUID(expired["id"]),
    )
    other_org = await api.org(await api.signup(), name="Other")
    revoked = await api.invite(other_org, "ada@example.com")
    await api.delete(
        f"/workspaces/{other_org.workspace_id}/invites/{revoked['id']}", auth=other_org, expect=204
    )
    me = await api.get("/auth/me", auth=ada, expect=200)
    assert me.body["pending_invites"] == []


# -- switch-workspace -----------------------------------------------------------------------


async def test_switch_workspace_returns_tokens_scoped_to_a_workspace_of_the_user(
    api: Api,
) -> None:
    ada = await api.signup()
    org = await api.post("/workspaces", json={"name": "Acme"}, auth=ada, expect=201)
    reply = await api.post(
        "/auth/switch-workspace", json={"workspace_id": org.body["id"]}, auth=ada, expect=200
    )
    assert reply.body["workspace"] == {
        "id": org.body["id"],
        "name": "Acme",
        "slug": org.body["slug"],
        "role": "owner",
    }
    assert claims(reply.body["access_token"])["wid"] == org.body["id"]
    me = await api.get("/auth/me", auth=ada.scoped(reply.body), expect=200)
    assert me.body["current_workspace"]["id"] == org.body["id"]
    # And back to the personal workspace.
    back = await api.post(
        "/auth/switch-workspace", json={"workspace_id": ada.workspace_id}, auth=ada, expect=200
    )
    assert back.body["workspace"]["id"] == ada.workspace_id
    # Only to workspaces the user belongs to.
    stranger = await api.signup()
    await api.post(
        "/auth/switch-workspace",
        json={"workspace_id": stranger.workspace_id},
        auth=ada,
        expect=404,
    )
    await api.post(
        "/auth/switch-workspace", json={"workspace_id": str(uuid.uuid4())}, auth=ada, expect=404
    )
    reply = await api.post(
        "/auth/switch-workspace", json={"workspace_id": "nope"}, auth=ada, expect=422
    )
    assert "body.workspace_id" in reply.detail


# -- invitations ----------------------------------------------------------------------------


async def test_accept_invite_joins_with_the_invited_role_and_scopes_tokens(api: Api) -> None:
    owner = await api.org(await api.signup(), name="Acme")
    ada = await api.signup("ada@example.com")
    invite = await api.invite(owner, "Ada@Example.com", role="admin")
    assert invite["email"] == "ada@example.com"

    reply = await api.post(f"/auth/accept-invite/{token_of(invite)}", auth=ada, expect=200)
    assert reply.body["workspace"]["id"] == owner.workspace_id
    assert reply.body["workspace"]["role"] == "admin"
    assert reply.body["user"]["id"] == ada.user_id
    assert claims(reply.body["access_token"])["wid"] == owner.workspace_id
    members = await api.get(f"/workspaces/{owner.workspace_id}/members", auth=owner, expect=200)
    assert {(m["user_id"], m["role"]) for m in members.body} == {
        (owner.user_id, "owner"),
        (ada.user_id, "admin"),
    }
    # Accepted: it no longer counts as pending, and the token cannot be used again.
    invites = await api.get(f"/workspaces/{owner.workspace_id}/invites", auth=owner, expect=200)
    assert invites.body == []
    await api.post(f"/auth/accept-invite/{token_of(invite)}", auth=ada, expect=404)


async def test_accept_invite_needs_the_invitees_own_login(api: Api) -> None:
    owner = await api.org(await api.signup())
    invite = await api.invite(owner, "ada@example.com")
    await api.post(f"/auth/accept-invite/{token_of(invite)}", expect=401)
    mallory = await api.signup("mallory@example.com")
    reply = await api.post(f"/auth/accept-invite/{token_of(invite)}", auth=mallory, expect=403)
    assert "email" in reply.detail
    # The invitation is still there for the right person.
    ada = await api.signup("ada@example.com")
    await api.post(f"/auth/accept-invite/{token_of(invite)}", auth=ada, expect=200)


async def test_expired_revoked_and_unknown_invite_tokens_are_404(
    api: Api, db: asyncpg.Connection
) -> None:
    owner = await api.org(await api.signup())
    ada = await api.signup("ada@example.com")
    await api.post("/auth/accept-invite/no-such-token", auth=ada, expect=404)

    revoked = await api.invite(owner, "ada@example.com")
    await api.delete(
        f"/workspaces/{owner.workspace_id}/invites/{revoked['id']}", auth=owner, expect=204
    )
    await api.post(f"/auth/accept-invite/{token_of(revoked)}", auth=ada, expect=404)

    expired = await api.invite(owner, "ada@example.com")
    await db.execute(
        "UPDATE invites SET expires_at = now() - interval '1 second' WHERE id = $1",
        uuid.UUID(expired["id"]),
    )
    await api.post(f"/auth/accept-invite/{token_of(expired)}", auth=ada, expect=404)
    members = await api.get(f"/workspaces/{owner.workspace_id}/members", auth=owner, expect=200)
    assert ada.user_id not in {m["user_id"] for m in members.body}


async def test_signup_with_invite_token_joins_the_org_at_once(api: Api) -> None:
    owner = await api.org(await api.signup(), name="Acme")
    invite = await api.invite(owner, "ada@example.com", role="admin")
    reply = await api.post(
        "/auth/signup",
        json={
            "email": "ADA@example.com",
            "password": "password123",
            "name": "Ada",
            "invite_token": token_of(invite),
        },
        expect=201,
    )
    assert reply.body["workspace"]["id"] == owner.workspace_id
    assert reply.body["workspace"]["role"] == "admin"
    ada = Account(
        reply.body["user"]["id"],
        "ada@example.com",
        owner.workspace_id,
        reply.body["access_token"],
        reply.body["refresh_token"],
    )
    me = await api.get("/auth/me", auth=ada, expect=200)
    assert me.body["current_workspace"]["id"] == owner.workspace_id
    # The personal workspace is created as well.
    assert sorted((w["is_personal"], w["role"]) for w in me.body["workspaces"]) == [
        (False, "admin"),
        (True, "owner"),
    ]
    assert me.body["pending_invites"] == []


async def test_signup_with_a_foreign_or_unknown_invite_token_creates_nothing(
    api: Api,
) -> None:
    owner = await api.org(await api.signup())
    invite = await api.invite(owner, "ada@example.com")
    body = {
        "email": "mallory@example.com",
        "password": "password123",
        "name": "Mallory",
        "invite_token": token_of(invite),
    }
    reply = await api.post("/auth/signup", json=body, expect=400)
    assert "email" in reply.detail
    await api.post("/auth/signup", json={**body, "invite_token": "no-such-token"}, expect=404)
    # No account was created: the same email can still sign up (without the invitation).
    del body["invite_token"]
    await api.post("/auth/signup", json=body, expect=201)


def _parse(timestamp: str) -> datetime:
    parsed = datetime.fromisoformat(timestamp)
    assert parsed.utcoffset() == timedelta(0), timestamp
    return parsed


async def test_signup_policy(make_api: AppFactory) -> None:
    """GATEWAY_SIGNUP: open to anyone (the default), to invited people only, or closed."""
    body = {"email": "new@example.com", "password": "password123", "name": "New"}
    closed = await make_api(signup="closed")
    reply = await closed.post("/auth/signup", json=body, expect=403)
    assert reply.detail.startswith("signing up is closed on this gateway")
    invite_only = await make_api(signup="invite")
    reply = await invite_only.post("/auth/signup", json=body, expect=403)
    assert "needs an invitation" in reply.detail
    # Somebody already in (created another way) invites: the invitee may sign up.
    open_ = await make_api()
    owner = await open_.org(await open_.signup())
    invite = await open_.invite(owner, "new@example.com")
    token = invite["invite_url"].rsplit("/", 1)[1]
    created = await invite_only.post(
        "/auth/signup", json={**body, "invite_token": token}, expect=201
    )
    assert created.body["workspace"]["id"] == owner.workspace_id


# -- invitation takeover: only whoever controls the address accepts ------------------------


async def test_someone_who_signs_up_with_an_invited_address_gets_no_token_and_cannot_join(
    api: Api,
) -> None:
    """The attack: with open signup, whoever signs up first with an invited address used to
    read the invitation's token in /auth/me and join in the invited role (admin included)."""
    owner = await api.org(await api.signup(name="Olga"), name="Acme")
    invite = await api.invite(owner, "ada@example.com", role="admin")
    mallory = await api.signup("ada@example.com", name="Not Ada")

    me = await api.get("/auth/me", auth=mallory, expect=200)
    assert me.body["email_verified"] is False
    [pending] = me.body["pending_invites"]
    assert pending == {
        "id": invite["id"],
        "token": None,
        "workspace_id": owner.workspace_id,
        "workspace_name": "Acme",
        "role": "admin",
        "invited_by": owner.user_id,
        "created_at": invite["created_at"],
        "expires_at": invite["expires_at"],
    }
    assert token_of(invite) not in str(me.body)
    # No other way to the token: guessing is 404, and the address cannot be verified without
    # the gateway emailing it (no SMTP_URL here).
    await api.post(f"/auth/accept-invite/{'x' * 43}", auth=mallory, expect=404)
    reply = await api.post("/auth/verify-email/send", auth=mallory, expect=400)
    assert "SMTP_URL" in reply.detail
    forged = issue_email_token("another-secret-" + "x" * 40, EmailClaims(_uid(mallory), _ADA), 60)
    await api.post("/auth/verify-email", json={"token": forged}, auth=mallory, expect=400)

    members = await api.get(f"/workspaces/{owner.workspace_id}/members", auth=owner, expect=200)
    assert mallory.user_id not in {m["user_id"] for m in members.body}
    pending_list = await api.get(f"/workspaces/{owner.workspace_id}/invites", auth=owner)
    assert [i["id"] for i in pending_list.body] == [invite["id"]]


async def test_the_emailed_verification_link_verifies_the_address_and_shows_the_tokens(
    make_api: AppFactory, smtp: Inbox
) -> None:
    api = await make_api(smtp_url=smtp.url)
    owner = await api.org(await api.signup(name="Olga"), name="Acme")
    invite = await api.invite(owner, "ada@example.com", role="admin")
    ada = await api.signup("ada@example.com", name="Ada")
    me = await api.get("/auth/me", auth=ada, expect=200)
    assert me.body["email_verified"] is False
    assert me.body["pending_invites"][0]["token"] is None

    # Signup emailed the link to the address (and only there).
    [invitation, verification] = await smtp.received(api, "ada@example.com")
    assert invite["invite_url"] in invitation.body
    token = verification.link("/verify-email")
    reply = await api.post("/auth/verify-email", json={"token": token}, auth=ada, expect=200)
    assert reply.body["email_verified"] is True
    [pending] = reply.body["pending_invites"]
    assert pending["token"] == token_of(invite)
    me = await api.get("/auth/me", auth=ada, expect=200)
    assert me.body == reply.body
    # Verifying again is harmless; the token shown accepts the invitation.
    await api.post("/auth/verify-email", json={"token": token}, auth=ada, expect=200)
    joined = await api.post(f"/auth/accept-invite/{pending['token']}", auth=ada, expect=200)
    assert (joined.body["workspace"]["id"], joined.body["workspace"]["role"]) == (
        owner.workspace_id,
        "admin",
    )
    reply = await api.post("/auth/verify-email/send", auth=ada, expect=400)
    assert "already verified" in reply.detail


async def test_a_verification_link_works_only_for_the_account_it_was_sent_for(
    make_api: AppFactory, smtp: Inbox
) -> None:
    """Mallory signs up with Ada's address, so the link reaches Ada: Ada clicking it (signed in
    to her own account, or not at all) must not verify Mallory's account."""
    api = await make_api(smtp_url=smtp.url)
    mallory = await api.signup(_ADA)
    [mail] = await smtp.received(api, _ADA)
    token = mail.link("/verify-email")
    ada = await api.signup("ada@another.example")
    reply = await api.post("/auth/verify-email", json={"token": token}, auth=ada, expect=403)
    assert "another account" in reply.detail
    await api.post("/auth/verify-email", json={"token": token}, expect=401)
    me = await api.get("/auth/me", auth=mallory, expect=200)
    assert me.body["email_verified"] is False

    # Bound to its purpose: it is not an access token, nor is an access token one of these.
    await api.get("/auth/me", headers={"Authorization": f"Bearer {token}"}, expect=401)
    reply = await api.post(
        "/auth/verify-email", json={"token": mallory.access_token}, auth=mallory, expect=400
    )
    assert "not valid" in reply.detail
    # And expiring.
    secret = api.app[SETTINGS].jwt_secret
    expired = issue_email_token(secret, EmailClaims(_uid(mallory), _ADA), -1)
    reply = await api.post("/auth/verify-email", json={"token": expired}, auth=mallory)
    assert reply.status == 400 and "expired" in reply.detail
    # A link made for another address of the account verifies nothing.
    elsewhere = issue_email_token(secret, EmailClaims(_uid(mallory), "old@example.com"), 60)
    await api.post("/auth/verify-email", json={"token": elsewhere}, auth=mallory, expect=400)
    me = await api.get("/auth/me", auth=mallory, expect=200)
    assert me.body["email_verified"] is False


async def test_verification_emails_are_rate_limited_per_address(
    make_api: AppFactory, smtp: Inbox
) -> None:
    """Each goes to an address anyone may type at signup: three an hour, signup's included."""
    api = await make_api(smtp_url=smtp.url)
    ada = await api.signup(_ADA)
    for _ in range(2):
        sent = await api.post("/auth/verify-email/send", auth=ada, expect=200)
        assert sent.body["email"] == _ADA
        assert _parse(sent.body["expires_at"]) > datetime.now(UTC) + timedelta(hours=23)
    reply = await api.post("/auth/verify-email/send", auth=ada, expect=429)
    assert 0 < int(reply.headers["Retry-After"]) <= 3600
    mails = await smtp.received(api, _ADA)
    assert len(mails) == 3
    # Every link works (the last one here).
    token = mails[-1].link("/verify-email")
    await api.post("/auth/verify-email", json={"token": token}, auth=ada, expect=200)


# -- logout and password change ------------------------------------------------------------


async def test_logout_ends_the_refresh_family(api: Api) -> None:
    ada = await api.signup()
    phone = await api.post(
        "/auth/login", json={"email": ada.email, "password": "password123"}, expect=200
    )
    rotated = await api.post("/auth/refresh", json={"refresh_token": ada.refresh_token}, expect=200)
    await api.post(
        "/auth/logout", json={"refresh_token": rotated.body["refresh_token"]}, expect=204
    )
    for ended in (rotated.body["refresh_token"], ada.refresh_token):
        await api.post("/auth/refresh", json={"refresh_token": ended}, expect=401)
    # Another session of the same user goes on.
    await api.post("/auth/refresh", json={"refresh_token": phone.body["refresh_token"]}, expect=200)
    # Nothing to end is no error; a body is needed; API keys manage no accounts.
    await api.post("/auth/logout", json={"refresh_token": "no-such-token"}, expect=204)
    reply = await api.post("/auth/logout", json={}, expect=422)
    assert reply.detail.startswith("body.refresh_token:")
    owner = await api.org(ada.scoped(phone.body))
    await api.post(
        "/auth/logout", json={"refresh_token": "x"}, auth=await api.api_key(owner), expect=403
    )


async def test_a_password_change_ends_every_session_and_the_new_password_works(
    api: Api,
) -> None:
    ada = await api.signup(_ADA)
    org = await api.org(ada)
    laptop = await api.post("/auth/login", json={"email": _ADA, "password": "password123"})

    reply = await api.post(
        "/auth/change-password",
        json={"current_password": "wrong password", "new_password": "new password 1"},
        auth=org,
        expect=403,
    )
    assert "current_password" in reply.detail
    await api.post("/auth/refresh", json={"refresh_token": ada.refresh_token}, expect=200)

    changed = await api.post(
        "/auth/change-password",
        json={"current_password": "password123", "new_password": "new password 1"},
        auth=org,
        expect=200,
    )
    # The caller stays signed in, in the workspace they were in.
    assert changed.body["workspace"]["id"] == org.workspace_id
    assert changed.body["user"]["id"] == ada.user_id
    for ended in (org.refresh_token, laptop.body["refresh_token"]):
        await api.post("/auth/refresh", json={"refresh_token": ended}, expect=401)
    fresh = await api.post(
        "/auth/refresh", json={"refresh_token": changed.body["refresh_token"]}, expect=200
    )
    await api.get("/auth/me", auth=org.scoped(fresh.body), expect=200)
    old = {"email": _ADA, "password": "password123"}
    await api.post("/auth/login", json=old, expect=401)
    await api.post("/auth/login", json={**old, "password": "new password 1"}, expect=200)

    reply = await api.post(
        "/auth/change-password",
        json={"current_password": "new password 1", "new_password": "short"},
        auth=org,
        expect=422,
    )
    assert reply.detail.startswith("body.new_password:")


async def test_password_change_attempts_are_rate_limited_like_logins(
    make_api: AppFactory,
) -> None:
    api = await make_api(auth_rate_limit="3/minute")
    ada = await api.signup()  # one attempt of the three
    body = {"current_password": "guess one", "new_password": "new password 1"}
    for _ in range(2):
        await api.post("/auth/change-password", json=body, auth=ada, expect=403)
    reply = await api.post(
        "/auth/change-password",
        json={**body, "current_password": "password123"},
        auth=ada,
        expect=429,
    )
    assert int(reply.headers["Retry-After"]) > 0


async def test_names_with_control_characters_are_refused_naming_the_field(api: Api) -> None:
    for name in ("Ada\r\nBcc: victim@example.com", "Ada\nLovelace", "Ada\tL", "Ada\x85L"):
        body = {"email": "ada@example.com", "password": "password123", "name": name}
        reply = await api.post("/auth/signup", json=body, expect=422)
        assert reply.detail.startswith("body.name:") and "control" in reply.detail
    # Blanks around a name are still trimmed away, line breaks included.
    ada = await api.signup(_ADA, name="  Ada Lovelace\n")
    me = await api.get("/auth/me", auth=ada, expect=200)
    assert me.body["name"] == "Ada Lovelace"


_ADA = "ada@example.com"


def _uid(account: Account) -> uuid.UUID:
    return uuid.UUID(account.user_id)
