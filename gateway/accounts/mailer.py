"""Sending the gateway's emails through SMTP_URL (aiosmtplib), off the request path:
invitations, and the links that verify an address.

What a tenant chose (a workspace's or a person's name) goes into a body only, cleaned of
control characters: never into a header, where a line break would start a header of its own
and a stranger's text would be the first thing a recipient reads.
"""

from __future__ import annotations

import asyncio
import logging
import re
from email.message import EmailMessage
from urllib.parse import unquote, urlsplit

import aiosmtplib
from aiohttp import web

log = logging.getLogger(__name__)

SENDER = "mcp-gateway <no-reply@mcp-gateway.local>"
INVITE_SUBJECT = "You are invited to a workspace on mcp-gateway"
VERIFY_SUBJECT = "Confirm your email address for mcp-gateway"
_SEND_TIMEOUT = 20.0
# Emails being sent at once by this process; past it an email is dropped (and logged), so a
# mail server that stopped answering cannot pile up tasks without end. Invitations are bounded
# per workspace and verification links per address before they get here.
_MAX_PENDING = 500
# C0 and C1 controls and DEL; names sent to the API can no longer hold them, older ones may.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def plain(text: str) -> str:
    """A stored name as one line of plain text: controls become a space."""
    return _CONTROLS.sub(" ", text).strip()


class Mailer:
    """Sends in background tasks so a slow mail server never delays an API response.

    Without SMTP_URL nothing is sent: the invitation link is logged instead (the API response
    carries it too), and addresses cannot be verified.
    """

    def __init__(self, smtp_url: str | None) -> None:
        self._smtp_url = smtp_url
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def sends(self) -> bool:
        """Whether this gateway sends email at all (SMTP_URL is set)."""
        return self._smtp_url is not None

    def send_invite(self, to: str, workspace_name: str, inviter: str, url: str) -> None:
        if self._smtp_url is None:
            log.info("SMTP_URL not set; invitation for %s: %s", to, url)
            return
        message = self._message(to, INVITE_SUBJECT)
        message.set_content(
            f'{plain(inviter)} invited you to join the workspace "{plain(workspace_name)}" '
            f"on mcp-gateway.\n\n"
            f"Accept the invitation: {url}\n\n"
            "The link expires in 7 days. If you did not expect this invitation, ignore this "
            "email: nothing happens unless the link is opened.\n"
        )
        self._start(message, to, "invitation")

    def send_verification(self, to: str, url: str, hours: int) -> None:
        """The link that proves `to` is the account holder's (nothing here of anyone's choice
        but the address itself)."""
        if self._smtp_url is None:  # the API refuses before asking; never logged
            return
        message = self._message(to, VERIFY_SUBJECT)
        message.set_content(
            "Someone, hopefully you, signed up for mcp-gateway with this email address, or "
            "asked for a new confirmation link.\n\n"
            f"Confirm that the address is yours (sign in first if asked): {url}\n\n"
            f"The link expires in {hours} hours. If it was not you, ignore this email: the "
            "address stays unconfirmed.\n"
        )
        self._start(message, to, "verification")

    @staticmethod
    def _message(to: str, subject: str) -> EmailMessage:
        message = EmailMessage()
        message["From"] = SENDER
        message["To"] = to  # an address the API validated
        message["Subject"] = subject
        return message

    def _start(self, message: EmailMessage, to: str, kind: str) -> None:
        if len(self._pending) >= _MAX_PENDING:
            log.error("too many emails being sent; %s email to %s dropped", kind, to)
            return
        task = asyncio.create_task(self._send(message, to, kind), name=f"send-{kind}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, message: EmailMessage, to: str, kind: str) -> None:
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
            log.info("%s email sent to %s", kind, to)
        except (aiosmtplib.SMTPException, OSError) as exc:
            log.error("could not send %s email to %s: %s", kind, to, exc)

    async def close(self) -> None:
        """Let emails already accepted finish sending (before shutdown; tests wait here)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=_SEND_TIMEOUT)


MAILER: web.AppKey[Mailer] = web.AppKey("mailer")
