"""Through a toolset with what users run: the MCP Inspector CLI, and the TypeScript reference
server (server-everything) as a member beside the Python SDK's, its progress notifications
relayed as they come."""

from __future__ import annotations

import asyncpg

from tests.helpers.api import Api
from tests.helpers.npx import INSPECTOR, everything_server, inspector, npx_for
from tests.helpers.proxying import logged_calls, sdk_client
from tests.helpers.toolsets import arrange_toolset, prefix


async def test_the_inspector_cli_lists_and_calls_through_a_toolset(
    api: Api, db: asyncpg.Connection, sdk_stateful: str, sdk_stateless: str
) -> None:
    npx = await npx_for(INSPECTOR)
    async with everything_server() as everything:
        toolset = await arrange_toolset(api, db, [sdk_stateful, sdk_stateless, everything])
        listed = await inspector(npx, toolset.url, toolset.key, "--method", "tools/list")
        add = f"{prefix(toolset.names[1])}add"
        called = await inspector(
            npx, toolset.url, toolset.key, "--method", "tools/call", "--tool-name", add,
            "--tool-arg", "a=1", "--tool-arg", "b=2",
        )  # fmt: skip
    names = {tool["name"] for tool in listed["tools"]}
    assert {f"{prefix(toolset.names[0])}add", add, f"{prefix(toolset.names[2])}echo"} <= names
    assert called["structuredContent"] == {"result": 3}
    [row] = await logged_calls(db, 1)
    assert (str(row["server_id"]), row["tool_name"], row["status"]) == (
        toolset.servers[1],
        "add",
        "success",
    )


async def test_the_typescript_reference_server_as_a_member_with_progress(
    api: Api, db: asyncpg.Connection, sdk_stateless: str
) -> None:
    async with everything_server() as everything:
        toolset = await arrange_toolset(api, db, [sdk_stateless, everything])
        ts = prefix(toolset.names[1])
        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        async with sdk_client(toolset.url, toolset.key, "legacy") as client:
            echoed = await client.call_tool(f"{ts}echo", {"message": "through a toolset"})
            long = await client.call_tool(
                f"{ts}trigger-long-running-operation",
                {"duration": 1, "steps": 3},
                progress_callback=on_progress,
            )
    assert "through a toolset" in echoed.content[0].text  # type: ignore[union-attr]
    assert not long.is_error
    assert seen == [1, 2, 3]
    rows = await logged_calls(db, 2)
    assert [r["tool_name"] for r in rows] == ["echo", "trigger-long-running-operation"]
    assert {str(r["server_id"]) for r in rows} == {toolset.servers[1]}
