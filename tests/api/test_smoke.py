"""Smoke: the app starts on a real database and answers the basic flow."""

from tests.support import Api


async def test_signup_then_me(api: Api) -> None:
    alice = await api.signup("Alice@Example.com", name="Alice")
    me = await api.get("/auth/me", auth=alice, expect=200)
    assert me.body["email"] == "alice@example.com"
    assert me.body["current_workspace"]["role"] == "owner"
