"""The application's infrastructure keys: its settings, the PostgreSQL pool and the HTTP
client every upstream request shares. Every other web.AppKey is declared by the module that
owns what it holds."""

from __future__ import annotations

import aiohttp
import asyncpg
from aiohttp import web

from gateway.config import Settings

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
# The one client session for every upstream request (proxy, probes, playground, webhooks).
HTTP = web.AppKey("http", aiohttp.ClientSession)
