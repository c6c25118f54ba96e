"""Fixtures for the MCP client and probe tests (the SDK upstreams are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from tests.helpers.upstreams import sdk_server


@pytest.fixture(scope="session")
def sdk_legacy_sse_url() -> Iterator[str]:
    """SDK server on the legacy HTTP+SSE transport (2024-11-05)."""
    with sdk_server(transport="sse") as url:
        yield url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """Configured like the app's shared session: no decompression, no total timeout."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with aiohttp.ClientSession(auto_decompress=False, timeout=timeout) as session:
        yield session
