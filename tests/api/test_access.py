"""Who may call what: every endpoint of the OpenAPI document x every kind of caller.

The table below has one row per operation. The test walks the OpenAPI document, so an
endpoint added without a row here fails until its row is written. Columns are the callers:

    anon      no credentials
    key       an API key of the workspace
    outsider  a logged-in user who belongs to another workspace only
    member    member of the workspace;  admin, owner: likewise

Each call gets fresh path values and a fresh body from the row's factories, so one caller's
success (a deletion, say) never decides what the next caller sees. Servers point at a port
where nothing listens, so a proxied request that gets past authorisation answers 502.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.keys import SETTINGS
from gateway.security.tokens import (
    EMAIL_VERIFICATION_TTL_SECONDS,
    EmailClaims,
    issue_email_token,
)
from tests.helpers.alerting import add_rule, add_server, evaluate, ingest
from tests.helpers.api import Account, Api, Credential

CALLERS = ("anon", "key", "outsider", "member", "admin", "owner")
_fresh = itertools.count(1)


@dataclass
class World:
    """One org workspace with an owner, an admin, a member and an API key, a user of another
    workspace, and a host workspace that invites people (for accept-invite)."""

    api: Api
    owner: Account
    admin: Account
    member: Account
    outsider: Account
    host: Account
    key: str
    password: str = "password123"
    _server_id: str | None = None
    _event_id: str | None = None
    _toolset_id: str | None = None

    @property
    def ws(self) -> str:
        return self.owner.workspace_id

    def credential(self, caller: str) -> Credential:
        return None if caller == "anon" else self.key if caller == "key" else getattr(self, caller)

    async def server_id(self) -> str:
        """A server of the workspace, shared by the rows that only read it."""
        if self._server_id is None:
            self._server_id = await add_server(self.api, self.owner, "shared")
        return self._server_id

    async def toolset_id(self) -> str:
        """A toolset of the workspace over the shared server, for the rows that only read it."""
        if self._toolset_id is None:
            reply = await self.api.post(
                "/toolsets",
                json={"name": "shared", "servers": [{"server_id": await self.server_id()}]},
                auth=self.owner,
                expect=201,
            )
            self._toolset_id = reply.body["id"]
        return self._toolset_id

    async def event_id(self) -> str:
        """An alert event of the workspace: a rule that fires on one tool call."""
        if self._event_id is None:
            server_id = await self.server_id()
            await add_rule(self.api, self.owner, metric="call_count", operator=">=", threshold=1)
            await ingest(self.api, self.owner, server_id, [{}])
            await evaluate(self.api)
            reply = await self.api.get("/alerts/events", auth=self.owner, expect=200)
            self._event_id = reply.body["items"][0]["id"]
        return self._event_id

    def account(self, caller: str) -> Account:
        """The account a caller acts as (anonymous callers and keys act on the host's behalf
        where an account is needed, e.g. whose login to send)."""
        return getattr(self, caller) if caller not in ("anon", "key") else self.host


async def build_world(api: Api) -> World:
    owner = await api.org(await api.signup(name="Owner"), name="Acme")
    admin = await api.member(owner, "admin")
    member = await api.member(owner, "member")
    outsider = await api.org(await api.signup(name="Outsider"), name="Elsewhere")
    host = await api.org(await api.signup(name="Host"), name="Host")
    key = await api.api_key(owner)
    return World(api, owner, admin, member, outsider, host, key)


# -- factories: fresh things for one call ---------------------------------------------------

Factory = Callable[[World, str], Awaitable[Any]]


async def no_params(w: World, caller: str) -> dict[str, str]:
    return {}


async def workspace(w: World, caller: str) -> dict[str, str]:
    return {"workspace_id": w.ws}


async def fresh_org(w: World, caller: str) -> dict[str, str]:
    """A new org with the same people in the same roles, to be deleted."""
    api = w.api
    created = await api.post("/workspaces", json={"name": "Doomed"}, auth=w.owner, expect=201)
    org = dataclasses.replace(w.owner, workspace_id=created.body["id"])
    for person, role in ((w.admin, "admin"), (w.member, "member")):
        invite = await api.invite(org, person.email, role)
        token = invite["invite_url"].rsplit("/", 1)[1]
        await api.post(f"/auth/accept-invite/{token}", auth=person, expect=200)
    return {"workspace_id": created.body["id"]}


async def member_target(w: World, caller: str) -> dict[str, str]:
    """A plain member to act on: the host, (re)joined as a member."""
    api = w.api
    reply = await api.post(
        f"/workspaces/{w.ws}/members/invite",
        json={"email": w.host.email, "role": "member"},
        auth=w.owner,
    )
    if reply.status == 201:  # else 400: still a member from an earlier call
        token = reply.body["invite_url"].rsplit("/", 1)[1]
        await api.post(f"/auth/accept-invite/{token}", auth=w.host, expect=200)
    return {"workspace_id": w.ws, "user_id": w.host.user_id}


async def fresh_invite(w: World, caller: str) -> dict[str, str]:
    invite = await w.api.invite(w.owner, f"invitee{next(_fresh)}@example.com")
    return {"workspace_id": w.ws, "invite_id": invite["id"]}


async def fresh_key(w: World, caller: str) -> dict[str, str]:
    reply = await w.api.post(
        f"/workspaces/{w.ws}/api-keys", json={"name": "target"}, auth=w.owner, expect=201
    )
    return {"workspace_id": w.ws, "key_id": reply.body["id"]}


async def invite_for_caller(w: World, caller: str) -> dict[str, str]:
    """An invitation to the host workspace, sent to the caller's own email."""
    email = w.account(caller).email if caller not in ("anon", "key") else "nobody@example.com"
    invite = await w.api.invite(w.host, email)
    return {"token": invite["invite_url"].rsplit("/", 1)[1]}


async def server(w: World, caller: str) -> dict[str, str]:
    return {"server_id": await w.server_id()}


async def fresh_server(w: World, caller: str) -> dict[str, str]:
    return {"server_id": await add_server(w.api, w.owner, f"doomed-{next(_fresh)}")}


async def any_id(w: World, caller: str) -> dict[str, str]:
    """Where nothing is looked up by the id (OAuth's resource metadata)."""
    return {"id": str(uuid.uuid4())}


async def toolset(w: World, caller: str) -> dict[str, str]:
    return {"toolset_id": await w.toolset_id()}


async def fresh_toolset(w: World, caller: str) -> dict[str, str]:
    reply = await w.api.post(
        "/toolsets", json={"name": f"doomed-{next(_fresh)}"}, auth=w.owner, expect=201
    )
    return {"toolset_id": reply.body["id"]}


async def rule(w: World, caller: str) -> dict[str, str]:
    created = await add_rule(w.api, w.owner, name=f"rule-{next(_fresh)}", metric="call_count")
    return {"rule_id": created["id"]}


async def event(w: World, caller: str) -> dict[str, str]:
    return {"event_id": await w.event_id()}


def body(value: Any) -> Factory:
    async def make(w: World, caller: str) -> Any:
        return value

    return make


async def signup_body(w: World, caller: str) -> dict[str, str]:
    return {"email": f"new{next(_fresh)}@example.com", "password": w.password, "name": "New"}


async def login_body(w: World, caller: str) -> dict[str, str]:
    return {"email": w.account(caller).email, "password": w.password}


async def refresh_body(w: World, caller: str) -> dict[str, str]:
    login = await w.api.post("/auth/login", json=await login_body(w, caller), expect=200)
    return {"refresh_token": login.body["refresh_token"]}


async def password_body(w: World, caller: str) -> dict[str, str]:
    """The same password again: it still ends the caller's other sessions, and later rows
    log in as before."""
    return {"current_password": w.password, "new_password": w.password}


async def verification_body(w: World, caller: str) -> dict[str, str]:
    """The token a verification email to the caller's own address would carry."""
    account = w.account(caller)
    claims = EmailClaims(uuid.UUID(account.user_id), account.email)
    secret = w.api.app[SETTINGS].jwt_secret
    return {"token": issue_email_token(secret, claims, EMAIL_VERIFICATION_TTL_SECONDS)}


async def switch_body(w: World, caller: str) -> dict[str, str]:
    return {"workspace_id": w.ws}


async def server_body(w: World, caller: str) -> dict[str, str]:
    return {"name": f"server-{next(_fresh)}", "url": "http://127.0.0.1:9/mcp"}


async def toolset_body(w: World, caller: str) -> dict[str, Any]:
    return {"name": f"toolset-{next(_fresh)}"}


async def tool_call_body(w: World, caller: str) -> dict[str, str]:
    return {"server_id": await w.server_id(), "tool_name": "echo", "status": "success"}


async def rule_body(w: World, caller: str) -> dict[str, Any]:
    return {
        "name": f"rule-{next(_fresh)}",
        "metric": "error_rate",
        "operator": ">",
        "threshold": 0.5,
        "window_minutes": 5,
    }


_RPC = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
}


async def invite_body(w: World, caller: str) -> dict[str, str]:
    return {"email": f"invitee{next(_fresh)}@example.com"}


# -- the table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    expect: tuple[int, int, int, int, int, int]  # in the order of CALLERS
    params: Factory = no_params
    body: Factory | None = None


R = Row
ROWS: dict[tuple[str, str], Row] = {
    #                                          anon key  outsider member admin owner
    ("GET", "/openapi.json"): R((200, 200, 200, 200, 200, 200)),
    ("GET", "/docs"): R((200, 200, 200, 200, 200, 200)),
    ("GET", "/metrics"): R((200, 200, 200, 200, 200, 200)),
    # Outside /api/v1, for load balancers: open to anyone.
    ("GET", "/healthz"): R((200, 200, 200, 200, 200, 200)),
    ("GET", "/readyz"): R((200, 200, 200, 200, 200, 200)),
    # OAuth (outside /api/v1): off here (PUBLIC_URL is plain http), 404 saying so to anyone;
    # the consent form without its CSRF token is refused before anything else.
    ("GET", "/.well-known/oauth-authorization-server"): R((404, 404, 404, 404, 404, 404)),
    ("GET", "/.well-known/oauth-protected-resource/api/v1/proxy/{id}/mcp"): R(
        (404, 404, 404, 404, 404, 404), params=any_id
    ),
    ("GET", "/.well-known/oauth-protected-resource/api/v1/toolsets/{id}/mcp"): R(
        (404, 404, 404, 404, 404, 404), params=any_id
    ),
    ("POST", "/oauth/register"): R((404, 404, 404, 404, 404, 404)),
    ("POST", "/oauth/token"): R((404, 404, 404, 404, 404, 404)),
    ("POST", "/oauth/revoke"): R((404, 404, 404, 404, 404, 404)),
    ("GET", "/oauth/authorize"): R((404, 404, 404, 404, 404, 404)),
    ("POST", "/oauth/authorize"): R((403, 403, 403, 403, 403, 403)),
    ("POST", "/auth/signup"): R((201, 403, 201, 201, 201, 201), body=signup_body),
    ("POST", "/auth/login"): R((200, 403, 200, 200, 200, 200), body=login_body),
    ("POST", "/auth/refresh"): R((200, 403, 200, 200, 200, 200), body=refresh_body),
    ("POST", "/auth/logout"): R((204, 403, 204, 204, 204, 204), body=refresh_body),
    ("POST", "/auth/change-password"): R((401, 403, 200, 200, 200, 200), body=password_body),
    ("POST", "/auth/verify-email"): R((401, 403, 200, 200, 200, 200), body=verification_body),
    # 400: this gateway sends no email (no SMTP_URL), so there is nothing to send with.
    ("POST", "/auth/verify-email/send"): R((401, 403, 400, 400, 400, 400)),
    ("GET", "/auth/me"): R((401, 403, 200, 200, 200, 200)),
    ("POST", "/auth/switch-workspace"): R((401, 403, 404, 200, 200, 200), body=switch_body),
    ("POST", "/auth/accept-invite/{token}"): R(
        (401, 403, 200, 200, 200, 200), params=invite_for_caller
    ),
    ("GET", "/workspaces"): R((401, 403, 200, 200, 200, 200)),
    ("POST", "/workspaces"): R((401, 403, 201, 201, 201, 201), body=body({"name": "New"})),
    ("GET", "/workspaces/{workspace_id}"): R((401, 403, 404, 200, 200, 200), params=workspace),
    ("PATCH", "/workspaces/{workspace_id}"): R(
        (401, 403, 404, 403, 200, 200), params=workspace, body=body({"name": "Acme"})
    ),
    ("DELETE", "/workspaces/{workspace_id}"): R((401, 403, 404, 403, 403, 204), params=fresh_org),
    ("GET", "/workspaces/{workspace_id}/members"): R(
        (401, 403, 404, 200, 200, 200), params=workspace
    ),
    ("POST", "/workspaces/{workspace_id}/members/invite"): R(
        (401, 403, 404, 403, 201, 201),
        params=workspace,
        body=invite_body,
    ),
    ("PATCH", "/workspaces/{workspace_id}/members/{user_id}"): R(
        (401, 403, 404, 403, 403, 200), params=member_target, body=body({"role": "member"})
    ),
    ("DELETE", "/workspaces/{workspace_id}/members/{user_id}"): R(
        (401, 403, 404, 403, 204, 204), params=member_target
    ),
    ("GET", "/workspaces/{workspace_id}/invites"): R(
        (401, 403, 404, 200, 200, 200), params=workspace
    ),
    ("DELETE", "/workspaces/{workspace_id}/invites/{invite_id}"): R(
        (401, 403, 404, 403, 204, 204), params=fresh_invite
    ),
    ("GET", "/workspaces/{workspace_id}/api-keys"): R(
        (401, 403, 404, 200, 200, 200), params=workspace
    ),
    ("POST", "/workspaces/{workspace_id}/api-keys"): R(
        (401, 403, 404, 403, 201, 201), params=workspace, body=body({"name": "k"})
    ),
    ("PATCH", "/workspaces/{workspace_id}/api-keys/{key_id}"): R(
        (401, 403, 404, 403, 200, 200), params=fresh_key, body=body({"rate_limit": "5/minute"})
    ),
    ("DELETE", "/workspaces/{workspace_id}/api-keys/{key_id}"): R(
        (401, 403, 404, 403, 204, 204), params=fresh_key
    ),
    # Servers: reads for members and API keys, changes for admins. Lists show the caller's
    # own workspace, so the outsider sees theirs (200); ids of another workspace are 404.
    ("GET", "/servers"): R((401, 200, 200, 200, 200, 200)),
    ("POST", "/servers"): R((401, 403, 201, 403, 201, 201), body=server_body),
    ("GET", "/servers/{server_id}"): R((401, 200, 404, 200, 200, 200), params=server),
    ("PATCH", "/servers/{server_id}"): R(
        (401, 403, 404, 403, 200, 200), params=server, body=body({"description": "changed"})
    ),
    ("DELETE", "/servers/{server_id}"): R((401, 403, 404, 403, 204, 204), params=fresh_server),
    ("POST", "/servers/{server_id}/probe"): R((401, 403, 404, 403, 200, 200), params=server),
    # The playground: reads for members and API keys (502: the upstream is unreachable), the
    # rest for admins. Invoke answers 200 with status "error" for an unreachable upstream.
    ("GET", "/servers/{server_id}/tools"): R((401, 502, 404, 502, 502, 502), params=server),
    ("DELETE", "/servers/{server_id}/tools/cache"): R(
        (401, 403, 404, 403, 204, 204), params=server
    ),
    ("POST", "/servers/{server_id}/tools/invoke"): R(
        (401, 403, 404, 403, 200, 200), params=server, body=body({"tool_name": "echo"})
    ),
    # Tool integrity: the history for readers, approvals for admins.
    ("GET", "/servers/{server_id}/tools/changes"): R((401, 200, 404, 200, 200, 200), params=server),
    ("POST", "/servers/{server_id}/tools/approve"): R(
        (401, 403, 404, 403, 200, 200), params=server, body=body({})
    ),
    # Toolsets: reads for members and API keys (a member that cannot be listed is reported in
    # the answer, not an error of it), changes for admins.
    ("GET", "/toolsets"): R((401, 200, 200, 200, 200, 200)),
    ("POST", "/toolsets"): R((401, 403, 201, 403, 201, 201), body=toolset_body),
    ("GET", "/toolsets/{toolset_id}"): R((401, 200, 404, 200, 200, 200), params=toolset),
    ("PATCH", "/toolsets/{toolset_id}"): R(
        (401, 403, 404, 403, 200, 200), params=toolset, body=body({"description": "changed"})
    ),
    ("DELETE", "/toolsets/{toolset_id}"): R((401, 403, 404, 403, 204, 204), params=fresh_toolset),
    ("GET", "/toolsets/{toolset_id}/tools"): R((401, 200, 404, 200, 200, 200), params=toolset),
    ("GET", "/health/checks"): R((401, 200, 200, 200, 200, 200)),
    ("GET", "/health/summary"): R((401, 200, 200, 200, 200, 200)),
    # Analytics: reads for members and API keys, of the caller's own workspace.
    ("GET", "/analytics/top-tools"): R((401, 200, 200, 200, 200, 200)),
    ("GET", "/analytics/error-rates"): R((401, 200, 200, 200, 200, 200)),
    ("GET", "/analytics/latency"): R((401, 200, 200, 200, 200, 200)),
    ("GET", "/analytics/volume"): R((401, 200, 200, 200, 200, 200)),
    # The proxy and ingestion: any member and API keys (502: the upstream is unreachable).
    ("POST", "/proxy/{server_id}/mcp"): R(
        (401, 502, 404, 502, 502, 502), params=server, body=body(_RPC)
    ),
    ("GET", "/proxy/{server_id}/mcp"): R((401, 502, 404, 502, 502, 502), params=server),
    ("DELETE", "/proxy/{server_id}/mcp"): R((401, 502, 404, 502, 502, 502), params=server),
    ("OPTIONS", "/proxy/{server_id}/mcp"): R((204, 204, 204, 204, 204, 204), params=server),
    # A toolset's endpoint: as the proxy (its unreachable member is left out of the session;
    # a DELETE without a session id is 400).
    ("POST", "/toolsets/{toolset_id}/mcp"): R(
        (401, 200, 404, 200, 200, 200), params=toolset, body=body(_INITIALIZE)
    ),
    ("DELETE", "/toolsets/{toolset_id}/mcp"): R((401, 400, 404, 400, 400, 400), params=toolset),
    ("OPTIONS", "/toolsets/{toolset_id}/mcp"): R((204, 204, 204, 204, 204, 204), params=toolset),
    ("POST", "/tool-calls"): R((401, 201, 404, 201, 201, 201), body=tool_call_body),
    ("GET", "/tool-calls"): R((401, 200, 200, 200, 200, 200)),
    # Alerts: reads for members and API keys, rule changes for admins.
    ("GET", "/alerts/rules"): R((401, 200, 200, 200, 200, 200)),
    ("POST", "/alerts/rules"): R((401, 403, 201, 403, 201, 201), body=rule_body),
    ("GET", "/alerts/rules/{rule_id}"): R((401, 200, 404, 200, 200, 200), params=rule),
    ("PATCH", "/alerts/rules/{rule_id}"): R(
        (401, 403, 404, 403, 200, 200), params=rule, body=body({"threshold": 2})
    ),
    ("DELETE", "/alerts/rules/{rule_id}"): R((401, 403, 404, 403, 204, 204), params=rule),
    ("GET", "/alerts/events"): R((401, 200, 200, 200, 200, 200)),
    ("GET", "/alerts/events/{event_id}"): R((401, 200, 404, 200, 200, 200), params=event),
    ("GET", "/alerts/events/{event_id}/deliveries"): R(
        (401, 200, 404, 200, 200, 200), params=event
    ),
}


async def test_every_endpoint_answers_every_kind_of_caller_as_the_table_says(api: Api) -> None:
    document = (await api.get("/openapi.json", expect=200)).body
    operations = [
        (method.upper(), path.removeprefix("/api/v1"))
        for path, item in document["paths"].items()
        for method in item
    ]
    missing = [f"{m} {p}" for m, p in operations if (m, p) not in ROWS]
    assert not missing, "endpoints without a row in the access table:\n" + "\n".join(missing)
    stale = [f"{m} {p}" for m, p in ROWS if (m, p) not in operations]
    assert not stale, "rows for endpoints that do not exist:\n" + "\n".join(stale)

    world = await build_world(api)
    wrong = []
    for method, template in operations:
        row = ROWS[(method, template)]
        for caller, expected in zip(CALLERS, row.expect, strict=True):
            path = template.format(**await row.params(world, caller))
            payload = None if row.body is None else await row.body(world, caller)
            reply = await api.request(method, path, json=payload, auth=world.credential(caller))
            if reply.status != expected:
                wrong.append(
                    f"{method} {template} as {caller}: {reply.status} (expected {expected}) "
                    f"{reply.body!r}"
                )
    assert not wrong, "\n".join(wrong)


async def test_an_api_key_as_a_bearer_token_answers_as_in_x_api_key(api: Api) -> None:
    """`Authorization: Bearer mcpg_…` is the key column of the table, endpoint by endpoint:
    clients that can send only a bearer token use API keys too."""
    world = await build_world(api)
    document = (await api.get("/openapi.json", expect=200)).body
    wrong = []
    for path, item in document["paths"].items():
        for method in item:
            template = path.removeprefix("/api/v1")
            row = ROWS[(method.upper(), template)]
            expected = row.expect[CALLERS.index("key")]
            concrete = template.format(**await row.params(world, "key"))
            payload = None if row.body is None else await row.body(world, "key")
            bearer = {"Authorization": f"Bearer {world.key}"}
            reply = await api.request(method.upper(), concrete, json=payload, headers=bearer)
            if reply.status != expected:
                wrong.append(f"{method} {template}: {reply.status} (expected {expected})")
    assert not wrong, "\n".join(wrong)


async def test_a_bearer_credential_wins_over_x_api_key(api: Api) -> None:
    world = await build_world(api)
    good, bad = world.key, "mcpg_" + "x" * 43
    # The bearer key is the one used: a good one with a bad X-API-Key passes, and the reverse
    # is refused, as when the bearer is an access token.
    both = {"Authorization": f"Bearer {good}", "X-API-Key": bad}
    await api.get("/servers", headers=both, expect=200)
    both = {"Authorization": f"Bearer {bad}", "X-API-Key": good}
    reply = await api.get("/servers", headers=both, expect=401)
    assert reply.detail.startswith("invalid or revoked API key")
    # A bearer key is still a key: refused where keys may not go, signing in included.
    bearer = {"Authorization": f"Bearer {good}"}
    reply = await api.get("/auth/me", headers=bearer, expect=403)
    assert "API keys cannot be used" in reply.detail
    login = {"email": world.owner.email, "password": world.password}
    await api.post("/auth/login", json=login, headers=bearer, expect=403)
    # Any case of the scheme, as for access tokens.
    await api.get("/servers", headers={"Authorization": f"bearer  {good} "}, expect=200)


async def test_another_workspace_cannot_see_or_touch_the_first(api: Api) -> None:
    """Tenant isolation: every id of one workspace is 404 to a user of another, never 403."""
    world = await build_world(api)
    invite = await fresh_invite(world, "owner")
    key = await fresh_key(world, "owner")
    ws = f"/workspaces/{world.ws}"
    # The outsider is an owner at home, so a role check could not be what stops them.
    attempts: list[tuple[str, str, Any]] = [
        ("GET", ws, None),
        ("PATCH", ws, {"name": "Taken over"}),
        ("DELETE", ws, None),
        ("GET", f"{ws}/members", None),
        ("POST", f"{ws}/members/invite", {"email": "spy@example.com", "role": "admin"}),
        ("PATCH", f"{ws}/members/{world.member.user_id}", {"role": "owner"}),
        ("DELETE", f"{ws}/members/{world.member.user_id}", None),
        ("GET", f"{ws}/invites", None),
        ("DELETE", f"{ws}/invites/{invite['invite_id']}", None),
        ("GET", f"{ws}/api-keys", None),
        ("POST", f"{ws}/api-keys", {"name": "stolen"}),
        ("PATCH", f"{ws}/api-keys/{key['key_id']}", {"allowed_tools": ["*"]}),
        ("DELETE", f"{ws}/api-keys/{key['key_id']}", None),
    ]
    for method, path, payload in attempts:
        reply = await api.request(method, path, json=payload, auth=world.outsider, expect=404)
        assert "owner" not in reply.detail and "role" not in reply.detail
    await api.post(
        "/auth/switch-workspace", json={"workspace_id": world.ws}, auth=world.outsider, expect=404
    )

    # The outsider's own ids are just as invisible from the other side.
    theirs = world.outsider.workspace_id
    await api.get(f"/workspaces/{theirs}", auth=world.owner, expect=404)
    # And ids of the first workspace used under the outsider's own workspace are unknown.
    outsider_ws = f"/workspaces/{theirs}"
    await api.delete(
        f"{outsider_ws}/invites/{invite['invite_id']}", auth=world.outsider, expect=404
    )
    await api.delete(f"{outsider_ws}/api-keys/{key['key_id']}", auth=world.outsider, expect=404)
    await api.delete(
        f"{outsider_ws}/members/{world.member.user_id}", auth=world.outsider, expect=404
    )

    # Nothing changed in the first workspace.
    members = await api.get(f"{ws}/members", auth=world.owner, expect=200)
    assert {m["user_id"]: m["role"] for m in members.body} == {
        world.owner.user_id: "owner",
        world.admin.user_id: "admin",
        world.member.user_id: "member",
    }
    invites = await api.get(f"{ws}/invites", auth=world.owner, expect=200)
    assert invite["invite_id"] in {i["id"] for i in invites.body}
    keys = await api.get(f"{ws}/api-keys", auth=world.owner, expect=200)
    assert key["key_id"] in {k["id"] for k in keys.body}
    assert (await api.get(ws, auth=world.owner, expect=200)).body["name"] == "Acme"
