"""The "Connect an agent" panel's content: an MCP URL, the header to send, a snippet per client.

Built for any MCP URL of the gateway (a server's proxy URL, a toolset's URL), so that any page
can include templates/_connect_an_agent.html with connect_panel(...) as `connect`. The page never
holds a key: the snippets carry KEY_PLACEHOLDER and say where keys are made.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

KEY_PLACEHOLDER = "mcpg_YOUR_KEY"
BEARER = f"Bearer {KEY_PLACEHOLDER}"
# Where a workspace's API keys are made (the settings page's section).
KEYS_PAGE = "/settings#api-keys"
# The VS Code snippet asks for the key once instead of storing it in the workspace's file.
_VSCODE_INPUT = "mcp-gateway-key"


@dataclass(frozen=True, slots=True)
class Snippet:
    id: str  # the element id, unique on the page
    title: str
    where: str  # the file or the place it goes, for people
    text: str


def client_name(name: str) -> str:
    """A name every client takes as a server's key and a shell word: letters, digits, - and _."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")
    return slug[:64] or "mcp-gateway"


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _mcp_remote_args(url: str) -> list[str]:
    # mcp-remote refuses plain http except to localhost unless told; the header goes without
    # spaces, through an environment variable (its documented way around clients that split
    # arguments at spaces).
    args = ["-y", "mcp-remote", url, "--header", "Authorization:${AUTH_HEADER}"]
    parts = urlsplit(url)
    if parts.scheme == "http" and parts.hostname not in ("localhost", "127.0.0.1"):
        args.append("--allow-http")
    return args


def snippets(name: str, url: str) -> list[Snippet]:
    key = client_name(name)
    headers = {"Authorization": BEARER}
    python = f'''import asyncio

import httpx2  # installed with mcp (2.x)
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

URL = {json.dumps(url)}
HEADERS = {{"Authorization": "{BEARER}"}}


async def main() -> None:
    async with httpx2.AsyncClient(headers=HEADERS) as http:
        async with Client(streamable_http_client(URL, http_client=http)) as client:
            tools = await client.list_tools()
            print([tool.name for tool in tools.tools])


asyncio.run(main())
'''
    return [
        Snippet(
            "connect-claude-code",
            "Claude Code",
            "in a terminal",
            f"claude mcp add --transport http {shlex.quote(key)} {shlex.quote(url)} "
            f'--header "Authorization: {BEARER}"',
        ),
        Snippet(
            "connect-vscode",
            "VS Code",
            ".vscode/mcp.json (VS Code asks for the key once and keeps it out of the file)",
            _json(
                {
                    "inputs": [
                        {
                            "type": "promptString",
                            "id": _VSCODE_INPUT,
                            "description": "mcp-gateway API key (mcpg_…)",
                            "password": True,
                        }
                    ],
                    "servers": {
                        key: {
                            "type": "http",
                            "url": url,
                            "headers": {"Authorization": f"Bearer ${{input:{_VSCODE_INPUT}}}"},
                        }
                    },
                }
            ),
        ),
        Snippet(
            "connect-cursor",
            "Cursor",
            "~/.cursor/mcp.json (or .cursor/mcp.json in a project)",
            _json({"mcpServers": {key: {"url": url, "headers": headers}}}),
        ),
        Snippet(
            "connect-claude-desktop",
            "Claude Desktop",
            "claude_desktop_config.json, through mcp-remote (needs Node.js)",
            _json(
                {
                    "mcpServers": {
                        key: {
                            "command": "npx",
                            "args": _mcp_remote_args(url),
                            "env": {"AUTH_HEADER": BEARER},
                        }
                    }
                }
            ),
        ),
        Snippet("connect-python", "Python (the mcp SDK)", "pip install mcp", python),
    ]


def connect_panel(name: str, url: str) -> dict[str, Any]:
    """What templates/_connect_an_agent.html shows, for an MCP endpoint called `name`."""
    return {
        "url": url,
        "header": f"Authorization: {BEARER}",
        "key_header": f"X-API-Key: {KEY_PLACEHOLDER}",
        "placeholder": KEY_PLACEHOLDER,
        "keys_page": KEYS_PAGE,
        "snippets": snippets(name, url),
    }
