"""A call the server answers `input_required` first (2026-07-28, SEP-2322: it asks the client
something, such as an elicitation, and the client retries the call with `inputResponses`) is
one call: logged once, when the retry ends, however its replies travel. The handshake era's
elicitation, a request from the server inside the call's own stream, stays one call too."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from mcp_types import ElicitRequestParams, ElicitResult

from gateway.calllog.writer import CALL_LOG
from tests.helpers.api import Api
from tests.helpers.interim import Wire, modern, send, settled, watched_client
from tests.helpers.proxying import arrange


def outcomes(rows: list[Any]) -> list[tuple[str, str, str | None]]:
    return [(r["tool_name"], r["status"], r["error_message"]) for r in rows]


async def all_rows(api: Api, db: asyncpg.Connection) -> list[Any]:
    """Every row of the log once the gateway has settled (nothing more is on its way)."""
    await settled(api)
    return list(await db.fetch("SELECT * FROM tool_calls ORDER BY created_at, id"))


async def tell_name(context: Any, params: ElicitRequestParams) -> ElicitResult:
    return ElicitResult(action="accept", content={"name": "Ada"})


async def decline(context: Any, params: ElicitRequestParams) -> ElicitResult:
    return ElicitResult(action="decline")


async def progress(progress: float, total: float | None, message: str | None) -> None:
    pass


@pytest.mark.parametrize(
    ("server", "notify", "replies"),
    [
        ("sdk_interactive_json", False, "application/json"),
        # A notification first makes the SDK server answer with an SSE stream.
        ("sdk_interactive", True, "text/event-stream"),
    ],
    ids=["json", "sse"],
)
async def test_an_elicitation_is_one_call_logged_when_the_retry_ends(
    api: Api,
    db: asyncpg.Connection,
    request: pytest.FixtureRequest,
    server: str,
    notify: bool,
    replies: str,
) -> None:
    setup = await arrange(api, db, request.getfixturevalue(server))
    wire = Wire()
    async with watched_client(setup, "auto", wire, elicitation_callback=tell_name) as client:
        result = await client.call_tool(
            "greet", {"notify": notify}, progress_callback=progress if notify else None
        )
    assert result.content[0].text == "hello Ada"  # type: ignore[union-attr]
    # Two exchanges: the call, answered input_required, and its retry with the answer.
    assert wire.replies_to("tools/call") == [replies] * 2
    rows = await all_rows(api, db)
    assert outcomes(rows) == [("greet", "success", None)]
    assert rows[0]["output_size_bytes"] > 0


async def test_the_retry_says_how_the_call_went(
    api: Api, db: asyncpg.Connection, sdk_interactive_json: str
) -> None:
    """The caller declines: the retry carries that, and the tool's answer to it decides."""
    setup = await arrange(api, db, sdk_interactive_json)
    async with watched_client(setup, "auto", Wire(), elicitation_callback=decline) as client:
        result = await client.call_tool("greet", {})
    assert result.is_error
    said = result.content[0].text  # type: ignore[union-attr]
    assert "the caller would not say (decline)" in said
    rows = await all_rows(api, db)
    assert outcomes(rows) == [("greet", "error", said)]


async def test_a_handshake_era_elicitation_stays_one_call(
    api: Api, db: asyncpg.Connection, sdk_interactive: str
) -> None:
    """Before 2026-07-28 the server asks inside the call's SSE stream, and the client answers
    with a POST of its own: one tools/call, one row."""
    setup = await arrange(api, db, sdk_interactive)
    wire = Wire()
    async with watched_client(setup, "legacy", wire, elicitation_callback=tell_name) as client:
        result = await client.call_tool("greet", {})
    assert result.content[0].text == "hello Ada"  # type: ignore[union-attr]
    assert [kind.split(";")[0] for kind in wire.replies_to("tools/call")] == ["text/event-stream"]
    rows = await all_rows(api, db)
    assert outcomes(rows) == [("greet", "success", None)]


async def test_an_interim_answer_gives_back_its_room_in_the_log(
    make_api: Any, db: asyncpg.Connection, sdk_interactive_json: str
) -> None:
    """Room for the call is reserved before it is forwarded; an interim answer hands it back,
    so a caller that asks again and again, or never retries, holds none. (With one row of room
    for the workspace, a second request would be refused if the first kept its room.)"""
    api = await make_api()
    api.app[CALL_LOG].workspace_rows = 1
    setup = await arrange(api, db, sdk_interactive_json)
    greet = {"name": "greet", "arguments": {}}
    for rid in range(1, 4):
        asked = await send(setup, modern("tools/call", greet, rid))
        assert asked["result"]["resultType"] == "input_required"
        assert asked["result"]["inputRequests"]["name"]["method"] == "elicitation/create"
    answer = {"name": {"action": "accept", "content": {"name": "Ada"}}}
    done = await send(setup, modern("tools/call", {**greet, "inputResponses": answer}, 9))
    assert done["result"]["content"][0]["text"] == "hello Ada"
    rows = await all_rows(api, db)
    assert outcomes(rows) == [("greet", "success", None)]
