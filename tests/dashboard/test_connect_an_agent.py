"""A server's page says how to connect an agent: the absolute MCP URL, the header, and a
snippet per client, each with a copy button that copies exactly what is shown; never a key."""

from __future__ import annotations

import json
import re
import shlex
from html import unescape
from typing import Any

from gateway.dashboard.connect import KEY_PLACEHOLDER, client_name, snippets
from tests.helpers.api import Api, AppFactory
from tests.helpers.browser import BrowserFactory
from tests.helpers.chromium import ARTIFACTS, WIDTHS, needs_chromium, playwright_api, signed_in

SNIPPET_IDS = [
    "connect-claude-code",
    "connect-vscode",
    "connect-cursor",
    "connect-claude-desktop",
    "connect-python",
]


async def register(api: Api, name: str = "Weather tools") -> tuple[Any, dict[str, Any]]:
    owner = await api.signup()
    reply = await api.post(
        "/servers", json={"name": name, "url": "https://mcp.example.com/mcp"}, auth=owner
    )
    return owner, reply.body


def shown(html: str, element_id: str) -> str:
    """The text of the element with this id, as the page shows it."""
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</(?:code|pre)>', html, re.DOTALL)
    assert found is not None, f"no #{element_id} on the page"
    return unescape(found.group(1))


async def test_the_panel_shows_the_absolute_url_header_and_snippets(
    api: Api, browser_for: BrowserFactory
) -> None:
    owner, server = await register(api)
    key = await api.api_key(owner)
    page = await (await browser_for(owner)).get(f"/servers/{server['id']}")
    url = server["proxy_url"]
    assert url == f"http://gateway.test/api/v1/proxy/{server['id']}/mcp"  # PUBLIC_URL's
    assert shown(page.text, "connect-url") == url
    assert shown(page.text, "connect-header") == f"Authorization: Bearer {KEY_PLACEHOLDER}"
    assert page.has(f"X-API-Key: {KEY_PLACEHOLDER}")
    assert 'href="/settings#api-keys"' in page.text
    assert key not in page.text and key[:12] not in page.text  # never a key, not even its start

    texts = {s.id: shown(page.text, s.id) for s in snippets(server["name"], url)}
    assert list(texts) == SNIPPET_IDS
    name = client_name(server["name"])
    assert name == "weather-tools"
    assert shlex.split(texts["connect-claude-code"]) == [
        "claude",
        "mcp",
        "add",
        "--transport",
        "http",
        name,
        url,
        "--header",
        f"Authorization: Bearer {KEY_PLACEHOLDER}",
    ]
    vscode = json.loads(texts["connect-vscode"])
    assert vscode["servers"][name]["type"] == "http"
    assert vscode["servers"][name]["url"] == url
    [prompt] = vscode["inputs"]
    assert vscode["servers"][name]["headers"] == {
        "Authorization": f"Bearer ${{input:{prompt['id']}}}"
    }
    assert json.loads(texts["connect-cursor"]) == {
        "mcpServers": {
            name: {"url": url, "headers": {"Authorization": f"Bearer {KEY_PLACEHOLDER}"}}
        }
    }
    desktop = json.loads(texts["connect-claude-desktop"])["mcpServers"][name]
    assert desktop["command"] == "npx"
    # Plain http to another host needs mcp-remote's --allow-http; the header has no spaces.
    assert desktop["args"] == [
        "-y",
        "mcp-remote",
        url,
        "--header",
        "Authorization:${AUTH_HEADER}",
        "--allow-http",
    ]
    assert desktop["env"] == {"AUTH_HEADER": f"Bearer {KEY_PLACEHOLDER}"}
    compile(texts["connect-python"], "agent.py", "exec")  # the Python snippet parses
    assert f'URL = "{url}"' in texts["connect-python"]


async def test_snippets_for_https_need_no_allow_http() -> None:
    [desktop] = [
        s for s in snippets("x", "https://gw.example.com/m") if s.title == "Claude Desktop"
    ]
    assert "--allow-http" not in json.loads(desktop.text)["mcpServers"]["x"]["args"]
    assert client_name("  ") == "mcp-gateway"
    assert client_name("Prod / Search (EU)") == "prod-search-eu"


async def test_a_member_sees_the_panel_too(api: Api, browser_for: BrowserFactory) -> None:
    owner = await api.org(await api.signup(), "Ops")
    member = await api.member(owner, "member")
    reply = await api.post(
        "/servers", json={"name": "ops", "url": "https://mcp.example.com/mcp"}, auth=owner
    )
    page = await (await browser_for(member)).get(f"/servers/{reply.body['id']}")
    assert page.has("Connect an agent") and page.has(reply.body["proxy_url"])


# -- in a real browser: every copy button copies what is shown ----------------------------------


@needs_chromium
async def test_each_copy_button_copies_what_is_shown(make_api: AppFactory, chromium: Any) -> None:
    api = await make_api()
    owner, server = await register(api, "Search & <Fetch>")
    base = str(api.client.make_url("")).rstrip("/")
    visitor = await signed_in(
        chromium, base, owner, WIDTHS["desktop"], permissions=["clipboard-read", "clipboard-write"]
    )
    page = visitor.page

    expected = {
        "connect-url": server["proxy_url"],
        "connect-header": f"Authorization: Bearer {KEY_PLACEHOLDER}",
        **{s.id: s.text for s in snippets(server["name"], server["proxy_url"])},
    }
    for device, width in WIDTHS.items():
        await page.set_viewport_size({"width": width, "height": 900})
        await visitor.open(f"/servers/{server['id']}")
        panel = page.locator("#connect")
        await playwright_api.expect(
            panel.get_by_role("heading", name="Connect an agent")
        ).to_be_visible()
        buttons = panel.locator("button[data-copy]")
        assert await buttons.count() == len(expected)
        for index in range(len(expected)):
            button = buttons.nth(index)
            target = await button.get_attribute("data-copy")
            assert target is not None
            await button.click()
            await playwright_api.expect(button).to_have_text("Copied")
            copied = await page.evaluate("navigator.clipboard.readText()")
            on_page = await page.locator(f"#{target}").text_content()
            assert copied == on_page == expected[target], target
        # A phone shows the panel without sideways scrolling of the whole page.
        overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"the server page is {overflow}px wider than the {device} view"
        await panel.screenshot(path=ARTIFACTS / f"connect-an-agent-{device}.png")
        await page.screenshot(path=ARTIFACTS / f"server-page-{device}.png", full_page=True)
    assert not visitor.problems, visitor.problems
    await visitor.page.context.close()
