"""Tenant isolation on the dashboard, generated from the app's routes: every page and form with
an id in its path, opened or sent by someone signed in to another workspace with the ids of
the first, is "Not found" and changes nothing. A new page with an id is covered as it is added.
"""

from __future__ import annotations

import re

import asyncpg

from tests.helpers.api import Api
from tests.helpers.browser import BrowserFactory
from tests.helpers.tenants import arrange_victim, snapshot

# Valid forms where an invalid one could be refused before the id is looked up.
FORMS = {
    "/settings/members/{user_id}/role": {"role": "admin"},
    "/servers/{server_id}/edit": {"name": "taken", "url": "http://127.0.0.1:9/taken"},
    "/servers/{server_id}/tools/invoke": {"tool_name": "echo", "arguments": "{}"},
}


async def test_no_page_or_form_lets_another_workspace_see_or_touch_anything(
    api: Api, db: asyncpg.Connection, browser_for: BrowserFactory
) -> None:
    routes = sorted(
        {
            (route.method, route.resource.canonical)
            for route in api.app.router.routes()
            if route.resource is not None
            and route.method in ("GET", "POST")
            and not route.resource.canonical.startswith("/api/")
            and re.search(r"{\w+_id}", route.resource.canonical)
        }
    )
    victim = await arrange_victim(api)
    unknown = {
        name
        for _, path in routes
        for name in re.findall(r"{(\w+)}", path)
        if name not in victim.ids
    }
    assert not unknown, f"add the victim's {unknown} to tests/tenants.py"
    stranger = await api.org(await api.signup(name="Stranger"), name="Elsewhere")
    browser = await browser_for(stranger)
    await browser.get("/")  # a page with a form: its CSRF token is valid for every form
    before = await snapshot(db)

    wrong = []
    for method, template in routes:
        path = template.format(**victim.ids)
        if method == "GET":
            page = await browser.get(path, expect=None)
        else:
            page = await browser.post(path, FORMS.get(template, {}), follow=False)
        if page.status != 404 or not page.has("Not found"):
            wrong.append(f"{method} {template}: {page.status}")
        leaked = [s for s in victim.secrets if page.has(s)]
        if leaked:
            wrong.append(f"{method} {template}: the page shows {leaked}")
    assert not wrong, "\n".join(wrong)
    assert len(routes) >= 15

    assert await snapshot(db) == before
