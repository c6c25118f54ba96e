"""mcp-gateway rotate-secrets: credentials sealed with an old key work with the new key alone."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from cryptography.fernet import Fernet

from gateway.cli import main
from gateway.security.secretbox import SecretBox
from tests.helpers.api import AppFactory
from tests.helpers.upstreams import fake_upstream


async def test_rotation_moves_credentials_to_the_new_key(
    make_api: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    before = await make_api(secret_keys=(old_key,))
    admin = await before.signup()
    async with fake_upstream(required_headers={"Authorization": "Bearer upstream-token"}) as fake:
        created = await before.post(
            "/servers",
            json={
                "name": "guarded",
                "url": fake.url,
                "auth_type": "bearer",
                "auth_credentials": {"token": "upstream-token"},
            },
            auth=admin,
            expect=201,
        )
        await before.post("/servers", json={"name": "open", "url": fake.url}, auth=admin)
        server_id = created.body["id"]
        sealed = await db.fetchval("SELECT credentials FROM servers WHERE id = $1", server_id)
        with pytest.raises(ValueError, match="cannot be decrypted"):
            SecretBox((new_key,)).open(sealed)

        monkeypatch.setenv("DATABASE_URL", database_url)
        monkeypatch.setenv("GATEWAY_SECRET_KEYS", f"{new_key},{old_key}")
        monkeypatch.delenv("GATEWAY_JWT_SECRET", raising=False)  # not needed to rotate
        await asyncio.to_thread(main, ["rotate-secrets"])
        assert "re-encrypted the credentials of 1 servers" in capsys.readouterr().out

        resealed = await db.fetchval("SELECT credentials FROM servers WHERE id = $1", server_id)
        assert SecretBox((new_key,)).open(resealed) == {"token": "upstream-token"}

        after = await make_api(secret_keys=(new_key,))
        fake.requests.clear()
        check = await after.post(f"/servers/{server_id}/probe", auth=admin, expect=200)
    assert check.body["status"] == "healthy", check.body
    assert fake.requests[0].headers["Authorization"] == "Bearer upstream-token"


async def test_credentials_no_key_can_open_fail_the_command(
    make_api: AppFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost_key = Fernet.generate_key().decode()
    api = await make_api(secret_keys=(lost_key,))
    admin = await api.signup()
    await api.post(
        "/servers",
        json={
            "name": "s",
            "url": "http://x.test/mcp",
            "auth_type": "bearer",
            "auth_credentials": {"token": "t"},
        },
        auth=admin,
        expect=201,
    )
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("GATEWAY_SECRET_KEYS", Fernet.generate_key().decode())
    with pytest.raises(SystemExit) as exit_:
        await asyncio.to_thread(main, ["rotate-secrets"])
    assert exit_.value.code == 1

    monkeypatch.delenv("GATEWAY_SECRET_KEYS")
    with pytest.raises(SystemExit) as exit_:
        await asyncio.to_thread(main, ["rotate-secrets"])
    assert exit_.value.code == 2
