"""Fixtures for the MCP client and probe tests: shared SDK upstreams and an HTTP session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from tests.upstreams import sdk_server


@pytest.fixture(scope="session")
def sdk_sse_url() -> Iterator[str]:
    """Stateful SDK server answering with SSE, with priming events and two tools per page."""
    with sdk_server(priming=True, page_size=2) as url:
        yield url


@pytest.fixture(scope="session")
def sdk_json_url() -> Iterator[str]:
    """Stateless SDK server answering with plain JSON."""
    with sdk_server(stateless=True, json_response=True) as url:
        yield url


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
