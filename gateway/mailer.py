"""Sending invitation emails through SMTP_URL (aiosmtplib), off the request path."""

from __future__ import annotations

import asyncio
import logging
from email.message import EmailMessage
from urllib.parse import unquote, urlsplit

import aiosmtplib

log = logging.getLogger(__name__)

SENDER = "mcp-gateway <no-reply@mcp-gateway.local>"
_SEND_TIMEOUT = 20.0


class Mailer:
    """Sends in background tasks so a slow mail server never delays an API response.

    Without SMTP_URL nothing is sent and the invitation link is logged instead (the API
    response carries it too).
    """

    def __init__(self, smtp_url: str | None) -> None:
        self._smtp_url = smtp_url
        self._pending: set[asyncio.Task[None]] = set()

    def send_invite(self, to: str, workspace_name: str, inviter: str, url: str) -> None:
        if self._smtp_url is None:
            log.info("SMTP_URL not set; invitation for %s to %s: %s", to, workspace_name, url)
            return
        message = EmailMessage()
        message["From"] = SENDER
        message["To"] = to
        message["Subject"] = f"{inviter} invited you to {workspace_name} on mcp-gateway"
        message.set_content(
            f"{inviter} invited you to join the workspace {workspace_name!r} on mcp-gateway.\n\n"
            f"Accept the invitation: {url}\n\nThe link expires in 7 days.\n"
        )
        task = asyncio.create_task(self._send(message, to), name="send-invite")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, message: EmailMessage, to: str) -> None:
        assert self._smtp_url is not None
        parts = urlsplit(self._smtp_url)
        try:
            await aiosmtplib.send(
                message,
                hostname=parts.hostname or "localhost",
                port=parts.port or (465 if parts.scheme == "smtps" else 25),
                username=unquote(parts.username) if parts.username else None,
                password=unquote(parts.password) if parts.password else None,
                # smtps:// is implicit TLS; smtp:// upgrades with STARTTLS when offered.
                use_tls=parts.scheme == "smtps",
                timeout=_SEND_TIMEOUT,
            )
            log.info("invitation email sent to %s", to)
        except (aiosmtplib.SMTPException, OSError) as exc:
            log.error("could not send invitation email to %s: %s", to, exc)

    async def close(self) -> None:
        """Let emails already accepted finish sending before shutdown."""
        if self._pending:
            await asyncio.wait(self._pending, timeout=_SEND_TIMEOUT)
