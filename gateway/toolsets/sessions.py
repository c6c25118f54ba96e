"""A toolset session's state, carried inside its Mcp-Session-Id: sealed, so no store is needed.

A 2025-era client opens a session with `initialize` and sends the id back on every request. The
gateway keeps nothing: the id itself holds the session (the toolset, who opened it, the
negotiated version, the client's capabilities and the member servers' own sessions), encrypted
and authenticated with Fernet under keys derived from GATEWAY_SECRET_KEYS, so any process of any
replica can serve the next request and nobody can read or forge one. Derived keys, not the
credential keys themselves: a sealed credential is never accepted as a session, nor the
reverse. Rotating GATEWAY_SECRET_KEYS keeps sessions sealed under an older key open.

A session id is refused (404, the client then initialises again, as the MCP transport says)
when it cannot be opened, is older than SESSION_SECONDS, belongs to another toolset, or was
opened by another caller (another API key, or another member).
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

import orjson
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway.accounts.access import Principal

# A client that keeps a session longer initialises again (one round of upstream handshakes).
SESSION_SECONDS: Final = 24 * 3600
# A client's capabilities travel in the id (2026-era members are told them on every call); a
# larger object is not kept, so that the header stays well under HTTP's size limits.
MAX_CAPABILITIES_BYTES: Final = 2048
_CONTEXT: Final = b"mcp-gateway toolset session v1"


@dataclass(frozen=True, slots=True)
class MemberSession:
    """How this client session reaches one member server."""

    server_id: uuid.UUID
    # The version the member speaks: "2026-07-28" needs no session, older ones may have one.
    protocol_version: str
    # The member's own Mcp-Session-Id (None: it issued none, it is stateless).
    session_id: str | None


@dataclass(frozen=True, slots=True)
class Session:
    toolset_id: uuid.UUID
    # Who opened it (caller()): only they may use it.
    caller: str
    protocol_version: str
    client_capabilities: dict[str, Any]
    client_info: dict[str, Any]
    # Members reached at initialize, in the toolset's order; a member absent here failed then
    # (or was added later) and is reached for one request at a time.
    members: tuple[MemberSession, ...]

    def member(self, server_id: uuid.UUID) -> MemberSession | None:
        return next((m for m in self.members if m.server_id == server_id), None)


def caller(principal: Principal) -> str:
    """Who a session belongs to: the API key, or the member signed in."""
    if principal.api_key_id is not None:
        return f"key:{principal.api_key_id}"
    return f"user:{principal.user_id}:{principal.workspace_id}"


class Sealer:
    """Seals sessions into ids and opens them, under keys derived from the secret keys.

    Sessions opened are remembered (a bounded number, until they expire), so a client's
    every request does not pay for the decryption: only the first one in each process.
    """

    def __init__(self, secret_keys: tuple[str, ...], *, remembered: int = 10_000) -> None:
        self._fernet = MultiFernet([Fernet(_derive(key)) for key in secret_keys])
        # session id -> (session, when it expires by the monotonic clock)
        self._opened: dict[str, tuple[Session, float]] = {}
        self._remembered = remembered

    def seal(self, session: Session) -> str:
        state = {
            "t": str(session.toolset_id),
            "c": session.caller,
            "v": session.protocol_version,
            "cc": session.client_capabilities,
            "ci": session.client_info,
            "m": [[str(m.server_id), m.protocol_version, m.session_id] for m in session.members],
        }
        return self._fernet.encrypt(orjson.dumps(state)).decode("ascii")

    def open(self, session_id: str) -> Session | None:
        """The session, or None when the id is not one of ours or has expired."""
        known = self._opened.get(session_id)
        if known is not None and known[1] > time.monotonic():
            return known[0]
        session = self._open(session_id)
        if session is not None:
            if len(self._opened) >= self._remembered:
                del self._opened[next(iter(self._opened))]  # the oldest
            token = session_id.encode("ascii")
            issued = self._fernet.extract_timestamp(token)
            left = issued + SESSION_SECONDS - time.time()
            self._opened[session_id] = (session, time.monotonic() + left)
        return session

    def _open(self, session_id: str) -> Session | None:
        try:
            state = orjson.loads(
                self._fernet.decrypt(session_id.encode("ascii"), ttl=SESSION_SECONDS)
            )
            return Session(
                toolset_id=uuid.UUID(state["t"]),
                caller=state["c"],
                protocol_version=state["v"],
                client_capabilities=state["cc"],
                client_info=state["ci"],
                members=tuple(
                    MemberSession(uuid.UUID(server_id), version, member_session)
                    for server_id, version, member_session in state["m"]
                ),
            )
        except (InvalidToken, UnicodeEncodeError, ValueError, KeyError, TypeError):
            return None


def kept_capabilities(capabilities: Any) -> dict[str, Any]:
    """A client's capabilities as a session keeps them: an object of bounded size, else {}."""
    if not isinstance(capabilities, dict):
        return {}
    return capabilities if len(orjson.dumps(capabilities)) <= MAX_CAPABILITIES_BYTES else {}


def _derive(secret_key: str) -> bytes:
    raw = base64.urlsafe_b64decode(secret_key)
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_CONTEXT).derive(raw)
    return base64.urlsafe_b64encode(derived)
