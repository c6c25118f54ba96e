"""HTTPS on loopback in tests: a certificate authority of the test's own (trustme), and an
aiohttp app served over https on 127.0.0.1 with a certificate it issued.

What must be fetched over https (an OAuth client ID metadata document, whose URL is the
client's id) is served this way; the party that fetches it trusts the test CA only, through
`TestCA.client_context()`, never the machine's store.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

trustme = pytest.importorskip("trustme", reason="pip install trustme (in the test extras)")


class TestCA:
    """A CA made for one test, and a server certificate it issued for 127.0.0.1 and localhost."""

    __test__ = False  # not a test class, whatever its name says

    def __init__(self) -> None:
        self.ca = trustme.CA()
        self.certificate = self.ca.issue_cert("127.0.0.1", "localhost")

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.certificate.configure_cert(context)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client's context that trusts this CA and nothing else (hostnames still checked)."""
        # Given cadata, the default context loads no certificate of the system's store.
        return ssl.create_default_context(cadata=self.ca.cert_pem.bytes().decode())


@contextlib.asynccontextmanager
async def serve_https(app: web.Application, ca: TestCA) -> AsyncIterator[str]:
    """Serve `app` over https on 127.0.0.1 (a free port) for the block; yields its base URL."""
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ca.server_context())
    await site.start()
    try:
        yield f"https://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
