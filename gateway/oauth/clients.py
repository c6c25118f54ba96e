"""OAuth clients: registered here (RFC 7591) or known by their client ID metadata document (an
https `client_id` the gateway fetches), and which redirect URIs either may have.

Redirect URIs (RFC 8252, OAuth 2.1): https ones; loopback http ones (127.0.0.1, [::1],
localhost), where any port matches at authorize, as a native app listens on whatever port is
free (RFC 8252 7.3), the rest exactly; and private-use schemes of native apps, a scheme with a
dot (`com.example.app:/cb`, RFC 8252 7.1). Everything else, and any URI with a fragment or a
user name, is refused. Otherwise matching is exact.

Metadata documents are fetched under the outbound address policy (the app's HTTP client
checks every address dialled), with no redirect followed, at most DOCUMENT_MAX_BYTES within
DOCUMENT_SECONDS, and kept in oauth_clients (registered false) and in this process for
DOCUMENT_MAX_AGE_SECONDS. A document that cannot be fetched or is not valid refuses the
client: the authorize endpoint shows why, and never redirects to an unverified client.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import orjson
from aiohttp import web

from gateway.db import oauth as oauth_db
from gateway.db.oauth import ClientRow

log = logging.getLogger(__name__)

MAX_REDIRECT_URIS = 10
MAX_URI_CHARS = 2000
MAX_NAME_CHARS = 200
DOCUMENT_MAX_BYTES = 64 * 1024
DOCUMENT_SECONDS = 5.0
DOCUMENT_MAX_AGE_SECONDS = 3600.0
# Documents kept in this process (each a few KiB at most).
_DOCUMENTS_KEPT = 1000

_LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
# RFC 3986 3.1, with the dot RFC 8252 7.1 asks of a private-use scheme (a reversed domain).
_PRIVATE_SCHEME = re.compile(r"^[a-z][a-z0-9+\-]*(\.[a-z0-9+\-]+)+$")

# The SSL context metadata documents are fetched with; set it before startup to trust another
# CA (tests: a test CA). Without it, the system's trusted CAs.
DOCUMENT_SSL: web.AppKey[ssl.SSLContext] = web.AppKey("oauth_document_ssl", ssl.SSLContext)


class BadRedirectUri(ValueError):
    """A redirect URI the gateway does not allow; the message says why."""


class ClientRefused(Exception):
    """A client the gateway cannot use (unknown, or a metadata document refused): why."""


def check_redirect_uri(uri: Any) -> str:
    """The redirect URI if allowed at registration, else BadRedirectUri saying why."""
    if not isinstance(uri, str) or not uri:
        raise BadRedirectUri("a redirect URI must be a non-empty string")
    if len(uri) > MAX_URI_CHARS:
        raise BadRedirectUri(f"a redirect URI may be at most {MAX_URI_CHARS} characters")
    if any(c <= " " or c in "\x7f\\" for c in uri):
        raise BadRedirectUri("a redirect URI may not hold spaces, control characters or '\\'")
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 -- raises on a malformed port
    except ValueError:
        raise BadRedirectUri(f"not a URI: {uri}") from None
    if "#" in uri:
        raise BadRedirectUri("a redirect URI may not have a fragment")
    if "@" in parts.netloc:
        raise BadRedirectUri("a redirect URI may not hold a user name or password")
    scheme = parts.scheme.lower()
    if scheme == "https":
        if not parts.hostname:
            raise BadRedirectUri("an https redirect URI needs a host")
        return uri
    if scheme == "http":
        if parts.hostname in _LOOPBACK_HOSTS:
            return uri
        raise BadRedirectUri(
            "an http redirect URI must be loopback (127.0.0.1, [::1] or localhost): use https"
        )
    if _PRIVATE_SCHEME.match(scheme):
        return uri
    raise BadRedirectUri(
        f"scheme {scheme or '(none)'!r} is not allowed: use https, loopback http, or a "
        "private-use scheme with a dot (com.example.app:/callback)"
    )


def check_redirect_uris(uris: Any) -> list[str]:
    if not isinstance(uris, list) or not uris:
        raise BadRedirectUri("redirect_uris must be a non-empty list")
    if len(uris) > MAX_REDIRECT_URIS:
        raise BadRedirectUri(f"at most {MAX_REDIRECT_URIS} redirect URIs")
    return [check_redirect_uri(uri) for uri in uris]


def _is_loopback(uri: str) -> bool:
    parts = urlsplit(uri)
    return parts.scheme == "http" and parts.hostname in _LOOPBACK_HOSTS


def redirect_matches(registered: str, requested: str) -> bool:
    """Exact match, except the port of a loopback http URI (RFC 8252 7.3)."""
    if registered == requested:
        return True
    if not (_is_loopback(registered) and _is_loopback(requested)):
        return False
    a, b = urlsplit(registered), urlsplit(requested)
    try:
        b.port  # noqa: B018 -- a malformed port never matches
    except ValueError:
        return False
    return (a.hostname, a.path, a.query) == (b.hostname, b.path, b.query)


def redirect_host(uri: str) -> str:
    """What the consent page names as where the browser goes back to."""
    parts = urlsplit(uri)
    return parts.hostname or f"{parts.scheme}:"


def name_mismatch(client_name: str, redirect_uri: str) -> bool:
    """Whether the consent page warns that the client's name and its redirect host disagree:
    the redirect is not loopback or a private-use scheme, and no label of its host (other
    than the top-level one and `www`) appears in the name, ignoring case. "Claude" redirecting
    to claude.ai agrees; "Claude" redirecting to evil.example does not."""
    parts = urlsplit(redirect_uri)
    if parts.scheme != "https" or not parts.hostname:
        return False
    labels = parts.hostname.lower().split(".")
    meaningful = [label for label in labels[:-1] if label not in ("www", "")] or labels
    name = client_name.lower()
    return not any(label in name for label in meaningful)


def default_name(redirect_uris: list[str]) -> str:
    """A client that gives no name is named after where it redirects (its first URI's host)."""
    return redirect_host(redirect_uris[0])[:MAX_NAME_CHARS]


@dataclass(frozen=True, slots=True)
class Client:
    """A client as authlib's ClientMixin asks: public (no secret), code and refresh only."""

    client_id: str
    client_name: str
    redirect_uris: tuple[str, ...]
    metadata: dict[str, Any] = field(hash=False, compare=False)

    @classmethod
    def of(cls, row: ClientRow) -> Client:
        return cls(row.client_id, row.client_name, row.redirect_uris, row.metadata)

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return None  # redirect_uri is always required

    def get_allowed_scope(self, scope: str | None) -> str:
        return ""  # no scopes: a grant is for one MCP URL, as its member

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return any(redirect_matches(uri, redirect_uri) for uri in self.redirect_uris)

    def check_client_secret(self, client_secret: str) -> bool:
        return False

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == "none"

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in ("authorization_code", "refresh_token")


def is_document_url(client_id: str) -> bool:
    return client_id.startswith("https://")


def _document_url_refusal(url: str) -> str | None:
    """Why an https client_id cannot be a metadata document's URL, or None."""
    if len(url) > MAX_URI_CHARS:
        return f"a client_id URL may be at most {MAX_URI_CHARS} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018
    except ValueError:
        return "the client_id is not a URL"
    if not parts.hostname or "@" in parts.netloc or "#" in url:
        return "a client_id URL needs a host, and no user name or fragment"
    segments = parts.path.split("/")
    if parts.path in ("", "/") or "." in segments or ".." in segments:
        return "a client_id URL needs a path, without . or .. segments"
    return None


class Clients:
    """Finds clients: registered ones in PostgreSQL, documents in this process, PostgreSQL or
    fetched."""

    def __init__(
        self, pool: asyncpg.Pool, http: aiohttp.ClientSession, ssl_context: ssl.SSLContext
    ) -> None:
        self._pool = pool
        self._http = http
        self._ssl = ssl_context
        self._documents: OrderedDict[str, tuple[float, Client]] = OrderedDict()

    async def find(self, client_id: str) -> Client:
        """The client, or ClientRefused saying why not."""
        if is_document_url(client_id):
            return await self._document(client_id)
        row = await oauth_db.find_client(self._pool, client_id)
        if row is None or not row.registered:
            raise ClientRefused("this client is not registered with this gateway")
        return Client.of(row)

    async def _document(self, url: str) -> Client:
        kept = self._documents.get(url)
        if kept is not None and time.monotonic() - kept[0] < DOCUMENT_MAX_AGE_SECONDS:
            return kept[1]
        row = await oauth_db.find_client(self._pool, url)
        if row is not None and row.fetched_at is not None and not row.registered:
            age = time.time() - row.fetched_at.timestamp()
            if age < DOCUMENT_MAX_AGE_SECONDS:
                return self._keep(url, Client.of(row), age)
        refusal = _document_url_refusal(url)
        if refusal is not None:
            raise ClientRefused(refusal)
        document = await self._fetch(url)
        name, uris = _validated_document(url, document)
        saved = await oauth_db.save_document(self._pool, url, name, uris, document)
        if saved is None:
            raise ClientRefused("this client_id is taken by a registered client")
        return self._keep(url, Client.of(saved), 0.0)

    def _keep(self, url: str, client: Client, age: float) -> Client:
        self._documents[url] = (time.monotonic() - age, client)
        self._documents.move_to_end(url)
        while len(self._documents) > _DOCUMENTS_KEPT:
            self._documents.popitem(last=False)
        return client

    async def _fetch(self, url: str) -> dict[str, Any]:
        where = f"the client's metadata document at {url}"
        try:
            async with asyncio.timeout(DOCUMENT_SECONDS):
                async with self._http.get(
                    url,
                    ssl=self._ssl,
                    allow_redirects=False,
                    headers={"Accept": "application/json", "Accept-Encoding": "identity"},
                ) as response:
                    if response.status != 200:
                        raise ClientRefused(f"{where} answered HTTP {response.status}, not 200")
                    body = bytearray()
                    async for chunk in response.content.iter_chunked(16 * 1024):
                        body += chunk
                        if len(body) > DOCUMENT_MAX_BYTES:
                            raise ClientRefused(
                                f"{where} is larger than {DOCUMENT_MAX_BYTES // 1024} KiB"
                            )
        except TimeoutError:
            raise ClientRefused(
                f"{where} did not arrive within {DOCUMENT_SECONDS:g} seconds"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            log.info("client metadata document %s not fetched: %s", url, exc)
            raise ClientRefused(f"{where} could not be fetched: {_reason(exc)}") from None
        try:
            document = orjson.loads(bytes(body))
        except orjson.JSONDecodeError:
            raise ClientRefused(f"{where} is not JSON") from None
        if not isinstance(document, dict):
            raise ClientRefused(f"{where} is not a JSON object")
        return document


def _reason(exc: BaseException) -> str:
    # The outbound policy's refusal is an OSError inside aiohttp's connection error.
    cause = getattr(exc, "os_error", None) or exc
    return str(cause) or type(cause).__name__


def _validated_document(url: str, document: dict[str, Any]) -> tuple[str, list[str]]:
    """The name and redirect URIs of a metadata document, or ClientRefused saying why."""
    where = "the client's metadata document"
    if document.get("client_id") != url:
        raise ClientRefused(f"{where} names another client_id than its own URL")
    try:
        uris = check_redirect_uris(document.get("redirect_uris"))
    except BadRedirectUri as exc:
        raise ClientRefused(f"{where} has a bad redirect URI: {exc}") from None
    method = document.get("token_endpoint_auth_method", "none")
    if method != "none":
        raise ClientRefused(
            f"{where} asks for token_endpoint_auth_method {method!r}: this gateway serves "
            "public clients only ('none', with PKCE)"
        )
    name = document.get("client_name")
    if name is None:
        name = urlsplit(url).hostname or url
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
        raise ClientRefused(f"{where} has a client_name that is not 1 to 200 characters")
    return name.strip(), uris


CLIENTS: web.AppKey[Clients] = web.AppKey("oauth_clients", Clients)
